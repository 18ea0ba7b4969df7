// The learned proposal's native sampling pass (Note [The learned step's native pass]) against
// the LibTorch pass it replaces: every variant it covers, every preconditioner, every
// activation; the copy follows the parameters; propose() takes it exactly where it applies. And
// the reverse move's base draw both passes return, which makes a move an involution (Note
// [Persistent noise]), and the persistent proposal built on it.
#include <gtest/gtest.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;

namespace {

/// max |a - b| / (1 + |b|) over the entries (both undefined: 0).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() && !b.defined()) return 0.0;
  EXPECT_TRUE(a.defined() && b.defined());
  if (!a.defined() || !b.defined()) return INFINITY;
  torch::Tensor a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
  return ((a64 - b64).abs() / (1.0 + b64.abs())).max().item<double>();
}

/// The largest relative difference between two proposals' fields.
double proposal_diff(const Proposed& a, const Proposed& b) {
  double worst = 0;
  for (auto [x, y] : {std::pair{a.x_new, b.x_new}, {a.energy_new, b.energy_new}, {a.grad_new, b.grad_new},
                      {a.log_q_fwd, b.log_q_fwd}, {a.log_q_rev, b.log_q_rev}, {a.log_det, b.log_det},
                      {a.log_det_rev, b.log_det_rev}, {a.z0_rev, b.z0_rev}}) {
    worst = std::max(worst, rel_diff(x, y));
  }
  return worst;
}

/// Random networks (test_support::perturbed_sampler) and, when preconditioned, L from a random
/// covariance with its learned factors moved off their start.
LearnedSampler sampler_for(int64_t d, Variant v, Precondition kind, Activation act, bool learn, uint64_t seed) {
  LearnedOptions o = LearnedOptions().set_dim(d).set_variant(v).set_hidden(24).set_steps(2).set_eps(0.4);
  o.set_precondition(kind).set_precondition_rank(2).set_learn_precondition(learn).set_activation(act);
  auto s = test_support::perturbed_sampler(o, seed);
  if (kind != Precondition::kNone) {
    at::Generator g = make_generator(seed + 1);
    torch::Tensor a = torch::randn({d, d}, g, kF64);
    torch::NoGradGuard no_grad;
    s->set_preconditioner(torch::randn({d}, g, kF64), a.matmul(a.t()) / d + torch::eye(d, kF64));
    for (auto& item : s->named_parameters()) {  // a learned L away from its start
      if (item.key().rfind("precondition", 0) == 0) item.value().add_(0.1 * torch::randn(item.value().sizes(), g, kF64));
    }
  }
  return s;
}
}  // namespace

