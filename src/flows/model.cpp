#include "nmcmc/flows/model.hpp"

#include "nmcmc/core/random.hpp"

namespace nmcmc {

torch::Tensor flow_log_density(const torch::Tensor& z_base, const torch::Tensor& log_det, const torch::Tensor& d_log_eps) {
  return -0.5 * z_base.to(torch::kFloat64).pow(2).sum(1) - log_det - d_log_eps;
}

void set_flow_densities(Proposed& p, const torch::Tensor& z0, const FlowPass& fwd, const FlowPass& rev,
                        const torch::Tensor& d_log_eps, LearnedDefect defect) {
  const bool keep_det = defect != LearnedDefect::kDropLogDet;
  p.log_det = fwd.log_det;
  p.log_q_fwd = flow_log_density(z0, keep_det ? fwd.log_det : torch::zeros_like(fwd.log_det), d_log_eps);
  p.log_q_rev = flow_log_density(rev.z, keep_det ? rev.log_det : torch::zeros_like(rev.log_det), d_log_eps);
  if (defect == LearnedDefect::kDropReverse) p.log_q_rev = p.log_q_fwd;
}

ProposalResult ModelProposal::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  Proposed p = model_->propose(target, state.x, state.grad, gen, /*create_graph=*/false);
  ProposalResult r;
  r.proposed.x = p.x_new;
  r.proposed.energy = p.energy_new.to(torch::kFloat64);
  r.proposed.grad = p.grad_new;
  r.log_q_ratio = p.log_q_rev - p.log_q_fwd;
  return r;
}

ObjectiveTerms entropy_objective(Target& target, ProposalModel& model, const torch::Tensor& x,
                                 const torch::Tensor& u_x, const torch::Tensor& grad_x, double beta,
                                 at::Generator& gen, bool create_graph) {
  ObjectiveTerms t;
  t.proposed = model.propose(target, x, grad_x, gen, create_graph);
  const Proposed& p = t.proposed;
  torch::Tensor log_a = u_x.to(torch::kFloat64) - p.energy_new.to(torch::kFloat64) + p.log_q_rev - p.log_q_fwd;
  torch::Tensor finite = torch::isfinite(log_a.detach());
  const double d = static_cast<double>(model.dim());
  torch::Tensor entropy = p.log_det + d * model.log_eps().to(torch::kFloat64);  // [B]
  torch::Tensor per_x = torch::clamp_max(log_a, 0.0) + beta * entropy;
  torch::Tensor n_finite = finite.sum().clamp_min(1).to(torch::kFloat64);
  t.loss = -torch::where(finite, per_x, torch::zeros_like(per_x)).sum() / n_finite;
  t.loss_value = t.loss.item<double>();
  torch::NoGradGuard no_grad;
  t.log_a = torch::where(finite, log_a.detach(), torch::full_like(log_a, -INFINITY));
  t.accept = torch::exp(torch::clamp_max(t.log_a, 0.0)).mean().item<double>();
  t.entropy = entropy.detach();
  t.jump_sq = (p.x_new.detach() - x.detach()).to(torch::kFloat64).pow(2).sum(1);
  return t;
}

torch::Tensor accept_moves(const torch::Tensor& x, const ObjectiveTerms& terms, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  torch::Tensor u = rand({x.size(0)}, gen, terms.log_a.options());
  torch::Tensor acc = (torch::log(u) < terms.log_a).unsqueeze(1);
  return torch::where(acc, terms.proposed.x_new.detach(), x.detach());
}

}  // namespace nmcmc
