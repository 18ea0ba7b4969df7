#include "nmcmc/training/objective.hpp"

#include <cmath>

namespace nmcmc {

namespace {
/// Note [Non-finite rows in training]: the target as the proposal's passes see it, with every
/// row whose energy or gradient is not finite (a density that overflows or raises there) replaced
/// by zeros and remembered; the gradients that reach such a row's input from the target's
/// backward pass are zeroed too. So a bad row's computations stay finite, its loss term is left
/// out (it counts as a rejected proposal), and it adds exactly nothing to the other rows'
/// gradients, instead of turning the whole step's gradient into NaN.
class RowGuard : public Target {
 public:
  RowGuard(Target& inner, int64_t rows)
      : Target(inner.options()), inner_(&inner), bad_(torch::zeros({rows}, torch::kBool)) {}
  std::string name() const override { return inner_->name(); }
  int64_t dim() const override { return inner_->dim(); }
  nlohmann::json spec() const override { return inner_->spec(); }
  /// Rows that were not finite in some evaluation so far [rows].
  const torch::Tensor& bad() const { return bad_; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    torch::Tensor e = inner_->energy(guarded(x));
    torch::Tensor row_bad = ~torch::isfinite(e.detach());
    if (!note(row_bad)) return e;
    return torch::where(row_bad, torch::zeros_like(e), e);
  }
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override {
    EnergyGrad eg = inner_->energy_and_grad(guarded(x), create_graph);
    torch::Tensor row_bad = ~(torch::isfinite(eg.energy.detach()) & torch::isfinite(eg.grad.detach()).all(1));
    if (!note(row_bad)) return eg;
    return {torch::where(row_bad, torch::zeros_like(eg.energy), eg.energy),
            torch::where(row_bad.unsqueeze(1), torch::zeros_like(eg.grad), eg.grad)};
  }

 private:
  /// x as the target gets it: with a hook that zeroes the gradient rows of bad rows.
  torch::Tensor guarded(const torch::Tensor& x) const {
    if (!x.requires_grad() || x.dim() != 2 || x.size(0) != bad_.size(0)) return x;
    torch::Tensor xi = x.view_as(x);
    torch::Tensor bad = bad_;  // shares the storage: rows found bad later are zeroed too
    xi.register_hook([bad](const torch::Tensor& g) {
      return torch::where(bad.to(g.device()).unsqueeze(1), torch::zeros_like(g), g);
    });
    return xi;
  }
  /// Records bad rows; whether there are any.
  bool note(const torch::Tensor& row_bad) const {
    if (!row_bad.any().item<bool>()) return false;
    TORCH_CHECK(row_bad.dim() == 1 && row_bad.size(0) == bad_.size(0),
                "entropy_objective: the proposal evaluated the target on another number of rows");
    bad_.logical_or_(row_bad.to(bad_.device()));
    return true;
  }
  Target* inner_;
  torch::Tensor bad_;
};
}  // namespace

ObjectiveTerms entropy_objective(Target& target, ProposalModel& model, const torch::Tensor& x,
                                 const torch::Tensor& u_x, const torch::Tensor& grad_x, double beta,
                                 at::Generator& gen, bool create_graph) {
  ObjectiveTerms t;
  RowGuard guard(target, x.size(0));
  t.proposed = model.propose(guard, x, grad_x, gen, create_graph);
  Proposed& p = t.proposed;
  torch::Tensor log_a = log_acceptance(u_x, p.energy_new, p.log_q_rev - p.log_q_fwd);  // [B]
  const torch::Tensor bad = guard.bad().to(log_a.device());
  torch::Tensor finite = torch::isfinite(log_a.detach()) & ~bad;
  t.rows_bad = bad.sum().item<int64_t>();
  const double d = static_cast<double>(model.dim());
  torch::Tensor entropy = p.log_det + d * model.log_eps().to(torch::kFloat64);  // [B]
  torch::Tensor per_x = torch::clamp_max(log_a, 0.0) + beta * entropy;
  torch::Tensor count = finite.sum();
  t.rows_finite = count.item<int64_t>();
  torch::Tensor n_finite = count.clamp_min(1).to(torch::kFloat64);
  t.loss = -torch::where(finite, per_x, torch::zeros_like(per_x)).sum() / n_finite;
  t.loss_value = t.loss.item<double>();
  torch::NoGradGuard no_grad;
  if (t.rows_bad > 0) {  // rejected wherever the flow met a bad row (advance_rows reads energy_new)
    p.energy_new = torch::where(bad, torch::full_like(p.energy_new, INFINITY), p.energy_new.detach());
    p.x_new = torch::where(bad.unsqueeze(1), x.detach(), p.x_new.detach());
  }
  t.log_a = torch::where(finite, log_a.detach(), torch::full_like(log_a, -INFINITY));
  t.accept = torch::exp(torch::clamp_max(t.log_a, 0.0)).mean().item<double>();
  t.entropy = entropy.detach();
  t.jump_sq = (p.x_new.detach() - x.detach()).to(torch::kFloat64).pow(2).sum(1);
  return t;
}

}  // namespace nmcmc