TEST(NativeStep, AgreesWithTheLibTorchPass) {
  auto t = make_target({{"name", "funnel"}, {"dim", 7}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(11);
  torch::Tensor x = t->sample(9, gen), z0 = torch::randn({9, 7}, gen, kF64);
  const torch::Tensor grad = t->energy_and_grad(x).grad;
  int checked = 0;
  for (Variant v : {Variant::kLangevin, Variant::kNoGrad}) {
    for (Precondition kind : {Precondition::kNone, Precondition::kDiag, Precondition::kDense, Precondition::kLowRank}) {
      for (bool learn : {false, true}) {
        if (kind == Precondition::kNone && learn) continue;
        for (Activation act : {Activation::kElu, Activation::kRelu, Activation::kTanh, Activation::kSoftplus, Activation::kSilu}) {
          auto s = sampler_for(7, v, kind, act, learn, 20 + checked);
          torch::NoGradGuard no_grad;
          const torch::Tensor g = v == Variant::kLangevin ? grad : torch::Tensor();
          Proposed lib = s->propose_from(*t, x, g, z0, false);
          Proposed nat = s->propose_native(*t, x, g, z0);
          const std::string what = variant_name(v) + " " + enum_name(kind) + (learn ? " learned " : " ") + enum_name(act);
          EXPECT_LT(proposal_diff(nat, lib), 1e-12) << what;
          EXPECT_GT((nat.x_new - x).abs().max().item<double>(), 1e-2) << what;  // it moves
          EXPECT_GT((lib.log_q_rev - lib.log_q_fwd).abs().max().item<double>(), 1e-3) << what;  // not symmetric
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 7 * 5);
  // The broken variant the 1e-12 comparison must see: a native copy one weight behind by 1e-6 (a
  // copy not refreshed after an optimiser's step).
  auto s = sampler_for(7, Variant::kLangevin, Precondition::kDense, Activation::kElu, true, 20);
  auto stale = sampler_for(7, Variant::kLangevin, Precondition::kDense, Activation::kElu, true, 20);
  torch::NoGradGuard no_grad;
  stale->named_parameters()["net_drift.w_in0"].add_(1e-6);
  EXPECT_GT(proposal_diff(stale->propose_native(*t, x, grad, z0), s->propose_from(*t, x, grad, z0, false)), 1e-10);
}

TEST(NativeStep, AFloat32ModelAgreesToItsPrecision) {
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.0}}, torch::TensorOptions().dtype(torch::kFloat32));
  for (Variant v : {Variant::kLangevin, Variant::kNoGrad}) {
    auto s = sampler_for(6, v, Precondition::kDense, Activation::kElu, true, 5);
    s->to(torch::kFloat32);
    at::Generator gen = make_generator(3);
    torch::Tensor x = t->sample(4, gen), z0 = torch::randn({4, 6}, gen, x.options());
    torch::NoGradGuard no_grad;
    const torch::Tensor g = v == Variant::kLangevin ? t->energy_and_grad(x).grad : torch::Tensor();
    Proposed lib = s->propose_from(*t, x, g, z0, false), nat = s->propose_native(*t, x, g, z0);
    EXPECT_EQ(nat.x_new.scalar_type(), torch::kFloat32);
    EXPECT_LT(proposal_diff(nat, lib), 1e-4) << variant_name(v);
  }
}

TEST(NativeStep, TheCopyFollowsTheParameters) {
  // Written after the first native step: an optimiser-like update of a network weight, the step
  // size, the preconditioner. Each must reach the next native step (a stale copy fails here).
  auto t = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.0}}, kF64);
  auto s = sampler_for(5, Variant::kLangevin, Precondition::kDense, Activation::kElu, true, 9);
  at::Generator gen = make_generator(4);
  torch::Tensor x = t->sample(3, gen), z0 = torch::randn({3, 5}, gen, kF64);
  torch::NoGradGuard no_grad;
  const torch::Tensor g = t->energy_and_grad(x).grad;
  const std::vector<std::pair<std::string, std::function<void()>>> changes = {
      {"a weight", [&] { s->named_parameters()["net_drift.w_in0"].add_(0.05); }},
      {"eps", [&] { s->set_eps(0.23); }},
      {"L", [&] { s->set_preconditioner(torch::zeros({5}, kF64), 2.0 * torch::eye(5, kF64)); }},
  };
  for (const auto& [what, change] : changes) {
    Proposed before = s->propose_native(*t, x, g, z0);
    change();
    Proposed after = s->propose_native(*t, x, g, z0);
    EXPECT_GT((after.x_new - before.x_new).abs().max().item<double>(), 1e-6) << what;
    EXPECT_LT(proposal_diff(after, s->propose_from(*t, x, g, z0, false)), 1e-12) << what;
  }
}

TEST(NativeStep, ProposeTakesItExactlyWhereItApplies) {
  auto t = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.0}}, kF64);
  auto s = sampler_for(5, Variant::kLangevin, Precondition::kDense, Activation::kElu, true, 3);
  const int64_t most = kNativeStepMaxFlops / s->flops_per_step();  // rows
  ASSERT_GT(most, 4);
  at::Generator g0 = make_generator(2);
  torch::Tensor x = t->sample(most + 1, g0);
  const torch::Tensor grad = t->energy_and_grad(x).grad;
  torch::Tensor small = x.narrow(0, 0, 4);
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(s->native_step_applies(small));
    EXPECT_TRUE(s->native_step_applies(x.narrow(0, 0, most)));
    EXPECT_FALSE(s->native_step_applies(x));  // more network flops than kNativeStepMaxFlops
    // propose() draws z0 from the generator and takes the native pass: bit for bit propose_native.
    at::Generator ga = make_generator(8), gb = make_generator(8);
    Proposed p = s->propose(*t, small, grad.narrow(0, 0, 4), ga, false);
    torch::Tensor z0 = randn(small.sizes(), gb, small.options());
    Proposed n = s->propose_native(*t, small, grad.narrow(0, 0, 4), z0);
    EXPECT_TRUE(torch::equal(p.x_new, n.x_new));
    EXPECT_TRUE(torch::equal(p.log_q_rev, n.log_q_rev));
    // Note [Native copies]: libtorch never takes it; native takes it past the flops rule too.
    s->set_engine(Engine::kLibTorch);
    EXPECT_FALSE(s->native_step_applies(small));
    s->set_engine(Engine::kNative);
    EXPECT_TRUE(s->native_step_applies(x));
    s->set_engine(Engine::kAuto);
    EXPECT_FALSE(s->native_step_applies(x));
    s->set_native_max_flops((most + 1) * s->flops_per_step());  // a threshold set for this machine
    EXPECT_TRUE(s->native_step_applies(x));
    s->set_native_max_flops(kNativeStepMaxFlops);
    s->set_matmul(MatmulOption::kBFloat16);  // asked for bfloat16 GEMMs: LibTorch's
    EXPECT_FALSE(s->native_step_applies(small));
    s->set_matmul(MatmulOption::kNative);  // the model's dtype: float64, as the pass
    EXPECT_TRUE(s->native_step_applies(small));
    s->to(torch::kFloat32);  // float32 GEMMs asked for: LibTorch's
    EXPECT_FALSE(s->native_step_applies(small.to(torch::kFloat32)));
    s->to(torch::kFloat64);
    s->set_matmul(MatmulOption::kAuto);
    auto full = sampler_for(5, Variant::kFull, Precondition::kNone, Activation::kElu, false, 3);
    EXPECT_FALSE(full->native_step_applies(small));  // its couplings call the target
  }
  EXPECT_FALSE(s->native_step_applies(small));  // autograd on: training builds graphs
}

