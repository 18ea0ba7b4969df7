// Kernels on a target pulled back through a flow transport leave the target invariant (after
// mapping back, x = T(z)), with and without global (independence) moves; a broken log-determinant
// and a global move without its proposal ratio fail the same tests. See Note [Invariance tests]
// in support/stats.hpp for the false-fail rate (1e-6 per case) and the smallest detectable error.
#include <gtest/gtest.h>

#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/kernels/proposal.hpp"
#include "nmcmc/services/transport.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {
constexpr int64_t kChains = 20000;
constexpr int64_t kSteps = 4;
constexpr int kProjections = 20;
const json kGauss4 = {{"name", "gaussian"}, {"scales", {0.5, 1.0, 2.0, 3.0}}};

/// A flow that is far from the identity but whose pulled-back Gaussian is not far from N(0, I):
/// the base matches the target's scales, the coupling layers are perturbed.
FlowTransport test_flow(double perturbation) {
  FlowTransport flow(FlowOptions().set_dim(4).set_layers(4).set_hidden(16).set_mask_seed(3));
  at::Generator gen = make_generator(4);
  flow->perturb(perturbation, gen);
  flow->set_base(torch::zeros({4}, kF64), torch::tensor({0.5, 1.0, 2.0, 3.0}, kF64).log());
  return flow;
}

/// log|det| counted with the wrong sign: the pulled-back density of U(T(z)) + log|det dT/dz|.
class BrokenLogDet : public TransportedTarget {
 public:
  BrokenLogDet(Target& inner, FlowTransport flow) : TransportedTarget(inner, flow), flow_(flow) {}

 protected:
  torch::Tensor compute_energy(const torch::Tensor& z) const override {
    return TransportedTarget::compute_energy(z) + 2.0 * log_det(z);
  }
  EnergyGrad compute_energy_and_grad(const torch::Tensor& z, bool create_graph) const override {
    EnergyGrad eg = TransportedTarget::compute_energy_and_grad(z, create_graph);
    torch::AutoGradMode enable(true);
    torch::Tensor zl = z.detach().clone().requires_grad_(true);
    torch::Tensor ld = flow_->forward(zl).log_det;
    torch::Tensor g = torch::autograd::grad({ld.sum()}, {zl})[0];
    return {eg.energy + 2.0 * ld.detach(), eg.grad + 2.0 * g};
  }

 private:
  FlowTransport flow_;
};

/// A global move that forgets the proposal's density ratio.
class GlobalWithoutQRatio : public TransportKernel {
 public:
  using TransportKernel::TransportKernel;

 protected:
  ProposalResult global_proposal(Target& target, const ChainState& state, at::Generator& gen) const override {
    ProposalResult r = TransportKernel::global_proposal(target, state, gen);
    r.log_q_ratio = torch::zeros_like(r.log_q_ratio);
    return r;
  }
};

test_support::InvarianceReport transported_invariance(TransportedTarget& latent, Target& inner, Kernel& kernel,
                                                      uint64_t seed, int64_t steps = kSteps) {
  at::Generator gen = make_generator(seed);
  torch::Tensor x0 = inner.sample(kChains, gen);
  torch::Tensor z0 = latent.to_latent(x0);
  ChainState state = kernel.init(latent, z0);
  double accept = 0;
  for (int64_t k = 0; k < steps; ++k) {
    auto [next, info] = kernel.step(latent, state, gen);
    accept += info.accept_prob.mean().item<double>() / double(steps);
    state = next;
  }
  torch::Tensor x = latent.to_ambient(state.x);
  torch::Tensor z = test_support::whiten_known(kGauss4, inner, x);
  test_support::InvarianceReport r = test_support::normal_tests(z, kProjections, seed + 1000);
  r.accept = accept;
  r.moved = (state.x != z0).any(1).to(torch::kFloat64).mean().item<double>();
  return r;
}
}  // namespace

