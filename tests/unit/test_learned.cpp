// The learned proposal: invertibility, log-determinant, MALA at initialisation, the exact
// detailed-balance identity, checkpoints and training behaviour.
// Over 500 lines: one test file per source area (flows/learned.*), each test short and independent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/training/trainer.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {

/// The shared perturbed sampler with this file's sizes (width 16, eps 0.3).
LearnedSampler random_sampler(int64_t dim, Variant variant, int64_t steps, uint64_t seed, double scale = 0.3) {
  return test_support::perturbed_sampler(
      LearnedOptions().set_dim(dim).set_variant(variant).set_hidden(16).set_steps(steps).set_eps(0.3), seed, scale);
}
}  // namespace

TEST(LearnedFlow, InverseUndoesForward) {
  auto t = make_target({{"name", "funnel"}, {"dim", 7}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(1);
  for (Variant v : {Variant::kFull, Variant::kNoGrad, Variant::kLangevin}) {
    auto s = random_sampler(7, v, 2, 10);
    torch::NoGradGuard no_grad;
    torch::Tensor x = t->sample(16, gen), z0 = torch::randn({16, 7}, gen, kF64);
    FlowPass f = s->forward_flow(*t, x, z0, false);
    EXPECT_GT((f.z - z0).abs().max().item<double>(), 1e-3) << variant_name(v);  // the network does something
    FlowPass b = s->inverse_flow(*t, x, f.z, false);
    EXPECT_LT((b.z - z0).abs().max().item<double>(), 1e-12) << variant_name(v);
    EXPECT_LT((b.log_det - f.log_det).abs().max().item<double>(), 1e-12) << variant_name(v);
  }
}

TEST(LearnedFlow, LogDetMatchesAutogradJacobian) {
  auto t = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(2);
  for (Variant v : {Variant::kFull, Variant::kNoGrad}) {
    auto s = random_sampler(5, v, 2, 20, 1.0);
    torch::Tensor x = t->sample(1, gen), z0 = torch::randn({1, 5}, gen, kF64);
    auto f = [&](const torch::Tensor& z) { return s->forward_flow(*t, x, z.unsqueeze(0), true).z.squeeze(0); };
    torch::Tensor jac = torch::zeros({5, 5}, kF64);
    torch::Tensor zin = z0.squeeze(0).clone().requires_grad_(true);
    torch::Tensor out = f(zin);
    for (int i = 0; i < 5; ++i) {
      jac[i] = torch::autograd::grad({out[i]}, {zin}, {}, /*retain_graph=*/true)[0];
    }
    const double logdet = std::log(std::abs(torch::linalg_det(jac).item<double>()));
    torch::NoGradGuard no_grad;
    const double flow_logdet = s->forward_flow(*t, x, z0, false).log_det.item<double>();
    EXPECT_GT(std::abs(flow_logdet), 1e-3) << variant_name(v);
    EXPECT_NEAR(flow_logdet, logdet, 1e-10) << variant_name(v);
  }
}

TEST(LearnedProposal, EqualsMalaAtInitialisation) {
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator g0 = make_generator(3);
  torch::Tensor x = t->sample(32, g0);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    LearnedSampler s(LearnedOptions().set_dim(6).set_variant(v).set_hidden(16).set_steps(3).set_eps(0.4));
    s->to(torch::kFloat64);
    auto learned = std::make_shared<LearnedProposal>(s);
    auto mala = std::make_shared<Mala>(0.4);
    MetropolisHastings kl(learned), km(mala);
    ChainState sl = kl.init(*t, x), sm = km.init(*t, x);
    at::Generator ga = make_generator(5), gb = make_generator(5);  // same z0 for both
    ProposalResult a = learned->propose(*t, sl, ga), b = mala->propose(*t, sm, gb);
    EXPECT_LT((a.proposed.x - b.proposed.x).abs().max().item<double>(), 1e-13) << variant_name(v);
    EXPECT_LT((a.log_q_ratio - b.log_q_ratio).abs().max().item<double>(), 1e-10) << variant_name(v);
  }
}

TEST(LearnedProposal, DetailedBalanceIdentity) {
  // The forward pass's log q(x'|x) and the proposal's log q(x|x') equal the densities evaluated
  // independently through the inverse pass; so log a(x -> x') = -log a(x' -> x) to 1e-10.
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(6);
  for (Variant v : {Variant::kFull, Variant::kNoGrad, Variant::kLangevin}) {
    auto s = random_sampler(6, v, 2, 30);
    torch::NoGradGuard no_grad;
    torch::Tensor x = t->sample(64, gen);
    auto eg = t->energy_and_grad(x);
    auto p = s->propose(*t, x, eg.grad, gen, false);
    torch::Tensor grad_new = p.grad_new.defined() ? p.grad_new : t->energy_and_grad(p.x_new).grad;
    torch::Tensor fwd = s->log_density(*t, x, eg.grad, p.x_new);
    torch::Tensor rev = s->log_density(*t, p.x_new, grad_new, x);
    EXPECT_LT((fwd - p.log_q_fwd).abs().max().item<double>(), 1e-10) << variant_name(v);
    EXPECT_LT((rev - p.log_q_rev).abs().max().item<double>(), 1e-10) << variant_name(v);
    torch::Tensor log_a = eg.energy - p.energy_new + p.log_q_rev - p.log_q_fwd;
    torch::Tensor log_a_back = p.energy_new - eg.energy + fwd - rev;
    EXPECT_LT((log_a + log_a_back).abs().max().item<double>(), 1e-10) << variant_name(v);
  }
}

TEST(LearnedProposal, CountsFourNGradientsPerStep) {
  auto t = make_target({{"name", "gaussian"}, {"dim", 4}}, kF64);
  for (auto [v, expected] : {std::pair{Variant::kFull, 12}, std::pair{Variant::kNoGrad, 0}, std::pair{Variant::kLangevin, 1}}) {
    auto s = random_sampler(4, v, 3, 40);
    MetropolisHastings k(std::make_shared<LearnedProposal>(s));
    at::Generator gen = make_generator(1);
    ChainState st = k.init(*t, torch::zeros({5, 4}, kF64));
    auto [next, info] = k.step(*t, st, gen);
    EXPECT_EQ(info.n_grad, expected) << variant_name(v);
    EXPECT_EQ(s->grads_per_step(), expected) << variant_name(v);
  }
}

namespace {
json tiny_config_target() { return {{"name", "icg"}, {"dim", 10}}; }

TrainOptions tiny_train(int64_t steps) {
  TrainOptions o;
  o.batch = 256;
  o.budget.steps = steps;
  o.accept_target = 0.7;
  o.checkpoint_every = 5;
  o.log_every = 1;
  o.seed = 3;
  return o;
}
}  // namespace

TEST(Training, CheckpointRoundTripAndExactResume) {
  auto t = make_target(tiny_config_target(), torch::kFloat32);
  auto options = LearnedOptions().set_dim(10).set_hidden(16).set_steps(1).set_eps(0.05);
  const std::string path = ::testing::TempDir() + "resume.pt";
  // Uninterrupted: 12 steps.
  LearnedSampler full_sampler(options), resumed_sampler(options);
  Trainer full(*t, full_sampler.ptr(), tiny_train(12));
  for (int i = 0; i < 12; ++i) full.step();
  // Interrupted after 5, saved, loaded into a fresh trainer, continued to 12.
  {
    Trainer first(*t, LearnedSampler(options).ptr(), tiny_train(12));
    for (int i = 0; i < 5; ++i) first.step();
    first.save(path, {});
  }
  Trainer resumed(*t, resumed_sampler.ptr(), tiny_train(12));
  resumed.load(path);
  EXPECT_EQ(resumed.current_step(), 5);
  for (int i = 0; i < 7; ++i) resumed.step();
  auto pa = full_sampler->parameters(), pb = resumed_sampler->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  EXPECT_EQ(full.beta(), resumed.beta());
  ASSERT_EQ(full.log().size(), resumed.log().size());
  EXPECT_EQ(full.log().back().accept, resumed.log().back().accept);

  // load_model reproduces proposals bit for bit.
  full.save(path, {});
  auto [loaded, meta] = load_model(path);
  EXPECT_EQ(meta["step"], 12);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::ones({4, 10});
  at::Generator ga = make_generator(9), gb = make_generator(9);
  auto a = full_sampler->propose(*t, x, {}, ga, false);
  auto b = loaded->propose(*t, x, {}, gb, false);
  EXPECT_TRUE(torch::equal(a.x_new, b.x_new));
  EXPECT_TRUE(torch::equal(a.log_q_rev, b.log_q_rev));
}

TEST(Training, BadCheckpointsFailCleanly) {
  auto t = make_target(tiny_config_target(), torch::kFloat32);
  auto options = LearnedOptions().set_dim(10).set_hidden(16).set_steps(1);
  const std::string path = ::testing::TempDir() + "good.pt";
  Trainer tr(*t, LearnedSampler(options).ptr(), tiny_train(2));
  tr.step();
  tr.save(path, {});
  // Truncated copy.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string truncated = ::testing::TempDir() + "truncated.pt";
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  EXPECT_THROW(load_model(truncated), DataError);
  const std::string garbage = ::testing::TempDir() + "garbage.pt";
  std::ofstream(garbage) << "not a checkpoint";
  EXPECT_THROW(load_model(garbage), DataError);
  EXPECT_THROW(load_model(::testing::TempDir() + "missing.pt"), DataError);
  // Another target or another model shape.
  auto other = make_target({{"name", "icg"}, {"dim", 12}}, torch::kFloat32);
  Trainer wrong_target(*other, LearnedSampler(LearnedOptions().set_dim(12).set_hidden(16)).ptr(), tiny_train(2));
  EXPECT_THROW(wrong_target.load(path), DataError);
  Trainer wrong_model(*t, LearnedSampler(LearnedOptions().set_dim(10).set_hidden(32)).ptr(), tiny_train(2));
  EXPECT_THROW(wrong_model.load(path), DataError);
}

TEST(Training, EntropyRisesWhileAcceptHoldsTarget) {
  // 10-d ill-conditioned Gaussian, started with a tiny step (accept ~1): beta grows, the proposal
  // entropy rises, and the accept rate settles near the 0.7 target.
  auto t = make_target(tiny_config_target(), torch::kFloat32);
  TrainOptions o = tiny_train(400);
  o.batch = 512;
  o.beta = 0.01;
  o.beta_min = 1e-3;
  o.rho = 0.05;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  Trainer tr(*t, LearnedSampler(LearnedOptions().set_dim(10).set_hidden(32).set_steps(1).set_eps(0.01)).ptr(), o);
  std::vector<TrainStats> s;
  for (int i = 0; i < 400; ++i) s.push_back(tr.step());
  auto mean = [&](int from, int to, double TrainStats::*f) {
    double m = 0;
    for (int i = from; i < to; ++i) m += s[i].*f;
    return m / (to - from);
  };
  const double entropy_start = mean(0, 10, &TrainStats::entropy), entropy_end = mean(350, 400, &TrainStats::entropy);
  const double accept_end = mean(350, 400, &TrainStats::accept);
  EXPECT_GT(entropy_end, entropy_start + 10.0) << entropy_start << " -> " << entropy_end;
  EXPECT_NEAR(accept_end, 0.7, 0.1);
}

TEST(LearnedProposal, StepSizeAdaptationIsRefusedNotIgnored) {
  // The learned proposal's step size is learned: run_sampler adapts nothing by default, and
  // refuses (rather than silently ignores) an explicit request to adapt it or a mass matrix.
  auto t = make_target(tiny_config_target(), torch::kFloat32);
  LearnedSampler sampler(LearnedOptions().set_dim(10).set_hidden(16).set_steps(1).set_eps(0.05));
  sampler->to(torch::kFloat32);
  sampler->eval();
  auto proposal = std::make_shared<LearnedProposal>(sampler);
  EXPECT_FALSE(proposal->has_tunable_step_size());
  EXPECT_FALSE(proposal->has_metric());
  EXPECT_THROW(proposal->set_step_size(0.1), c10::Error);
  EXPECT_THROW(proposal->set_inv_mass(torch::ones({10})), c10::Error);
  MetropolisHastings kernel(proposal);
  RunOptions run;
  run.set_chains(4).set_warmup(10).set_draws(5);
  SampleResult r = run_sampler(*t, kernel, run, 1);  // unset: burn-in only, step size untouched
  EXPECT_NEAR(r.step_size, 0.05, 1e-6);
  EXPECT_THROW(run_sampler(*t, kernel, RunOptions(run).set_adapt_step(true), 1), UsageError);
  EXPECT_THROW(run_sampler(*t, kernel, RunOptions(run).set_adapt_mass(true), 1), UsageError);
  // A baseline with a tunable step size adapts it by default.
  MetropolisHastings mala(make_baseline_proposal(ProposalOptions().set_sampler(SamplerKind::kMala).set_step_size(1e-4)));
  EXPECT_GT(run_sampler(*t, mala, run, 1).step_size, 1e-3);
}

// ---- the affine preconditioner: Note [Affine preconditioner] ----

#include "nmcmc/services/train.hpp"

namespace {
/// A correlated symmetric positive definite matrix [d, d] (fixed seed).
torch::Tensor test_covariance(int64_t d, uint64_t seed) {
  at::Generator g = make_generator(seed);
  torch::Tensor a = torch::randn({d, d}, g, kF64) * 0.5;
  return a.matmul(a.t()) + torch::diag(torch::linspace(0.2, 2.0, d, kF64));
}
/// The perturbed sampler with a preconditioner (m, L from test_covariance).
LearnedSampler preconditioned_sampler(int64_t d, Variant v, Precondition kind, uint64_t seed, double scale = 0.3) {
  auto s = test_support::perturbed_sampler(LearnedOptions()
                                               .set_dim(d)
                                               .set_variant(v)
                                               .set_hidden(16)
                                               .set_steps(2)
                                               .set_eps(0.3)
                                               .set_precondition(kind)
                                               .set_precondition_rank(2),
                                           seed, scale);
  s->set_preconditioner(torch::linspace(-0.5, 0.5, d, kF64), test_covariance(d, seed + 1));
  return s;
}
}  // namespace

TEST(Preconditioner, ZeroNetworksAreMalaWithTheSameMetric) {
  // L = I: plain MALA. L = chol(Sigma): MALA with inverse mass matrix Sigma (diag: its diagonal).
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator g0 = make_generator(3);
  torch::Tensor x = t->sample(32, g0);
  const torch::Tensor cov = test_covariance(6, 4);
  for (const Precondition kind : {Precondition::kDense, Precondition::kDiag, Precondition::kLowRank}) {
    for (bool identity : {true, false}) {
      for (Variant v : {Variant::kFull, Variant::kLangevin}) {
        LearnedSampler s(LearnedOptions().set_dim(6).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.4)
                             .set_precondition(kind).set_precondition_rank(2));
        s->to(torch::kFloat64);
        auto mala = std::make_shared<Mala>(0.4);
        if (identity) {
          s->set_preconditioner(torch::full({6}, 0.7, kF64), torch::eye(6, kF64));  // m does not matter
        } else {
          s->set_preconditioner(torch::zeros({6}, kF64), cov);
          // lowrank: L L^T is the factor-analysis fit with at most 2 factors, not cov itself.
          torch::Tensor l = s->precondition_matrix();
          mala->set_inv_mass(kind == Precondition::kDense  ? cov
                             : kind == Precondition::kDiag ? cov.diagonal().clone()
                                                           : l.matmul(l.t()));
        }
        auto learned = std::make_shared<LearnedProposal>(s);
        MetropolisHastings kl(learned), km(mala);
        ChainState sl = kl.init(*t, x), sm = km.init(*t, x);
        at::Generator ga = make_generator(5), gb = make_generator(5);  // same z0 for both
        ProposalResult a = learned->propose(*t, sl, ga), b = mala->propose(*t, sm, gb);
        if (kind == Precondition::kLowRank && !identity) {
          // MALA's noise is C z with C = chol(L L^T); the flow's is L z0. Give the flow the z0 with
          // L z0 = C z (also standard normal: C^-1 L is orthogonal), so both propose the same x'.
          torch::NoGradGuard no_grad;
          at::Generator gz = make_generator(5);
          torch::Tensor z = randn(x.sizes(), gz, x.options());
          torch::Tensor l = s->precondition_matrix();
          torch::Tensor c = torch::linalg_cholesky(l.matmul(l.t()));
          torch::Tensor z0 = torch::linalg_solve(l, c.matmul(z.t()), true).t();
          Proposed p = s->propose_from(*t, x, sl.grad, z0, false);
          a.proposed.x = p.x_new;
          a.log_q_ratio = p.log_q_rev - p.log_q_fwd;
        }
        const std::string what = enum_name(kind) + (identity ? " identity " : " sigma ") + variant_name(v);
        EXPECT_LT((a.proposed.x - b.proposed.x).abs().max().item<double>(), 1e-12) << what;
        EXPECT_LT((a.log_q_ratio - b.log_q_ratio).abs().max().item<double>(), 1e-9) << what;
        EXPECT_GT((a.proposed.x - x).abs().max().item<double>(), 1e-2) << what;  // it moves
      }
    }
  }
}

