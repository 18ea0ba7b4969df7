#include "nmcmc/kernels/integrator.hpp"

#include <limits>

namespace nmcmc {

PhasePoint leapfrog(Target& target, const Metric& metric, const PhasePoint& start, const torch::Tensor& eps,
                    int64_t steps) {
  TORCH_CHECK(steps >= 1, "leapfrog needs at least one step, got ", steps);
  const torch::Tensor half_eps = 0.5 * eps;
  torch::Tensor x = start.x;
  torch::Tensor p = start.p - half_eps * start.grad;
  EnergyGrad eg;
  for (int64_t l = 0; l < steps; ++l) {
    x = x + eps * metric.velocity(p);
    eg = target.energy_and_grad(x);
    p = p - (l + 1 == steps ? half_eps : eps) * eg.grad;
  }
  return {x, p, eg.grad, eg.energy.to(torch::kFloat64)};
}

torch::Tensor hamiltonian(const Metric& metric, const PhasePoint& z) {
  torch::Tensor h = z.energy.to(torch::kFloat64) + metric.kinetic(z.p);
  return torch::where(torch::isfinite(h), h, torch::full_like(h, std::numeric_limits<double>::infinity()));
}

}  // namespace nmcmc