TEST(Invariance, NutsOnAFlowTransportWithAndWithoutGlobalMoves) {
  auto target = make_target(kGauss4, kF64);
  TransportedTarget latent(*target, test_flow(0.1));
  {
    Nuts nuts(NutsOptions().set_step_size(0.4));
    auto r = transported_invariance(latent, *target, nuts, 301);
    std::cout << "  nuts on the flow: " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << r.describe();
  }
  {
    Nuts nuts(NutsOptions().set_step_size(0.4));
    TransportKernel kernel(nuts, /*global_moves=*/true);
    auto r = transported_invariance(latent, *target, kernel, 302);
    std::cout << "  nuts + global moves: " << r.describe() << ", global accept " << kernel.global_accept() << "\n";
    EXPECT_TRUE(r.passes()) << r.describe();
    EXPECT_GT(kernel.global_accept(), 0.1);  // the global moves are tested, not idle
  }
}

TEST(Invariance, LearnedProposalInAFlowsLatentSpace) {
  // Note [Learned proposal in a flow's latent space]: the learned proposals (random networks,
  // with and without the affine preconditioner on top of the flow) on the pulled-back target.
  auto target = make_target(kGauss4, kF64);
  TransportedTarget latent(*target, test_flow(0.1));
  for (Variant v : {Variant::kLangevin, Variant::kFull}) {
    for (Precondition pre : {Precondition::kNone, Precondition::kDiag}) {
      LearnedSampler s = test_support::perturbed_sampler(
          LearnedOptions().set_dim(4).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.5).set_precondition(pre), 11);
      if (pre == Precondition::kDiag) {
        s->set_preconditioner(torch::full({4}, 0.1, kF64), torch::tensor({0.8, 1.0, 1.2, 0.9}, kF64));
      }
      MetropolisHastings kernel(std::make_shared<LearnedProposal>(s));
      auto r = transported_invariance(latent, *target, kernel, 305 + static_cast<uint64_t>(v) * 2 +
                                                                      (pre == Precondition::kDiag ? 1 : 0));
      std::cout << "  learned " << variant_name(v) << " (" << enum_name(pre) << ") on the flow: " << r.describe() << "\n";
      EXPECT_TRUE(r.passes()) << variant_name(v) << ": " << r.describe();
    }
  }
}

TEST(InvariancePower, FlowTransportWithABrokenLogDetFails) {
  auto target = make_target(kGauss4, kF64);
  BrokenLogDet latent(*target, test_flow(0.1));
  Nuts nuts(NutsOptions().set_step_size(0.4));
  auto r = transported_invariance(latent, *target, nuts, 303);
  std::cout << "  broken log-det: " << r.describe() << "\n";
  EXPECT_TRUE(r.moves()) << r.describe();
  EXPECT_FALSE(r.distribution_passes()) << r.describe();
  // The same defect under the learned proposal in the latent space (shorter moves than NUTS's:
  // 12 steps for the same power).
  LearnedSampler s = test_support::perturbed_sampler(
      LearnedOptions().set_dim(4).set_variant(Variant::kLangevin).set_hidden(16).set_steps(2).set_eps(0.5), 11);
  MetropolisHastings learned(std::make_shared<LearnedProposal>(s));
  auto rl = transported_invariance(latent, *target, learned, 313, 12);
  std::cout << "  broken log-det, learned proposal: " << rl.describe() << "\n";
  EXPECT_TRUE(rl.moves()) << rl.describe();
  EXPECT_FALSE(rl.distribution_passes()) << rl.describe();
}

TEST(InvariancePower, GlobalMovesWithoutTheProposalRatioFail) {
  auto target = make_target(kGauss4, kF64);
  TransportedTarget latent(*target, test_flow(0.1));
  // The independence step targets p(z) N(z) without the ratio: |z|^2 shrinks.
  Nuts nuts(NutsOptions().set_step_size(0.4));
  GlobalWithoutQRatio kernel(nuts, true);
  auto r = transported_invariance(latent, *target, kernel, 304);
  std::cout << "  global moves without q ratio: " << r.describe() << ", global accept " << kernel.global_accept() << "\n";
  EXPECT_FALSE(r.distribution_passes()) << r.describe();
}
