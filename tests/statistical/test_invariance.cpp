// Invariance of every baseline kernel on icg, scg and Funnel-3, and the power of the same
// tests against deliberately broken kernels. See Note [Invariance tests] in support/stats.hpp
// for the false-fail rate (1e-6 per case) and the smallest detectable error.
#include <gtest/gtest.h>

#include "nmcmc/flows/model.hpp"
#include "nmcmc/nn/onednn_gemm.hpp"
#include "nmcmc/images/conv_sampler.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/targets/targets.hpp"
#include "broken.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {
constexpr int64_t kChains = 20000;
constexpr int64_t kSteps = 10;
constexpr int kProjections = 20;

/// Runs the kernel from exact draws and whitens the result with the target's known law.
test_support::InvarianceReport invariance(const json& spec, std::shared_ptr<Proposal> proposal, uint64_t seed,
                                          torch::Dtype dtype = torch::kFloat64) {
  auto target = make_target(spec, test_support::device_options(dtype));
  MetropolisHastings kernel(std::move(proposal));
  test_support::ExactRun run = test_support::run_from_exact_with_moves(*target, kernel, kChains, kSteps, seed);
  auto target64 = make_target(spec, kF64);
  torch::Tensor z = test_support::whiten_known(spec, *target64, run.x.to(torch::kCPU, torch::kFloat64));
  test_support::InvarianceReport r = test_support::normal_tests(z, kProjections, seed + 1000);
  r.accept = run.accept;
  r.moved = run.moved;
  return r;
}

const json kIcg = {{"name", "icg"}};
const json kScg = {{"name", "scg"}};
const json kFunnel3 = {{"name", "funnel"}, {"dim", 20}, {"sigma", 3.0}};
}  // namespace

TEST(Invariance, RandomWalk) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.05}, std::pair{kScg, 0.5}, std::pair{kFunnel3, 0.3}}) {
    auto r = invariance(spec, std::make_shared<RandomWalk>(eps), 101);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(Invariance, Mala) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.3}, std::pair{kFunnel3, 0.25}}) {
    auto r = invariance(spec, std::make_shared<Mala>(eps), 102);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(Invariance, Hmc) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<Hmc>(eps, 8), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

// float32, the default dtype: the energies and gradients in float32, the acceptance in float64
// (Numerical rules); the chain is exact for the float32 energy, which is the target to ~1e-7.
TEST(Invariance, Float32MalaHmcAndLearned) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kFunnel3, 0.25}}) {
    auto r = invariance(spec, std::make_shared<Mala>(eps), 111, torch::kFloat32);
    std::cout << "  float32 mala " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << "mala " << spec.dump() << ": " << r.describe();
  }
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<Hmc>(eps, 8), 112, torch::kFloat32);
    std::cout << "  float32 hmc " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << "hmc " << spec.dump() << ": " << r.describe();
  }
  auto s = test_support::perturbed_sampler(LearnedOptions().set_dim(20).set_hidden(32).set_steps(2).set_eps(0.2), 7);
  s->to(torch::kFloat32);
  auto r = invariance(kFunnel3, std::make_shared<LearnedProposal>(s), 113, torch::kFloat32);
  std::cout << "  float32 learned (full): " << r.describe() << "\n";
  EXPECT_TRUE(r.passes()) << "learned: " << r.describe();
}

TEST(Invariance, HmcWithMassMatrix) {
  auto hmc = std::make_shared<Hmc>(0.6, 5);
  hmc->set_inv_mass(torch::logspace(-2, 2, 50, 10.0, kF64));  // the icg variances
  auto r = invariance(kIcg, hmc, 104);
  EXPECT_TRUE(r.passes()) << r.describe();
}