TEST(Preconditioner, LogDetIsTheWholeMapsJacobian) {
  // p.log_det + D log eps = log|det dx'/dz0|: the flow's and L's log-determinants together, the
  // entropy the objective maximises (so a learned L is trained on the exact entropy).
  auto t = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(2);
  for (const Precondition kind : {Precondition::kDense, Precondition::kDiag, Precondition::kLowRank}) {
    for (Variant v : {Variant::kFull, Variant::kNoGrad}) {
      auto s = preconditioned_sampler(5, v, kind, 20, 1.0);
      torch::Tensor x = t->sample(1, gen), z0 = torch::randn({1, 5}, gen, kF64);
      torch::Tensor zin = z0.clone().requires_grad_(true);
      torch::Tensor out = s->propose_from(*t, x, {}, zin, true).x_new.squeeze(0);
      torch::Tensor jac = torch::zeros({5, 5}, kF64);
      for (int i = 0; i < 5; ++i) jac[i] = torch::autograd::grad({out[i]}, {zin}, {}, true)[0].squeeze(0);
      const double logdet = std::log(std::abs(torch::linalg_det(jac).item<double>()));
      torch::NoGradGuard no_grad;
      Proposed p = s->propose_from(*t, x, {}, z0, false);
      const double total = p.log_det.item<double>() + 5 * s->log_eps().item<double>();
      EXPECT_NEAR(total, logdet, 1e-10) << kind << " " << variant_name(v);
      EXPECT_GT(std::abs(s->precondition_log_det().item<double>()), 0.1) << kind;  // L is not a rotation
    }
  }
}

