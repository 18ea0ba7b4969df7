#include "nmcmc/training/objective.hpp"

#include <cmath>

namespace nmcmc {

ObjectiveTerms entropy_objective(Target& target, ProposalModel& model, const torch::Tensor& x,
                                 const torch::Tensor& u_x, const torch::Tensor& grad_x, double beta,
                                 at::Generator& gen, bool create_graph) {
  ObjectiveTerms t;
  t.proposed = model.propose(target, x, grad_x, gen, create_graph);
  const Proposed& p = t.proposed;
  torch::Tensor log_a = log_acceptance(u_x, p.energy_new, p.log_q_rev - p.log_q_fwd);  // [B]
  torch::Tensor finite = torch::isfinite(log_a.detach());
  const double d = static_cast<double>(model.dim());
  torch::Tensor entropy = p.log_det + d * model.log_eps().to(torch::kFloat64);  // [B]
  torch::Tensor per_x = torch::clamp_max(log_a, 0.0) + beta * entropy;
  torch::Tensor count = finite.sum();
  t.rows_finite = count.item<int64_t>();
  torch::Tensor n_finite = count.clamp_min(1).to(torch::kFloat64);
  t.loss = -torch::where(finite, per_x, torch::zeros_like(per_x)).sum() / n_finite;
  t.loss_value = t.loss.item<double>();
  torch::NoGradGuard no_grad;
  t.log_a = torch::where(finite, log_a.detach(), torch::full_like(log_a, -INFINITY));
  t.accept = torch::exp(torch::clamp_max(t.log_a, 0.0)).mean().item<double>();
  t.entropy = entropy.detach();
  t.jump_sq = (p.x_new.detach() - x.detach()).to(torch::kFloat64).pow(2).sum(1);
  return t;
}

}  // namespace nmcmc