TEST(PersistentNoise, TheReverseDrawMakesTheMoveAnInvolution) {
  // (x, z0) -> (x', z0') and back: from x' with z0' the proposal lands on x again, with z0 as its
  // reverse draw and the two densities swapped. Every variant, with and without a preconditioner,
  // by the LibTorch pass and (where it applies) the native one.
  auto t = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(12);
  torch::Tensor x = t->sample(8, gen), z0 = torch::randn({8, 6}, gen, kF64);
  torch::NoGradGuard no_grad;
  int checked = 0;
  for (Variant v : {Variant::kFull, Variant::kLangevin, Variant::kNoGrad}) {
    for (Precondition kind : {Precondition::kNone, Precondition::kDense, Precondition::kLowRank}) {
      auto s = sampler_for(6, v, kind, Activation::kElu, kind != Precondition::kNone, 40 + checked++);
      const bool grads = v == Variant::kLangevin;
      const torch::Tensor g = grads ? t->energy_and_grad(x).grad : torch::Tensor();
      Proposed there = s->propose_given(*t, x, g, z0);
      ASSERT_TRUE(there.z0_rev.defined());
      Proposed back = s->propose_given(*t, there.x_new, grads ? there.grad_new : torch::Tensor(), there.z0_rev);
      const std::string what = variant_name(v) + " " + enum_name(kind);
      EXPECT_GT((there.x_new - x).abs().max().item<double>(), 1e-2) << what;
      EXPECT_LT(rel_diff(back.x_new, x), 1e-9) << what;
      EXPECT_LT(rel_diff(back.z0_rev, z0), 1e-9) << what;
      EXPECT_LT(rel_diff(back.log_q_fwd, there.log_q_rev), 1e-9) << what;
      EXPECT_LT(rel_diff(back.log_q_rev, there.log_q_fwd), 1e-9) << what;
    }
  }
}

TEST(PersistentNoise, TheCarriedDrawIsNegatedAndRefreshed) {
  // Note [Persistent noise]: with rho the next base draw is rho (-z0') + sqrt(1 - rho^2) xi where
  // the move was accepted, rho (-z0) + ... where it was rejected; rho = 0 is the paper's sampler.
  auto t = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.0}}, kF64);
  auto sampler = sampler_for(5, Variant::kLangevin, Precondition::kNone, Activation::kElu, false, 3);
  LearnedProposal proposal(sampler);
  EXPECT_THROW(proposal.set_persistence(1.0), UsageError);
  EXPECT_THROW(proposal.set_persistence(-0.1), UsageError);
  const double rho = 0.8;
  proposal.set_persistence(rho);
  MetropolisHastings kernel(std::make_shared<LearnedProposal>(proposal));
  auto& carried = dynamic_cast<LearnedProposal&>(kernel.proposal());
  at::Generator g0 = make_generator(5);
  ChainState state = kernel.init(*t, t->sample(64, g0));
  at::Generator gen = make_generator(6), twin = make_generator(6);
  auto [next, info] = kernel.step(*t, state, gen);  // the first step draws z0 afresh
  torch::NoGradGuard no_grad;
  torch::Tensor z0 = randn(state.x.sizes(), twin, state.x.options());
  Proposed first = sampler->propose_given(*t, state.x, state.grad, z0);
  EXPECT_TRUE(torch::equal(next.x, torch::where(info.accepted.unsqueeze(1), first.x_new, state.x)));
  const int64_t accepted = info.accepted.sum().item<int64_t>();
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 64);  // both branches are checked
  (void)rand({64}, twin, kF64);  // the MH decision's uniforms
  torch::Tensor carried_z = -torch::where(info.accepted.unsqueeze(1), first.z0_rev, z0);
  torch::Tensor z1 = rho * carried_z + std::sqrt(1.0 - rho * rho) * randn(state.x.sizes(), twin, state.x.options());
  Proposed second = sampler->propose_given(*t, next.x, next.grad, z1);
  ProposalResult r = carried.propose(*t, next, gen);
  EXPECT_LT(rel_diff(r.proposed.x, second.x_new), 1e-12);
}