TEST(Preconditioner, DetailedBalanceIdentityAndRoundTrip) {
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(6);
  for (const Precondition kind : {Precondition::kDense, Precondition::kDiag, Precondition::kLowRank}) {
    for (Variant v : {Variant::kFull, Variant::kNoGrad, Variant::kLangevin}) {
      auto s = preconditioned_sampler(6, v, kind, 30);
      torch::NoGradGuard no_grad;
      torch::Tensor x = t->sample(64, gen);
      EXPECT_LT((s->from_latent(s->to_latent(x)) - x).abs().max().item<double>(), 1e-12);
      auto eg = t->energy_and_grad(x);
      auto p = s->propose(*t, x, eg.grad, gen, false);
      torch::Tensor grad_new = p.grad_new.defined() ? p.grad_new : t->energy_and_grad(p.x_new).grad;
      if (p.grad_new.defined()) {  // the carried gradient is the target's, back in x coordinates
        EXPECT_LT((p.grad_new - t->energy_and_grad(p.x_new).grad).abs().max().item<double>(), 1e-9);
      }
      torch::Tensor fwd = s->log_density(*t, x, eg.grad, p.x_new);
      torch::Tensor rev = s->log_density(*t, p.x_new, grad_new, x);
      const std::string what = enum_name(kind) + " " + variant_name(v);
      // Relative to the size of the log density: these random networks can propose a point whose
      // reverse density is ~exp(-1e75), where two evaluations in double agree to ~1e-15 relative
      // (1e60 absolute; how the last bits fall depends on the CPU's BLAS kernels).
      auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
        return ((a - b).abs() / b.abs().clamp_min(1.0)).max().item<double>();
      };
      EXPECT_LT(rel(fwd, p.log_q_fwd), 1e-10) << what;
      EXPECT_LT(rel(rev, p.log_q_rev), 1e-10) << what;
      torch::Tensor log_a = eg.energy - p.energy_new + p.log_q_rev - p.log_q_fwd;
      torch::Tensor log_a_back = p.energy_new - eg.energy + fwd - rev;
      EXPECT_LT(rel(log_a, -log_a_back), 1e-10) << what;
    }
  }
}