TEST(Invariance, HmcAndMalaWithDenseMetric) {
  // The dense metric set to the scg covariance (correlation 0.98): both kernels see a round target.
  auto cov = dynamic_cast<GaussianTarget*>(make_target(kScg, kF64).get())->covariance();
  // eps 1.2: at 0.6 HMC accepted 99.6 % of proposals on the whitened target, too close to a
  // perfect integrator for the test to tell a wrong metric from a right one (the moves check).
  auto hmc = std::make_shared<Hmc>(1.2, 5);
  hmc->set_inv_mass(cov);
  auto mala = std::make_shared<Mala>(0.8);
  mala->set_inv_mass(cov);
  for (auto [name, prop] : {std::pair<const char*, std::shared_ptr<Proposal>>{"hmc", hmc}, {"mala", mala}}) {
    auto r = invariance(kScg, prop, 106);
    std::cout << "  dense " << name << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << name << ": " << r.describe();
  }
  // Power: MALA's dense q ratio dropped fails the same test.
  auto dense_mala = std::make_shared<Mala>(0.8);
  dense_mala->set_inv_mass(cov);
  auto broken = std::make_shared<test_support::AlteredRatio>(dense_mala, test_support::AlteredRatio::How::kZero);
  EXPECT_FALSE(invariance(kScg, broken, 106).distribution_passes());
}

TEST(Invariance, HmcAndMalaWithLowRankMetric) {
  // A low-rank-plus-diagonal metric on scg (variances 100 and 0.1 rotated by pi/4): the diagonal
  // 1.5x the marginal variances and one direction, the narrow eigenvector, made 100x narrower:
  // not the covariance (the kernels see a target still elongated about 3:1), and both kernels must
  // be exact with it.
  auto cov = dynamic_cast<GaussianTarget*>(make_target(kScg, kF64).get())->covariance();
  ASSERT_EQ(cov.size(0), 2);
  auto [values, vectors] = torch::linalg_eigh(cov, "L");  // ascending: column 0 is the narrow one
  const Metric metric = Metric::low_rank(1.5 * cov.diagonal(), vectors.narrow(1, 0, 1).contiguous(), torch::tensor({0.01}, kF64));
  auto hmc = std::make_shared<Hmc>(0.3, 5);
  hmc->set_metric(metric);
  auto mala = std::make_shared<Mala>(0.25);
  mala->set_metric(metric);
  for (auto [name, prop] : {std::pair<const char*, std::shared_ptr<Proposal>>{"hmc", hmc}, {"mala", mala}}) {
    auto r = invariance(kScg, prop, 107);
    std::cout << "  low-rank " << name << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << name << ": " << r.describe();
  }
  // Power: MALA's low-rank q ratio dropped fails the same test.
  auto low_rank_mala = std::make_shared<Mala>(0.25);
  low_rank_mala->set_metric(metric);
  auto broken = std::make_shared<test_support::AlteredRatio>(low_rank_mala, test_support::AlteredRatio::How::kZero);
  EXPECT_FALSE(invariance(kScg, broken, 107).distribution_passes());
}

// ---- power: the same tests must reject broken kernels ----

TEST(InvariancePower, FrozenKernelFails) {
  // A kernel that rejects (almost) every proposal leaves exact draws exact: the law alone passes,
  // and only the accept rate and the fraction of chains that moved catch it.
  auto r = invariance(kIcg, std::make_shared<RandomWalk>(1e4), 107);
  std::cout << "  frozen: " << r.describe() << "\n";
  EXPECT_TRUE(r.distribution_passes()) << r.describe();
  EXPECT_FALSE(r.moves()) << r.describe();
  EXPECT_FALSE(r.passes()) << r.describe();
}

TEST(InvariancePower, MalaWithoutQRatioFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kFunnel3, 0.25}}) {
    auto r = invariance(spec, std::make_shared<test_support::AlteredRatio>(std::make_shared<Mala>(eps), test_support::AlteredRatio::How::kZero), 102);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(InvariancePower, HmcWithWrongKineticSignFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<test_support::AlteredRatio>(std::make_shared<Hmc>(eps, 8), test_support::AlteredRatio::How::kNegate), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(InvariancePower, HmcWithIrreversibleIntegratorFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<test_support::HmcWithoutFinalHalfStep>(eps, 8), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << spec.dump() << ": " << r.describe();
  }
}

// ---- the learned sampler: random non-zero networks, all variants; broken variants fail ----

#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/training/trainer.hpp"

namespace {
LearnedSampler perturbed_sampler(int64_t dim, Variant variant, double eps, uint64_t seed) {
  return test_support::perturbed_sampler(
      LearnedOptions().set_dim(dim).set_variant(variant).set_hidden(32).set_steps(2).set_eps(eps), seed);
}
const json kGauss6 = {{"name", "gaussian"}, {"scales", {0.3, 0.5, 1.0, 1.0, 2.0, 3.0}}};
}  // namespace

TEST(Invariance, LearnedVariantsWithRandomNetworks) {
  for (Variant v : {Variant::kFull, Variant::kNoGrad, Variant::kLangevin}) {
    for (auto [spec, eps] : {std::pair{kGauss6, 0.4}, std::pair{kFunnel3, 0.2}}) {
      auto s = perturbed_sampler(spec["name"] == "funnel" ? 20 : 6, v, eps, 7);
      auto r = invariance(spec, std::make_shared<LearnedProposal>(s), 105);
      std::cout << "  " << variant_name(v) << " " << spec.dump() << ": " << r.describe() << "\n";
      EXPECT_TRUE(r.passes()) << variant_name(v) << " " << spec.dump() << ": " << r.describe();
    }
  }
}

TEST(Invariance, LearnedWithBfloat16Networks) {
  // Note [Bfloat16 matmul]: networks multiplied in bfloat16 are another deterministic function;
  // the proposal stays exact.
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto s = test_support::perturbed_sampler(
        LearnedOptions().set_dim(20).set_variant(v).set_hidden(32).set_steps(2).set_eps(0.2).set_matmul(MatmulOption::kBFloat16), 7);
    auto r = invariance(kFunnel3, std::make_shared<LearnedProposal>(s), 107);
    std::cout << "  bfloat16 " << variant_name(v) << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << variant_name(v) << ": " << r.describe();
  }
}

