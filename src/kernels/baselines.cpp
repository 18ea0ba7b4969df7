#include "nmcmc/kernels/baselines.hpp"

#include "nmcmc/core/random.hpp"

namespace nmcmc {

namespace {
torch::Tensor as64(const torch::Tensor& t) { return t.to(torch::kFloat64); }
}  // namespace

void ScaledProposal::set_inv_mass(torch::Tensor inv_mass) {
  if (inv_mass.dim() == 2) {
    dense_ = Metric(inv_mass);
    inv_mass_ = torch::Tensor();
  } else {
    inv_mass_ = std::move(inv_mass);
    dense_ = Metric();
  }
}

ProposalResult RandomWalk::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  torch::Tensor z = randn(state.x.sizes(), gen, state.x.options());  // [C, D]
  if (inv_mass_.defined()) z = z * inv_mass_.sqrt();
  if (is_dense()) z = dense_.noise(z);
  ProposalResult r;
  r.proposed.x = state.x + eps_ * z;
  r.proposed.energy = as64(target.energy(r.proposed.x));
  r.log_q_ratio = torch::zeros({state.x.size(0)}, state.energy.options());
  return r;
}

ProposalResult Mala::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const double half_eps2 = 0.5 * eps_ * eps_;
  torch::Tensor z = randn(state.x.sizes(), gen, state.x.options());  // [C, D]
  if (is_dense()) {
    // Dense metric Sigma = M^{-1}: x' = x - (eps^2/2) Sigma dU(x) + eps L z with Sigma = L L^T;
    // log q(y|x) = -|L^{-1}(y - x + (eps^2/2) Sigma dU(x))|^2 / (2 eps^2) + const.
    ProposalResult r;
    r.proposed.x = state.x - half_eps2 * dense_.velocity(state.grad) + eps_ * dense_.noise(z);
    auto eg = target.energy_and_grad(r.proposed.x);
    r.proposed.energy = as64(eg.energy);
    r.proposed.grad = eg.grad;
    if (drop_q_ratio_) {
      r.log_q_ratio = torch::zeros({state.x.size(0)}, state.energy.options());
      return r;
    }
    torch::Tensor back = state.x - r.proposed.x + half_eps2 * dense_.velocity(eg.grad);  // [C, D]
    torch::Tensor log_q_rev = -dense_.mass_quadratic(back) / (2.0 * eps_ * eps_);
    torch::Tensor z64 = as64(z);
    r.log_q_ratio = log_q_rev + 0.5 * (z64 * z64).sum(1);
    return r;
  }
  torch::Tensor scale = inv_mass_.defined() ? inv_mass_ : torch::ones({1}, state.x.options());
  ProposalResult r;
  r.proposed.x = state.x - half_eps2 * scale * state.grad + eps_ * scale.sqrt() * z;
  auto eg = target.energy_and_grad(r.proposed.x);
  r.proposed.energy = as64(eg.energy);
  r.proposed.grad = eg.grad;
  if (drop_q_ratio_) {
    r.log_q_ratio = torch::zeros({state.x.size(0)}, state.energy.options());
    return r;
  }
  // log q(x|x') - log q(x'|x) with q(y|x) = N(y; x - (eps^2/2) M^-1 dU(x), eps^2 M^-1).
  torch::Tensor s64 = as64(scale);
  torch::Tensor back = as64(state.x) - as64(r.proposed.x) + half_eps2 * s64 * as64(eg.grad);  // [C, D]
  torch::Tensor log_q_rev = -(back * back / s64).sum(1) / (2.0 * eps_ * eps_);
  torch::Tensor z64 = as64(z);
  torch::Tensor log_q_fwd = -0.5 * (z64 * z64).sum(1);
  r.log_q_ratio = log_q_rev - log_q_fwd;
  return r;
}

Hmc::Hmc(double step_size, int64_t leapfrog_steps, HmcDefect defect)
    : ScaledProposal(step_size), leapfrog_(leapfrog_steps), defect_(defect) {
  TORCH_CHECK(leapfrog_steps >= 1, "HMC needs at least one leapfrog step, got ", leapfrog_steps);
}

torch::Tensor Hmc::kinetic(const torch::Tensor& p) const {
  if (is_dense()) return dense_.kinetic(p);
  torch::Tensor p64 = as64(p);
  if (inv_mass_.defined()) return 0.5 * (p64 * p64 * as64(inv_mass_)).sum(1);
  return 0.5 * (p64 * p64).sum(1);
}

std::pair<ChainState, torch::Tensor> Hmc::leapfrog(Target& target, const ChainState& start,
                                                   const torch::Tensor& p0, torch::Tensor eps) const {
  if (!eps.defined()) eps = torch::full({1, 1}, eps_, p0.options());
  const torch::Tensor half_eps = 0.5 * eps;
  torch::Tensor x = start.x;
  torch::Tensor p = p0 - half_eps * start.grad;
  EnergyGrad eg;
  for (int64_t l = 0; l < leapfrog_; ++l) {
    if (is_dense()) x = x + eps * dense_.velocity(p);
    else x = inv_mass_.defined() ? x + eps * inv_mass_ * p : x + eps * p;
    eg = target.energy_and_grad(x);
    const bool last = l + 1 == leapfrog_;
    p = p - ((last && defect_ != HmcDefect::kNoFinalHalfStep) ? half_eps : eps) * eg.grad;
  }
  ChainState end{x, as64(eg.energy), eg.grad};
  return {end, p};
}

ProposalResult Hmc::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  torch::Tensor p0 = randn(state.x.sizes(), gen, state.x.options());  // [C, D], p ~ N(0, M)
  if (inv_mass_.defined()) p0 = p0 / inv_mass_.sqrt();
  if (is_dense()) p0 = dense_.momentum(p0);
  torch::Tensor eps;
  if (jitter_ > 0) {
    torch::Tensor u = rand({p0.size(0), 1}, gen, p0.options());
    eps = eps_ * (1.0 + jitter_ * (2.0 * u - 1.0));  // [C, 1]
  }
  auto [end, pL] = leapfrog(target, state, p0, eps);
  ProposalResult r;
  r.proposed = end;
  r.log_q_ratio = kinetic(p0) - kinetic(pL);
  if (defect_ == HmcDefect::kWrongKineticSign) r.log_q_ratio = -r.log_q_ratio;
  return r;
}

}  // namespace nmcmc