TEST(Preconditioner, AutoIsDenseUpToAThousandDimensions) {
  EXPECT_EQ(resolve_precondition(Precondition::kAuto, 2), Precondition::kDense);
  EXPECT_EQ(resolve_precondition(Precondition::kAuto, kDenseMaxDim), Precondition::kDense);
  EXPECT_EQ(resolve_precondition(Precondition::kAuto, kDenseMaxDim + 1), Precondition::kLowRank);
  EXPECT_EQ(resolve_precondition(Precondition::kNone, 5), Precondition::kNone);
  EXPECT_THROW(LearnedSampler(LearnedOptions().set_dim(3).set_precondition(Precondition::kAuto)), c10::Error);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 3}, {"precondition", "full"}}), UsageError);
  EXPECT_EQ(LearnedOptions::from_json({{"dim", 3}, {"precondition", "lowrank"}}).precondition, Precondition::kLowRank);
}

// The low-rank L is a factor-analysis fit: L L^T = diag(psi) + W W^T. Where the covariance is
// exactly that (a few wide directions over unequal unique variances), the fit recovers it; the first
// design (total variances on the diagonal, the correlation's top factors, the rest at 1) did not,
// and left the narrow directions unscaled. From draws, factors under the noise edge are dropped.
namespace {
torch::Tensor factor_covariance(int64_t d, int64_t k, double loading, uint64_t seed) {
  at::Generator g = make_generator(seed);
  torch::Tensor psi = torch::rand({d}, g, kF64) * 1.5 + 0.5;
  torch::Tensor w = torch::randn({d, k}, g, kF64) * loading;
  return torch::diag(psi) + w.matmul(w.t());
}
torch::Tensor fitted(const LowRankFactors& f) {
  torch::Tensor root = f.variances.sqrt();
  torch::Tensor inner = torch::eye(f.variances.size(0), kF64) + (f.directions * (f.eigenvalues - 1.0)).matmul(f.directions.t());
  return inner * root.unsqueeze(0) * root.unsqueeze(1);
}
}  // namespace

TEST(Preconditioner, LowRankFactorsAndTheirCovariance) {
  const torch::Tensor cov = factor_covariance(8, 2, 3.0, 9);
  for (int64_t rank : {2, 4}) {
    LearnedSampler s(LearnedOptions().set_dim(8).set_hidden(8).set_precondition(Precondition::kLowRank).set_precondition_rank(rank));
    s->to(torch::kFloat64);
    s->set_preconditioner(torch::zeros({8}, kF64), cov);
    torch::Tensor l = s->precondition_matrix();
    EXPECT_LT((l.matmul(l.t()) - cov).abs().max().item<double>(), 1e-6) << rank;  // exact
    EXPECT_NEAR(s->precondition_log_det().item<double>(), std::log(std::abs(torch::linalg_det(l).item<double>())), 1e-10);
    LowRankFactors f = low_rank_factors_of_covariance(cov, rank);
    EXPECT_LT((fitted(f) - cov).abs().max().item<double>(), 1e-6) << rank;
    EXPECT_TRUE((f.eigenvalues > 1.0).all().item<bool>());
  }
  // The first design's L L^T, for the record: far from cov on this target.
  {
    torch::Tensor sd = cov.diagonal().sqrt();
    auto [w, v] = torch::linalg_eigh(cov / sd.unsqueeze(0) / sd.unsqueeze(1));
    torch::Tensor q = v.narrow(1, 6, 2);
    torch::Tensor old = (torch::eye(8, kF64) + (q * (w.narrow(0, 6, 2) - 1.0)).matmul(q.t())) * sd.unsqueeze(0) * sd.unsqueeze(1);
    EXPECT_GT((old - cov).abs().max().item<double>(), 0.1);
  }
  // Any covariance: a fit whose diagonal is close to the covariance's (exact at the fixed point).
  const torch::Tensor any = test_covariance(6, 9);
  LowRankFactors fa = low_rank_factors_of_covariance(any, 3);
  EXPECT_LT(((fitted(fa).diagonal() - any.diagonal()).abs() / any.diagonal()).max().item<double>(), 1e-2);
  // From draws of the factor model: the D x D route (n = 4000 >= D) finds the 2 factors of 5 asked
  // for (the rest are under the noise edge), the covariance to sampling error and the draws'
  // (regularised) variances on the diagonal to the eigenvalues' shrinkage; the Gram route
  // (n = 8 < D) gives a valid fit.
  at::Generator g = make_generator(4);
  const torch::Tensor big = factor_covariance(12, 2, 4.0, 5);
  const torch::Tensor chol = torch::linalg_cholesky(big);
  for (int64_t n : {4000, 8}) {
    torch::Tensor x = torch::randn({n, 12}, g, kF64).matmul(chol.t());
    LowRankFactors f = low_rank_factors(x, 5);
    const torch::Tensor q = f.directions;
    EXPECT_LT((q.t().matmul(q) - torch::eye(q.size(1), kF64)).abs().max().item<double>(), 1e-10) << n;
    EXPECT_TRUE((f.variances > 0).all().item<bool>() && (f.eigenvalues > 1).all().item<bool>()) << n;
    EXPECT_TRUE(torch::isfinite(fitted(f)).all().item<bool>()) << n;
    torch::Tensor c = x - x.mean(0);
    torch::Tensor var = (n * c.pow(2).sum(0) / (n - 1) + 5e-3) / (n + 5.0);
    EXPECT_TRUE((f.variances <= var * (1 + 1e-12)).all().item<bool>()) << n;
    if (n == 4000) {
      EXPECT_EQ(q.size(1), 2);
      EXPECT_LT(((fitted(f).diagonal() - var).abs() / var).max().item<double>(), 5e-3);
      EXPECT_LT(((fitted(f) - big).abs().max() / big.abs().max()).item<double>(), 0.1);
    }
  }
  // Autocorrelated draws (8 AR(1) chains, rho 0.9: about 20 draws per independent one) put noise
  // above the edge for independent draws; cross-fitting over the chains keeps the 2 real factors.
  {
    const int64_t chains = 8, steps = 200, d = 40;
    const torch::Tensor cf = torch::linalg_cholesky(factor_covariance(d, 2, 4.0, 6));
    const double rho = 0.9;
    torch::Tensor state = torch::randn({chains, d}, g, kF64).matmul(cf.t());
    std::vector<torch::Tensor> rows;
    for (int64_t t = 0; t < steps; ++t) {
      state = rho * state + std::sqrt(1 - rho * rho) * torch::randn({chains, d}, g, kF64).matmul(cf.t());
      rows.push_back(state);
    }
    torch::Tensor x = torch::cat(rows, 0);  // draw-major: row i is chain i % chains
    EXPECT_GT(low_rank_factors(x, 8).directions.size(1), 2);
    EXPECT_EQ(low_rank_factors(x, 8, chains).directions.size(1), 2);
    EXPECT_THROW(low_rank_factors(x, 8, 7), c10::Error);  // 1600 rows are not draws of 7 chains
  }
  // Bad factors are refused.
  LearnedSampler s(LearnedOptions().set_dim(6).set_hidden(8).set_precondition(Precondition::kLowRank).set_precondition_rank(5));
  s->to(torch::kFloat64);
  EXPECT_THROW(s->set_low_rank_preconditioner(torch::zeros({6}, kF64), torch::ones({6}, kF64),
                                              torch::ones({6, 2}, kF64), torch::ones({2}, kF64)),
               DataError);  // not orthonormal
  EXPECT_THROW(s->set_low_rank_preconditioner(torch::zeros({6}, kF64), torch::ones({6}, kF64),
                                              torch::eye(6, kF64).narrow(1, 0, 2), -torch::ones({2}, kF64)),
               DataError);
}

