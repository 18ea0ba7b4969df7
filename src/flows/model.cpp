#include "nmcmc/flows/model.hpp"

#include "nmcmc/core/random.hpp"

namespace nmcmc {

torch::Tensor flow_log_density(const torch::Tensor& z_base, const torch::Tensor& log_det, const torch::Tensor& d_log_eps) {
  return -0.5 * z_base.to(torch::kFloat64).pow(2).sum(1) - log_det - d_log_eps;
}

void set_flow_densities(Proposed& p, const torch::Tensor& z0, const FlowPass& fwd, const FlowPass& rev,
                        const torch::Tensor& d_log_eps) {
  p.log_det = fwd.log_det;
  p.log_det_rev = rev.log_det;
  p.log_q_fwd = flow_log_density(z0, fwd.log_det, d_log_eps);
  p.log_q_rev = flow_log_density(rev.z, rev.log_det, d_log_eps);
  p.z0_rev = rev.z;
}

ProposalResult ModelProposal::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  return as_proposal_result(model_->propose(target, state.x, state.grad, gen, /*create_graph=*/false));
}

ProposalResult as_proposal_result(const Proposed& p) {
  ProposalResult r;
  r.proposed.x = p.x_new;
  r.proposed.energy = p.energy_new.to(torch::kFloat64);
  r.proposed.grad = p.grad_new;
  r.log_q_ratio = p.log_q_rev - p.log_q_fwd;
  return r;
}

}  // namespace nmcmc
