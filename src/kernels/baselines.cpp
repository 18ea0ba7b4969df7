#include "nmcmc/kernels/baselines.hpp"

#include "nmcmc/core/random.hpp"

namespace nmcmc {

namespace {
torch::Tensor as64(const torch::Tensor& t) { return t.to(torch::kFloat64); }
}  // namespace

void ScaledProposal::set_metric(const Metric& metric) {
  metric_ = metric;
  const torch::Tensor any = metric.kind() == MetricKind::kUnit ? torch::Tensor() : metric.scale2();
  metric64_ = metric_.to(torch::TensorOptions().dtype(torch::kFloat64).device(any.defined() ? any.device() : torch::kCPU));
}

void ScaledProposal::follow_device(const torch::Tensor& x) {
  if (metric_.kind() == MetricKind::kUnit || metric_.scale2().device() == x.device()) return;
  // A metric given on another device (a user's CPU tensors for chains on a GPU) moves once.
  metric_ = metric_.to(metric_.scale2().options().device(x.device()));
  metric64_ = metric64_.to(metric64_.scale2().options().device(x.device()));
}

ProposalResult RandomWalk::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  follow_device(state.x);
  torch::Tensor z = randn(state.x.sizes(), gen, state.x.options());  // [C, D]
  ProposalResult r;
  r.proposed.x = state.x + eps_ * metric_.noise(z);
  r.proposed.energy = as64(target.energy(r.proposed.x));
  r.log_q_ratio = torch::zeros({state.x.size(0)}, state.energy.options());
  return r;
}

ProposalResult Mala::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  follow_device(state.x);
  const double half_eps2 = 0.5 * eps_ * eps_;
  torch::Tensor z = randn(state.x.sizes(), gen, state.x.options());  // [C, D]
  // x' = x - (eps^2/2) M^{-1} dU(x) + eps M^{-1/2} z.
  ProposalResult r;
  r.proposed.x = state.x - metric_.drift(state.grad, half_eps2) + metric_.noise(z, eps_);
  auto eg = target.energy_and_grad(r.proposed.x);
  r.proposed.energy = as64(eg.energy);
  r.proposed.grad = eg.grad;
  // log q(x|x') - log q(x'|x) with q(y|x) = N(y; x - (eps^2/2) M^-1 dU(x), eps^2 M^-1), in float64:
  // log q(x|x') = -(b^T M b) / (2 eps^2) with b = x - x' + (eps^2/2) M^{-1} dU(x'); log q(x'|x) = -|z|^2/2.
  torch::Tensor back = as64(state.x) - as64(r.proposed.x) + metric64_.drift(as64(eg.grad), half_eps2);  // [C, D]
  torch::Tensor log_q_rev = -metric64_.mass_quadratic(back) / (2.0 * eps_ * eps_);
  torch::Tensor z64 = as64(z);
  torch::Tensor log_q_fwd = -0.5 * (z64 * z64).sum(1);
  r.log_q_ratio = log_q_rev - log_q_fwd;
  return r;
}

Hmc::Hmc(double step_size, int64_t leapfrog_steps) : ScaledProposal(step_size), leapfrog_(leapfrog_steps) {
  TORCH_CHECK(leapfrog_steps >= 1, "HMC needs at least one leapfrog step, got ", leapfrog_steps);
}

ProposalResult Hmc::propose(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  follow_device(state.x);
  torch::Tensor p0 = metric_.momentum(randn(state.x.sizes(), gen, state.x.options()));  // [C, D], p ~ N(0, M)
  torch::Tensor eps = torch::full({1, 1}, eps_, p0.options());
  if (jitter_ > 0) {
    torch::Tensor u = rand({p0.size(0), 1}, gen, p0.options());
    eps = eps_ * (1.0 + jitter_ * (2.0 * u - 1.0));  // [C, 1]
  }
  const PhasePoint end = leapfrog(target, metric_, {state.x, p0, state.grad, state.energy}, eps, leapfrog_);
  ProposalResult r;
  r.proposed = ChainState{end.x, end.energy, end.grad};
  r.log_q_ratio = metric_.kinetic(p0) - metric_.kinetic(end.p);
  return r;
}

}  // namespace nmcmc