TEST(Invariance, LearnedFloat32WithOneDnnGemms) {
  // Note [oneDNN GEMM]: a float32 model whose layers multiply through oneDNN (reordered weights)
  // is exact too; the count shows the path was taken.
  if (!onednn_gemm_available()) GTEST_SKIP() << "this build has no oneDNN";
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto s = test_support::perturbed_sampler(LearnedOptions()
                                                 .set_dim(20)
                                                 .set_variant(v)
                                                 .set_hidden(32)
                                                 .set_steps(2)
                                                 .set_eps(0.2)
                                                 .set_matmul(MatmulOption::kNative)
                                                 .set_gemm(GemmBackend::kOneDnn),
                                             7);
    s->to(torch::kFloat32);
    const uint64_t calls = test_hooks::onednn_gemm_calls();
    auto r = invariance(kFunnel3, std::make_shared<LearnedProposal>(s), 108, torch::kFloat32);
    std::cout << "  float32 oneDNN " << variant_name(v) << ": " << r.describe() << "\n";
    EXPECT_GT(test_hooks::onednn_gemm_calls(), calls) << variant_name(v);
    EXPECT_TRUE(r.passes()) << variant_name(v) << ": " << r.describe();
  }
}

TEST(Invariance, LearnedAfterShortTraining) {
  auto target = make_target(kGauss6, kF64);
  TrainOptions o;
  o.batch = 512;
  o.budget.steps = 150;
  o.accept_target = 0.6;
  o.lr = 3e-3;
  o.seed = 4;
  LearnedSampler sampler(LearnedOptions().set_dim(6).set_hidden(32).set_steps(2).set_eps(0.3));
  Trainer tr(*target, sampler.ptr(), o);
  for (int i = 0; i < 150; ++i) tr.step();
  sampler->eval();
  // The trained step size accepts 99.97 % here: the chains barely feel the MH correction, and the
  // moves check refuses such a weak case. Twice the step, with the trained networks, is still an
  // exact kernel and puts the correction to work.
  sampler->set_eps(2.0 * sampler->eps().item<double>());
  auto r = invariance(kGauss6, std::make_shared<LearnedProposal>(sampler), 106);
  std::cout << "  trained: " << r.describe() << "\n";
  EXPECT_TRUE(r.passes()) << r.describe();
}

TEST(InvariancePower, LearnedWithoutLogDetOrReverseFails) {
  for (test_support::FlowDefect defect : {test_support::FlowDefect::kDropLogDet, test_support::FlowDefect::kDropReverse}) {
    for (Variant v : {Variant::kFull, Variant::kNoGrad, Variant::kLangevin}) {
      auto s = perturbed_sampler(6, v, 0.4, 7);
      auto r = invariance(kGauss6, std::make_shared<test_support::BrokenFlow>(s.ptr(), defect), 105);
      std::cout << "  defect " << static_cast<int>(defect) << " " << variant_name(v) << ": " << r.describe() << "\n";
      EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << variant_name(v) << ": " << r.describe();
    }
  }
}

