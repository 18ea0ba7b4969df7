#include "broken.hpp"

#include "nmcmc/core/random.hpp"

#include <cmath>

namespace nmcmc::test_support {

ProposalResult AlteredRatio::propose(Target& target, const ChainState& state, at::Generator& gen) {
  ProposalResult r = inner_->propose(target, state, gen);
  r.log_q_ratio = how_ == How::kZero ? torch::zeros_like(r.log_q_ratio) : -r.log_q_ratio;
  return r;
}

ProposalResult HmcWithoutFinalHalfStep::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  torch::Tensor p0 = metric_.momentum(randn(state.x.sizes(), gen, state.x.options()));
  torch::Tensor x = state.x, p = p0 - 0.5 * eps_ * state.grad;
  EnergyGrad eg;
  for (int64_t l = 0; l < leapfrog_; ++l) {
    x = x + eps_ * metric_.velocity(p);
    eg = target.energy_and_grad(x);
    p = p - eps_ * eg.grad;  // the defect: a full kick at the end too
  }
  ProposalResult r;
  r.proposed = ChainState{x, eg.energy.to(torch::kFloat64), eg.grad};
  r.log_q_ratio = metric_.kinetic(p0) - metric_.kinetic(p);
  return r;
}

ProposalResult BrokenFlow::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  Proposed p = model_->propose(target, state.x, state.grad, gen, /*create_graph=*/false);
  switch (defect_) {
    case FlowDefect::kDropLogDet:
      p.log_q_fwd = p.log_q_fwd + p.log_det;
      p.log_q_rev = p.log_q_rev + p.log_det_rev;
      break;
    case FlowDefect::kDropReverse:
      p.log_q_rev = p.log_q_fwd;
      break;
    case FlowDefect::kDiagonalReverse: {
      auto* learned = dynamic_cast<LearnedSamplerImpl*>(model_.get());
      TORCH_CHECK(learned != nullptr && learned->preconditioned(), "kDiagonalReverse needs a preconditioned learned sampler");
      p.log_q_rev = learned->log_density_with(target, p.x_new, p.grad_new, state.x,
                                              torch::diag_embed(learned->precondition_matrix().diagonal()));
      break;
    }
  }
  return as_proposal_result(p);
}

ProposalResult PersistenceWithoutFlip::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  torch::Tensor z0 = randn(state.x.sizes(), gen, state.x.options());
  if (z_.defined()) z0 = rho_ * z_ + std::sqrt(1.0 - rho_ * rho_) * z0;
  Proposed p = sampler_->propose_given(target, state.x, state.grad, z0);
  pending_z0_ = z0;
  pending_rev_ = p.z0_rev;
  return as_proposal_result(p);
}

void PersistenceWithoutFlip::observe(const StepInfo& info) {
  z_ = torch::where(info.accepted.unsqueeze(1), -pending_rev_, pending_z0_);  // the defect: + pending_z0_
}

NutsRules nuts_without_progressive_bias() {
  NutsRules r = NutsRules::stan();
  r.top_level = [](double, double) { return 1.0; };
  return r;
}

NutsRules nuts_without_subtree_weights() {
  NutsRules r = NutsRules::stan();
  r.inside = [](double, double) { return 0.5; };
  return r;
}

NutsRules nuts_with_criterion_on_p() {
  NutsRules r = NutsRules::stan();
  r.sharp = false;
  return r;
}

NutsRules nuts_without_subtree_checks() {
  NutsRules r = NutsRules::stan();
  r.check_inside = false;
  return r;
}

NutsRules nuts_without_merged_check() {
  NutsRules r = NutsRules::stan();
  r.check_merged = false;
  return r;
}

}  // namespace nmcmc::test_support