TEST(Preconditioner, BadInputIsRefused) {
  LearnedSampler s(LearnedOptions().set_dim(3).set_hidden(8).set_precondition(Precondition::kDense));
  s->to(torch::kFloat64);
  EXPECT_THROW(s->set_preconditioner(torch::zeros({3}, kF64), -torch::eye(3, kF64)), DataError);
  EXPECT_THROW(s->set_preconditioner(torch::zeros({3}, kF64), torch::eye(4, kF64)), DataError);
  EXPECT_THROW(s->set_preconditioner(torch::full({3}, NAN, kF64), torch::eye(3, kF64)), DataError);
  EXPECT_THROW(s->set_preconditioner(torch::zeros({3}, kF64), torch::tensor({1.0, 0.0, 2.0}, kF64)), DataError);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 3}, {"precondition", "full"}}), UsageError);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 3}, {"learn_precondition", true}}), UsageError);
  LearnedSampler none(LearnedOptions().set_dim(3).set_hidden(8));
  EXPECT_THROW(none->set_preconditioner(torch::zeros({3}), torch::eye(3)), c10::Error);
  EXPECT_TRUE(torch::equal(none->precondition_matrix(), torch::eye(3, none->log_eps().options())));
}

TEST(Preconditioner, LearnedLIsTrainedSavedAndLoaded) {
  // learn_precondition: L's entries are parameters that the entropy objective moves (their
  // gradient includes log|det L|); a checkpoint round trip keeps m and L exactly.
  auto t = make_target(tiny_config_target(), torch::kFloat32);
  auto options = LearnedOptions().set_dim(10).set_hidden(16).set_steps(1).set_eps(0.05).set_precondition(Precondition::kDense)
                     .set_learn_precondition(true);
  LearnedSampler sampler(options);
  Trainer tr(*t, sampler.ptr(), tiny_train(6));
  sampler->set_preconditioner(torch::full({10}, 0.1), torch::eye(10) * 0.5);
  const torch::Tensor l0 = sampler->precondition_matrix().detach().clone();
  for (int i = 0; i < 6; ++i) tr.step();
  const torch::Tensor l1 = sampler->precondition_matrix().detach();
  EXPECT_GT((l1 - l0).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(torch::equal(torch::triu(l1, 1), torch::zeros_like(l1)));  // stays lower triangular
  const std::string path = ::testing::TempDir() + "precondition.pt";
  tr.save(path, {});
  auto [loaded, meta] = load_model(path);
  EXPECT_TRUE(torch::equal(loaded->precondition_matrix(), l1));
  EXPECT_TRUE(torch::equal(loaded->precondition_shift(), sampler->precondition_shift()));
  // A fixed preconditioner is a buffer: not among the parameters the optimiser moves.
  LearnedSampler fixed(LearnedOptions().set_dim(10).set_hidden(16).set_precondition(Precondition::kDense));
  int found = 0;
  for (const auto& b : fixed->named_buffers()) found += b.key().find("precondition") != std::string::npos;
  EXPECT_EQ(found, 4);  // shift, base, log scale, lower
  for (const auto& p : fixed->named_parameters()) EXPECT_EQ(p.key().find("precondition"), std::string::npos) << p.key();
}

TEST(Preconditioner, LowRankWarmUpRefitsWithItsFirstFitAsTheMetric) {
  // A target with 4 wide directions (sd 30) over unit variance, in random orientation. The first
  // stage's diagonal metric mixes slowly along them, so their fitted variances are noisy; the
  // second stage samples with the first fit as the metric and refits. Measured: the spread of the
  // target's variances in the flow's coordinates (eigenvalues of L^T P L, P the exact precision,
  // from the gradients; 1 = a perfect preconditioner) must shrink by more than half.
  auto spread = [](bool refit) {
    TrainConfig c = parse_train_config({{"target", {{"name", "spiked"}, {"dim", 400}, {"spikes", 4}}},
                                        {"model", {{"hidden", 8}, {"precondition", "lowrank"}, {"precondition_rank", 8}}},
                                        {"train",
                                         {{"steps", 0},
                                          {"batch", 16},
                                          {"precondition_warmup", 200},
                                          {"precondition_draws", 200},
                                          {"precondition_chains", 8},
                                          {"precondition_refit", refit},
                                          {"seed", 3}}}});
    const std::string path = ::testing::TempDir() + (refit ? "refit.pt" : "norefit.pt");
    TrainResult r = train(c, torch::kCPU, path, path + ".csv", false);
    EXPECT_EQ(r.preconditioner.contains("refit"), refit);
    auto [s, meta] = load_model(path);
    auto target = make_target(c.target, kF64);
    const int64_t d = target->dim();
    torch::Tensor p = target->energy_and_grad(torch::eye(d, kF64), false).grad -
                      target->energy_and_grad(torch::zeros({1, d}, kF64), false).grad;
    torch::Tensor l = s->precondition_matrix().to(kF64);
    torch::Tensor ev = torch::linalg_eigvalsh(l.t().matmul(0.5 * (p + p.t())).matmul(l), "L");
    return (ev.max() / ev.min()).item<double>();
  };
  const double without = spread(false), with = spread(true);
  // Measured before the warm-up ran in float64 and restarted stuck chains (Note [Stuck chains in
  // warm-up]): 14.8 without, 5.8 with the refit; then 2.97 without, 4.48 with (seed 3 only). With
  // NUTS's chains on streams of their own (Note [Batched NUTS]), over seeds 1-6: 5.7-12.6
  // without, 4.2-4.8 with (400 dimensions, 8 chains x 200 draws per stage): the first stage alone
  // varies with the seed by 2x, the refit steadies it. Both must stay far from an unscaled
  // preconditioner (L = I: a spread of 900).
  EXPECT_LT(without, 20.0) << "without " << without << ", with " << with;
  EXPECT_LT(with, 6.0) << "without " << without << ", with " << with;
}

TEST(Preconditioner, TrainServiceWarmsUpSetsLAndRecordsTheCost) {
  // The train service's warm-up (NUTS over Stan's windows, with a dense metric by default or the
  // metric train.precondition_metric names) sets L close to the target's covariance (icg:
  // variances 1e-2 .. 1e2, so L = I would be off by up to 10x in scale), eps from its step size,
  // and records its gradient cost and metric in the checkpoint.
  for (const char* metric : {"", "fisher-lowrank", "fisher-diag"}) {
    SCOPED_TRACE(metric);
    nlohmann::json train_section = {{"steps", 2},
                                    {"batch", 32},
                                    {"precondition_warmup", 150},
                                    {"precondition_draws", 20},
                                    {"precondition_chains", 8},
                                    {"seed", 5}};
    if (*metric) train_section["precondition_metric"] = metric;
    TrainConfig c = parse_train_config({{"target", {{"name", "icg"}, {"dim", 10}}},
                                        {"model", {{"hidden", 16}, {"precondition", "dense"}}},
                                        {"train", train_section}});
    const std::string dir = ::testing::TempDir() + "pc_train" + metric;
    TrainResult r = train(c, torch::kCPU, dir + ".pt", dir + ".csv", false);
    ASSERT_TRUE(r.preconditioner.is_object());
    EXPECT_EQ(r.preconditioner["metric"], *metric ? metric : "dense");
    EXPECT_GT(r.preconditioner["grads"].get<int64_t>(), 8 * 170);
    auto [s, meta] = load_model(dir + ".pt");
    EXPECT_EQ(meta["preconditioner"], r.preconditioner);
    torch::Tensor sd = s->precondition_matrix().to(torch::kFloat64).pow(2).sum(1).sqrt();  // row norms: the sds
    torch::Tensor true_sd = torch::logspace(-2, 2, 10, 10.0, kF64).sqrt();
    torch::Tensor ratio = sd / true_sd;
    EXPECT_GT(ratio.min().item<double>(), 0.5) << ratio;
    EXPECT_LT(ratio.max().item<double>(), 2.0) << ratio;
    // eps starts at the warm-up step size (two Adam steps move it by about 2 lr).
    EXPECT_NEAR(std::log(s->eps().item<double>()), std::log(r.preconditioner["step_size"].get<double>()), 0.01);
  }
}

// Note [Training budget]: the defaults size the networks to the posterior (model.hidden 0); a
// config's width is kept; 0 never reaches a network, and a negative width is refused.
TEST(Training, DefaultsSizeTheNetworksToTheDimension) {
  EXPECT_EQ(default_train_config()["model"]["hidden"], 0);
  EXPECT_EQ(default_hidden(2), 64);
  EXPECT_EQ(default_hidden(26), 104);
  EXPECT_EQ(default_hidden(100), 256);
  EXPECT_EQ(default_hidden(5000), 256);
  EXPECT_THROW(LearnedOptions::from_json({{"hidden", -1}}), UsageError);
  EXPECT_NO_THROW(LearnedOptions::from_json({{"hidden", 0}}));
  EXPECT_THROW(LearnedSampler(LearnedOptions().set_dim(4).set_hidden(0)), c10::Error);
  json cfg = default_train_config();
  cfg["target"] = {{"name", "icg"}, {"dim", 20}};
  cfg["transport"] = {{"kind", "none"}};
  cfg["train"]["steps"] = 1;
  cfg["train"]["batch"] = 16;
  cfg["train"]["precondition_warmup"] = 60;
  cfg["train"]["precondition_draws"] = 10;
  cfg["train"]["precondition_chains"] = 4;
  const std::string dir = ::testing::TempDir();
  for (int64_t given : {0, 24}) {
    cfg["model"]["hidden"] = given;
    train(parse_train_config(cfg), torch::kCPU, dir + "hidden.pt", dir + "hidden.csv", false);
    auto [s, meta] = load_model(dir + "hidden.pt");
    EXPECT_EQ(s->options().hidden, given == 0 ? default_hidden(20) : given);
  }
}

// A model's networks can be switched to another precision after it is built (a model trained in
// float32, sampled in bfloat16): set_matmul gives exactly the model built with that option.
TEST(LearnedProposal, SetMatmulSwitchesTheNetworksPrecision) {
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, torch::kFloat32);
  at::Generator gen = make_generator(8);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto opts = LearnedOptions().set_dim(6).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.3);
    auto built = test_support::perturbed_sampler(LearnedOptions(opts).set_matmul(MatmulOption::kBFloat16), 30);
    auto switched = test_support::perturbed_sampler(LearnedOptions(opts).set_matmul(MatmulOption::kNative), 30);
    auto native = test_support::perturbed_sampler(LearnedOptions(opts).set_matmul(MatmulOption::kNative), 30);
    for (auto* s : {&built, &switched, &native}) (*s)->to(torch::kFloat32);
    switched->set_matmul(MatmulOption::kBFloat16);
    EXPECT_EQ(switched->options().matmul, MatmulOption::kBFloat16);
    EXPECT_EQ(switched->options_json()["matmul"], "bfloat16");
    EXPECT_EQ(switched->linear_policy().matmul, MatmulOption::kBFloat16);
    torch::NoGradGuard no_grad;
    torch::Tensor x = t->sample(32, gen);
    auto eg = t->energy_and_grad(x);
    torch::Tensor z0 = torch::randn({32, 6}, gen, torch::TensorOptions());
    auto pb = built->propose_from(*t, x, eg.grad, z0, false);
    auto ps = switched->propose_from(*t, x, eg.grad, z0, false);
    auto pn = native->propose_from(*t, x, eg.grad, z0, false);
    EXPECT_TRUE(torch::equal(ps.x_new, pb.x_new)) << variant_name(v);
    EXPECT_TRUE(torch::equal(ps.log_q_fwd, pb.log_q_fwd)) << variant_name(v);
    EXPECT_FALSE(torch::equal(ps.x_new, pn.x_new)) << variant_name(v);  // it did switch
    switched->set_matmul(MatmulOption::kNative);
    EXPECT_TRUE(torch::equal(switched->propose_from(*t, x, eg.grad, z0, false).x_new, pn.x_new)) << variant_name(v);
  }
}