// Note [Persistent noise]: the base draw carried from step to step (negated after the MH decision,
// refreshed by rho) keeps the target invariant for every variant; the 10 steps from exact draws
// carry it over 9 decisions. Without the negation after a rejection it does not.
TEST(Invariance, LearnedWithPersistentNoise) {
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    for (auto [spec, eps, rho] : {std::tuple{kGauss6, 0.4, 0.9}, std::tuple{kFunnel3, 0.2, 0.6}}) {
      auto proposal = std::make_shared<LearnedProposal>(perturbed_sampler(spec["name"] == "funnel" ? 20 : 6, v, eps, 7));
      proposal->set_persistence(rho);
      auto r = invariance(spec, proposal, 109);
      std::cout << "  persistence " << rho << " " << variant_name(v) << " " << spec.dump() << ": " << r.describe() << "\n";
      EXPECT_TRUE(r.passes()) << variant_name(v) << " " << spec.dump() << ": " << r.describe();
    }
  }
}

TEST(InvariancePower, PersistentNoiseWithoutTheFlipOnRejectionFails) {
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto broken = std::make_shared<test_support::PersistenceWithoutFlip>(perturbed_sampler(6, v, 0.4, 7), 0.9);
    auto r = invariance(kGauss6, broken, 109);
    std::cout << "  without the flip " << variant_name(v) << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.moves()) << r.describe();
    EXPECT_FALSE(r.distribution_passes()) << variant_name(v) << ": " << r.describe();
  }
}

// ---- the convolutional image sampler (#5) on a 1x4x4 Gaussian "image" ----

namespace {
json gauss_image() {
  json scales = json::array();
  for (int i = 0; i < 16; ++i) scales.push_back(0.4 + 0.15 * (i % 5));
  return {{"name", "gaussian"}, {"scales", scales}};
}
ConvSampler conv_sampler(uint64_t seed) {
  ConvSamplerOptions o;
  o.channels = 1;
  o.height = 4;
  o.width = 4;
  o.filters = 4;
  o.layers = 2;
  o.steps = 1;
  o.eps = 0.3;
  return test_support::perturbed_conv_sampler(o, seed, 0.5);
}
}  // namespace

TEST(Invariance, ConvSamplerWithRandomNetworks) {
  auto s = conv_sampler(21);
  auto r = invariance(gauss_image(), std::make_shared<ModelProposal>(s.ptr(), "conv"), 121);
  std::cout << "  conv: " << r.describe() << "\n";
  EXPECT_TRUE(r.passes()) << r.describe();
}

TEST(InvariancePower, ConvSamplerWithoutLogDetOrReverseFails) {
  for (test_support::FlowDefect defect : {test_support::FlowDefect::kDropLogDet, test_support::FlowDefect::kDropReverse}) {
    auto s = conv_sampler(21);
    auto r = invariance(gauss_image(), std::make_shared<test_support::BrokenFlow>(s.ptr(), defect), 121);
    std::cout << "  conv defect " << static_cast<int>(defect) << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << r.describe();
  }
}

// ---- the affine preconditioner (Note [Affine preconditioner]) on a rotated 6-d Gaussian ----

namespace {
// Covariance eigenvalues 0.018, 0.21, 0.23, 0.35, 1.07, 1.19 (Gamma(0.5, 1), numpy seed 53), randomly rotated:
// two dominant directions (what a rank-2 factor holds) and an sd ratio of 8, so the off-diagonals matter
// while eps 0.5 still moves. Picked among such spectra for the power test's margin (p < 1e-19 below).
const json kRotated6 = {{"name", "rotated_icg"}, {"dim", 6}, {"seed", 53}, {"eigenvalues", "covariance"}};
/// Random networks and L from the target's covariance with every other variance doubled (close
/// but not exact, as a warm-up's estimate is).
LearnedSampler preconditioned(Precondition kind, Variant v, uint64_t seed) {
  auto target = make_target(kRotated6, kF64);
  torch::Tensor cov = dynamic_cast<GaussianTarget*>(target.get())->covariance();
  torch::Tensor f = torch::tensor({1.0, 1.41, 1.0, 1.41, 1.0, 1.41}, kF64);
  auto s = test_support::perturbed_sampler(
      LearnedOptions().set_dim(6).set_variant(v).set_hidden(32).set_steps(2).set_eps(0.5).set_precondition(kind)
          .set_precondition_rank(2), seed);
  s->set_preconditioner(torch::full({6}, 0.2, kF64), cov * f.unsqueeze(0) * f.unsqueeze(1));
  return s;
}
}  // namespace

