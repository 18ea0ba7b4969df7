#include "nmcmc/core/finite_hvp.hpp"

namespace nmcmc {

torch::Tensor central_difference_hvp(
    const std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)>& energy_grad,
    const torch::Tensor& x, const torch::Tensor& v_in, torch::Tensor* finite_rows) {
  const torch::Tensor v = v_in.to(torch::kFloat64);
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const torch::Tensor vmax = v.abs().amax(1, true);  // [N, 1]
  const torch::Tensor live = vmax > 0;
  const torch::Tensor h = torch::where(live, 1e-5 * (1.0 + x64.abs().amax(1, true)) / vmax, torch::zeros_like(vmax));
  const auto both = energy_grad(torch::cat({x64 + h * v, x64 - h * v}));
  const int64_t n = x.size(0);
  const torch::Tensor g = both.second.to(torch::kFloat64);
  const torch::Tensor diff = g.narrow(0, 0, n) - g.narrow(0, n, n);
  const torch::Tensor hv =
      torch::where(live, diff / (2.0 * torch::where(live, h, torch::ones_like(h))), torch::zeros_like(diff));
  if (finite_rows) {
    const torch::Tensor e = both.first;
    *finite_rows = torch::isfinite(hv).all(1) & torch::isfinite(e.narrow(0, 0, n)) & torch::isfinite(e.narrow(0, n, n));
  }
  return hv;
}

}  // namespace nmcmc