TEST(LearnedProposal, Bfloat16NetworksKeepTheIdentityRowByRow) {
  // Note [Bfloat16 matmul]: with bfloat16 GEMMs the networks are another deterministic function,
  // so the identity above holds as tightly (float64 coupling arithmetic), and a row's densities do
  // not depend on the other rows' values: rows evaluated again in a batch of the same size, at the
  // same places, among other states, give the same bits. (A GEMM's result for a row may depend on
  // the batch size and the row's place, as OpenBLAS's float32 one does; each MH step's forward and
  // reverse passes share both.)
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(6);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto s = test_support::perturbed_sampler(
        LearnedOptions().set_dim(6).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.3).set_matmul(MatmulOption::kBFloat16), 30);
    auto native = test_support::perturbed_sampler(
        LearnedOptions().set_dim(6).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.3).set_matmul(MatmulOption::kNative), 30);
    torch::NoGradGuard no_grad;
    torch::Tensor x = t->sample(64, gen);
    auto eg = t->energy_and_grad(x);
    torch::Tensor z0 = torch::randn({64, 6}, gen, kF64);
    auto p = s->propose_from(*t, x, eg.grad, z0, false);
    auto pn = native->propose_from(*t, x, eg.grad, z0, false);
    // bfloat16 is really used: the proposals differ from the native ones, a little.
    const double diff = (p.x_new - pn.x_new).abs().max().item<double>();
    EXPECT_GT(diff, 1e-7) << variant_name(v);
    EXPECT_LT(diff, 5e-2) << variant_name(v);
    torch::Tensor grad_new = p.grad_new.defined() ? p.grad_new : t->energy_and_grad(p.x_new).grad;
    torch::Tensor fwd = s->log_density(*t, x, eg.grad, p.x_new);
    torch::Tensor rev = s->log_density(*t, p.x_new, grad_new, x);
    EXPECT_LT((fwd - p.log_q_fwd).abs().max().item<double>(), 1e-10) << variant_name(v);
    EXPECT_LT((rev - p.log_q_rev).abs().max().item<double>(), 1e-10) << variant_name(v);
    torch::Tensor keep = torch::zeros({64}, torch::kBool);
    keep.index_fill_(0, torch::tensor({40, 3, 17, 63, 0}, torch::kInt64), true);
    torch::Tensor other = t->sample(64, gen), other_to = t->sample(64, gen);
    torch::Tensor from = torch::where(keep.unsqueeze(1), p.x_new, other);
    torch::Tensor to = torch::where(keep.unsqueeze(1), x, other_to);
    torch::Tensor again = s->log_density(*t, from, t->energy_and_grad(from).grad, to);
    EXPECT_TRUE(torch::equal(again.index({keep}), rev.index({keep}))) << variant_name(v);
    EXPECT_FALSE(torch::equal(again, rev));  // the other rows did change
  }
}