TEST(Invariance, PreconditionedLearnedWithRandomNetworks) {
  for (const Precondition kind : {Precondition::kDense, Precondition::kDiag, Precondition::kLowRank}) {
    for (Variant v : {Variant::kFull, Variant::kLangevin}) {
      auto r = invariance(kRotated6, std::make_shared<LearnedProposal>(preconditioned(kind, v, 8)), 131);
      std::cout << "  " << kind << " " << variant_name(v) << ": " << r.describe() << "\n";
      EXPECT_TRUE(r.passes()) << kind << " " << variant_name(v) << ": " << r.describe();
    }
  }
}

TEST(InvariancePower, PreconditionedWithADiagonalReverseFails) {
  // The reverse density computed with diag(L) only (a forgotten off-diagonal) must fail.
  for (const Precondition kind : {Precondition::kDense, Precondition::kLowRank}) {
    for (Variant v : {Variant::kFull, Variant::kLangevin}) {
      auto s = preconditioned(kind, v, 8);
      auto r = invariance(kRotated6, std::make_shared<test_support::BrokenFlow>(s.ptr(), test_support::FlowDefect::kDiagonalReverse), 131);
      std::cout << "  diagonal reverse " << kind << " " << variant_name(v) << ": " << r.describe() << "\n";
      EXPECT_TRUE(r.moves()) << r.describe();
      EXPECT_FALSE(r.distribution_passes()) << kind << " " << variant_name(v) << ": " << r.describe();
    }
  }
}

namespace {
/// The learned proposal in batches of at most 50 chains, so that every step takes the native pass
/// (Note [The learned step's native pass]; the invariance runs 20,000 chains in one batch).
class InChunks : public Proposal {
 public:
  explicit InChunks(LearnedSampler s) : s_(std::move(s)) {}
  std::string name() const override { return "learned in chunks"; }
  bool uses_grad() const override { return s_->needs_grad(); }
  double step_size() const override { return s_->eps().item<double>(); }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override {
    torch::NoGradGuard no_grad;
    std::vector<ProposalResult> parts;
    const int64_t c = state.x.size(0);
    for (int64_t i = 0; i < c; i += 50) {
      const int64_t n = std::min<int64_t>(50, c - i);
      torch::Tensor x = state.x.narrow(0, i, n);
      EXPECT_TRUE(s_->native_step_applies(x));
      parts.push_back(as_proposal_result(
          s_->propose(target, x, state.grad.defined() ? state.grad.narrow(0, i, n) : torch::Tensor(), gen, false)));
    }
    auto cat = [&](auto field) {
      std::vector<torch::Tensor> v;
      for (auto& p : parts) v.push_back(field(p));
      return v.front().defined() ? torch::cat(v) : torch::Tensor();
    };
    ProposalResult r;
    r.proposed.x = cat([](ProposalResult& p) { return p.proposed.x; });
    r.proposed.energy = cat([](ProposalResult& p) { return p.proposed.energy; });
    r.proposed.grad = cat([](ProposalResult& p) { return p.proposed.grad; });
    r.log_q_ratio = cat([](ProposalResult& p) { return p.log_q_ratio; });
    return r;
  }

 private:
  LearnedSampler s_;
};
}  // namespace

TEST(Invariance, LearnedNativeStepWithRandomNetworks) {
  // The native pass agrees with LibTorch's to 1e-12 (tests/unit/test_learned_native.cpp); here the
  // kernel it makes keeps the target invariant, on the preconditioned cases and the funnel.
  for (const Precondition kind : {Precondition::kDense, Precondition::kLowRank}) {
    auto r = invariance(kRotated6, std::make_shared<InChunks>(preconditioned(kind, Variant::kLangevin, 8)), 141);
    std::cout << "  native " << kind << " langevin: " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << kind << ": " << r.describe();
  }
  for (Variant v : {Variant::kNoGrad, Variant::kLangevin}) {
    auto r = invariance(kFunnel3, std::make_shared<InChunks>(perturbed_sampler(20, v, 0.2, 7)), 142);
    std::cout << "  native funnel " << variant_name(v) << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << variant_name(v) << ": " << r.describe();
  }
}