// Note [Choosing the transport]: the Fisher divergence per dimension between the target and the
// Gaussian an affine map fits, 0 for a Gaussian target, large for a funnel (the affine map cannot
// whiten it) and for a Gaussian with a wrong map (the power: the statistic sees the misfit).
TEST(Preconditioner, FisherDivergenceOfTheAffineFitChoosesTheTransport) {
  at::Generator gen = make_generator(31);
  auto icg = make_target({{"name", "icg"}, {"dim", 10}}, kF64);
  const torch::Tensor x = icg->sample(4000, gen);
  const torch::Tensor c = x - x.mean(0);
  const torch::Tensor l = torch::linalg_cholesky(c.t().matmul(c) / 3999.0);
  const double fit = affine_fisher_per_dim(*icg, x, l);
  EXPECT_LT(fit, 0.05) << fit;  // sampling error only: about D / n
  const double wrong = affine_fisher_per_dim(*icg, x, torch::eye(10, kF64));
  EXPECT_GT(wrong, 5.0 * TransportRules().flow_fisher_per_dim) << wrong;  // variances 1e-2 .. 1e2 left unscaled: 29
  EXPECT_NEAR(gaussian_fisher_per_dim(*icg, x), fit, 1e-9);  // the draws' own covariance: the same map
  // from the gradients a run carries (sampling's transport auto): the same figure, no evaluation
  EXPECT_NEAR(gaussian_fisher_per_dim(x, icg->energy_and_grad(x).grad), fit, 1e-9);
  auto funnel = make_target({{"name", "funnel"}, {"dim", 10}, {"sigma", 3.0}}, kF64);
  const double f = gaussian_fisher_per_dim(*funnel, funnel->sample(4000, gen));
  EXPECT_GT(f, 5.0 * TransportRules().flow_fisher_per_dim) << f;
  const torch::Tensor fx = funnel->sample(4000, gen);
  EXPECT_NEAR(gaussian_fisher_per_dim(fx, funnel->energy_and_grad(fx).grad), gaussian_fisher_per_dim(*funnel, fx), 1e-9);
  // affine invariance: a Gaussian with variances 1e6 and 1e-6 along directions rotated by 30
  // degrees (kilpisjarvi's shape: correlation near -1, scales 1e-3 .. 1e3) is as far from curved
  // as a standard one
  const double cs = std::cos(M_PI / 6), sn = std::sin(M_PI / 6);
  GaussianTarget corr("gaussian", json::object(), torch::tensor({1e6, 1e-6}, kF64),
                      torch::tensor({{cs, -sn}, {sn, cs}}, kF64), torch::tensor({2000.0, -3.0}, kF64), kF64);
  EXPECT_LT(gaussian_fisher_per_dim(corr, corr.sample(4000, gen)), 0.05);
  // chains that did not move: no covariance, no figure (auto keeps the affine map)
  EXPECT_TRUE(std::isnan(gaussian_fisher_per_dim(*icg, x.narrow(0, 0, 1).expand({50, 10}).contiguous())));
}

// Note [The affine map's noise]: at D = 200 the map fitted to 1,024 draws of a Gaussian leaves a
// divergence above the threshold (the broken statistic: it took every ~100-d posterior for a curved
// one); the extrapolated one is near 0 there and still far above it on a funnel.
TEST(Preconditioner, TheAffineMapsNoiseIsNotTakenForACurvedPosterior) {
  at::Generator gen = make_generator(37);
  const double threshold = TransportRules().flow_fisher_per_dim;
  auto icg = make_target({{"name", "icg"}, {"dim", 200}}, kF64);
  const torch::Tensor x = icg->sample(TransportRules().fisher_rows, gen);
  const FisherBeyondNoise g = fisher_beyond_noise(x, icg->energy_and_grad(x).grad);
  EXPECT_NEAR(g.all_rows, gaussian_fisher_per_dim(*icg, x), 1e-9);
  EXPECT_GT(g.all_rows, threshold) << g.all_rows;  // about D / N = 0.2: noise only
  EXPECT_LT(std::abs(g.beyond_noise), 0.3 * threshold) << g.beyond_noise;
  auto funnel = make_target({{"name", "funnel"}, {"dim", 200}, {"sigma", 3.0}}, kF64);
  const torch::Tensor fx = funnel->sample(TransportRules().fisher_rows, gen);
  const FisherBeyondNoise f = fisher_beyond_noise(fx, funnel->energy_and_grad(fx).grad);
  EXPECT_GT(f.beyond_noise, 5.0 * threshold) << f.beyond_noise;
  // too few rows for the last half's own map (fewer than 2 (D + 1)): not measured
  const torch::Tensor few = x.narrow(0, 0, 300);
  const FisherBeyondNoise n = fisher_beyond_noise(few, icg->energy_and_grad(few).grad);
  EXPECT_TRUE(std::isfinite(n.all_rows));
  EXPECT_TRUE(std::isnan(n.beyond_noise));
}

// The train service with transport auto: on a Gaussian it keeps the affine map (the record says
// what it measured); on a funnel it fits the flow and trains in its latent space, and the affine
// warm-up that decided is counted in the checkpoint's gradients and seconds.
TEST(Preconditioner, TransportAutoKeepsTheAffineMapOnAGaussianAndFitsAFlowOnAFunnel) {
  const std::string dir = ::testing::TempDir();
  auto config = [](const json& target) {
    return parse_train_config({{"target", target},
                               {"model", {{"hidden", 16}, {"precondition", "auto"}}},
                               {"transport", {{"kind", "auto"}, {"layers", 2}, {"rounds", 1}}},
                               {"train",
                                {{"steps", 2},
                                 {"batch", 32},
                                 {"precondition_warmup", 150},
                                 {"precondition_draws", 40},
                                 {"precondition_chains", 8},
                                 {"seed", 5}}}});
  };
  TrainResult g = train(config({{"name", "icg"}, {"dim", 6}}), torch::kCPU, dir + "auto_icg.pt", dir + "auto_icg.csv", false);
  ASSERT_TRUE(g.preconditioner.contains("auto")) << g.preconditioner.dump();
  EXPECT_EQ(g.preconditioner["auto"]["chose"], "affine");
  EXPECT_LT(g.preconditioner["auto"]["fisher_per_dim"].get<double>(), TransportRules().flow_fisher_per_dim);
  EXPECT_FALSE(g.preconditioner.contains("transport"));
  EXPECT_FALSE(load_model(dir + "auto_icg.pt").second.contains("transport"));
  TrainResult f = train(config({{"name", "funnel"}, {"dim", 6}, {"sigma", 3.0}}), torch::kCPU, dir + "auto_funnel.pt",
                        dir + "auto_funnel.csv", false);
  ASSERT_TRUE(f.preconditioner.contains("auto")) << f.preconditioner.dump();
  EXPECT_EQ(f.preconditioner["auto"]["chose"], "flow");
  EXPECT_GT(f.preconditioner["auto"]["fisher_per_dim"].get<double>(), TransportRules().flow_fisher_per_dim);
  EXPECT_EQ(f.preconditioner["kind"], "flow");
  const json& au = f.preconditioner["auto"];
  EXPECT_GT(f.preconditioner["grads"].get<int64_t>(), au["affine_grads"].get<int64_t>());
  EXPECT_GT(f.preconditioner["seconds"].get<double>(), au["affine_seconds"].get<double>());
  EXPECT_EQ(load_model(dir + "auto_funnel.pt").second["transport"]["kind"], "flow");
  EXPECT_FALSE(f.preconditioner.contains("arrival"));  // the affine warm-up's end, where it is needed
}

// A warm-up's progress as training's "precondition" phase: the total is the warm-up's own plan
// where it reports one (a transported warm-up whose rounds start again, Note [Far out twice], runs
// more iterations than `warmup`), so no report passes its total.
TEST(Preconditioner, WarmupProgressFollowsTheWarmupsPlan) {
  std::vector<TrainProgress> seen;
  const ProgressFn f = precondition_progress([&](const TrainProgress& t) { seen.push_back(t); }, 500, 100);
  auto report = [&](const char* phase, int64_t iteration, int64_t total) {
    Progress p;
    p.phase = phase;
    p.iteration = iteration;
    p.total = total;
    f(p);
  };
  report("warmup", 10, 500);
  report("warmup", 620, 700);  // the rounds started again: 200 iterations more
  report("sampling", 100, 100);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].stats.step, 10);
  EXPECT_EQ(seen[0].total, 600);
  EXPECT_EQ(seen[1].stats.step, 620);
  EXPECT_EQ(seen[1].total, 800);
  EXPECT_EQ(seen[2].stats.step, 800);
  EXPECT_EQ(seen[2].total, 800);
  for (const TrainProgress& t : seen) EXPECT_EQ(t.phase, "precondition");
  EXPECT_FALSE(precondition_progress(nullptr, 500, 100));
}

namespace {
/// N(0, I) in 2-d whose density exists only on the lattice (Z / 4)^2 (NaN elsewhere), with exact
/// draws on the lattice: the training's starting states are finite and every proposal (a
/// continuous move) lands off it.
class LatticeOnly : public Target {
 public:
  explicit LatticeOnly(torch::TensorOptions o) : Target(o) {}
  std::string name() const override { return "lattice_only_test"; }
  int64_t dim() const override { return 2; }
  json spec() const override { return {{"name", "lattice_only_test"}}; }
  bool has_sampler() const override { return true; }
  torch::Tensor sample(int64_t n, at::Generator& gen) const override {
    return torch::round(4.0 * torch::randn({n, 2}, gen, options_)) / 4.0;
  }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    const torch::Tensor on = (torch::round(4.0 * x) == 4.0 * x).all(1);
    const torch::Tensor u = 0.5 * x.pow(2).sum(1);
    return torch::where(on, u, torch::full_like(u, NAN));
  }
};
}  // namespace

// Issue #35: a training whose every proposal met a non-finite energy learned nothing and must say
// so (a DataError: `nmcmc train` exits 65) instead of saving the untrained proposal as a result.
// Its power: the same training on the plain Gaussian (the lattice off) must succeed.
TEST(Training, EveryProposalRejectedMeansItLearnedNothing) {
  static bool registered = false;
  if (!registered) {
    register_target({"lattice_only_test", "N(0, I) on (Z/4)^2 only", {}},
                    [](const json&, torch::TensorOptions o) -> std::unique_ptr<Target> {
                      return std::make_unique<LatticeOnly>(o);
                    });
    registered = true;
  }
  auto config = [](const json& target) {
    return parse_train_config({{"target", target},
                               {"dtype", "float64"},
                               {"model", {{"hidden", 8}, {"precondition", "none"}, {"learn_precondition", false}}},
                               {"train", {{"steps", 4}, {"batch", 16}, {"seed", 2}, {"patience", 0}}}});
  };
  const std::string dir = ::testing::TempDir();
  try {
    train(config({{"name", "lattice_only_test"}}), torch::kCPU, dir + "lattice.pt", dir + "lattice.csv", false);
    ADD_FAILURE() << "a training whose every proposal was rejected returned normally";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("learned nothing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("all 64 proposals of its 4 steps"), std::string::npos) << e.what();
  }
  TrainResult ok = train(config({{"name", "gaussian"}, {"dim", 2}}), torch::kCPU, dir + "plain.pt", dir + "plain.csv", false);
  EXPECT_EQ(ok.steps, 4);
  EXPECT_EQ(ok.bad_rows, 0);
}

// Note [The transported warm-up starts at the posterior]: `train --transport flow`'s rounds start
// from the uniform box, and where the chains arrive there (the last fit below TransportRules().transient_loss per
// coordinate) nothing else runs: no "from_the_box" or "arrival" in the record. (Where they do not,
// on posteriordb's kilpisjarvi, the rounds run again from where a warm-up of the chains alone
// left them: python/tests/test_posteriordb.py and `ctest -L posteriordb`.)
TEST(Preconditioner, AForcedTransportStartsFromTheBox) {
  TrainConfig config = parse_train_config({{"target", {{"name", "icg"}, {"dim", 4}}},
                                           {"dtype", "float64"},
                                           {"model", {{"hidden", 8}}},
                                           {"transport", {{"kind", "flow"}, {"layers", 2}, {"rounds", 2}}},
                                           {"train",
                                            {{"steps", 3},
                                             {"batch", 16},
                                             {"precondition_warmup", 150},
                                             {"precondition_chains", 8},
                                             {"seed", 3}}}});
  const std::string dir = ::testing::TempDir();
  TrainResult r = train(config, torch::kCPU, dir + "from_box.pt", dir + "from_box.csv", false);
  const json& pre = r.preconditioner;
  EXPECT_LE(pre["transport"]["rounds"].back()["fit"]["loss_end"].get<double>(), TransportRules().transient_loss) << pre.dump();
  EXPECT_FALSE(pre.contains("from_the_box")) << pre.dump();
  EXPECT_FALSE(pre.contains("arrival")) << pre.dump();
}
