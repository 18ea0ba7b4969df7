#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

FunnelTarget::FunnelTarget(int64_t dim, double sigma, torch::TensorOptions options)
    : Target(options), dim_(dim), sigma_(sigma) {
  if (dim < 2) throw UsageError("funnel: dim must be at least 2, got " + std::to_string(dim));
  if (!(sigma > 0) || !std::isfinite(sigma)) throw UsageError("funnel: sigma must be positive");
}

nlohmann::json FunnelTarget::spec() const { return {{"name", "funnel"}, {"dim", dim_}, {"sigma", sigma_}}; }

torch::Tensor FunnelTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor x0 = x.select(1, 0);              // [C]
  torch::Tensor rest = x.narrow(1, 1, dim_ - 1);  // [C, D-1]
  torch::Tensor e = torch::exp(torch::clamp_max(x0, kExpCap));
  return x0 * x0 / (2.0 * sigma_ * sigma_) + 0.5 * e * (rest * rest).sum(1) - 0.5 * (dim_ - 1) * x0;
}

EnergyGrad FunnelTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  torch::AutoGradMode mode(create_graph);
  torch::Tensor x0 = x.select(1, 0);
  torch::Tensor rest = x.narrow(1, 1, dim_ - 1);
  torch::Tensor e = torch::exp(torch::clamp_max(x0, kExpCap));
  torch::Tensor half_sq = 0.5 * (rest * rest).sum(1);
  torch::Tensor u = x0 * x0 / (2.0 * sigma_ * sigma_) + e * half_sq - 0.5 * (dim_ - 1) * x0;
  // d/dx0 exp(min(x0, cap)) is 0 beyond the cap, consistent with the energy there.
  torch::Tensor de = torch::where(x0 < kExpCap, e, torch::zeros_like(e));
  torch::Tensor g0 = x0 / (sigma_ * sigma_) + de * half_sq - 0.5 * (dim_ - 1);
  torch::Tensor grad = torch::cat({g0.unsqueeze(1), e.unsqueeze(1) * rest}, 1);
  return {u, grad};
}

torch::Tensor FunnelTarget::sample(int64_t n, at::Generator& gen) const {
  torch::NoGradGuard no_grad;
  torch::Tensor z = torch::randn({n, dim_}, gen, options_);
  torch::Tensor x0 = sigma_ * z.narrow(1, 0, 1);
  torch::Tensor rest = torch::exp(-0.5 * x0) * z.narrow(1, 1, dim_ - 1);
  return torch::cat({x0, rest}, 1);
}

std::optional<Moments> FunnelTarget::reference_moments() const {
  torch::Tensor sd = torch::full({dim_}, std::exp(sigma_ * sigma_ / 4.0), torch::kFloat64);
  sd[0] = sigma_;
  return Moments{torch::zeros({dim_}, torch::kFloat64), sd};
}

torch::Tensor MoonTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor x0 = x.select(1, 0), x1 = x.select(1, 1);
  torch::Tensor r = x1 - x0 * x0 + 4.0;
  return 0.5 * x0 * x0 + 0.5 * r * r;
}

torch::Tensor MoonTarget::sample(int64_t n, at::Generator& gen) const {
  torch::NoGradGuard no_grad;
  torch::Tensor z = torch::randn({n, 2}, gen, options_);
  torch::Tensor x0 = z.select(1, 0);
  return torch::stack({x0, x0 * x0 - 4.0 + z.select(1, 1)}, 1);
}

std::optional<Moments> MoonTarget::reference_moments() const {
  // x0 ~ N(0, 1); x1 = x0^2 - 4 + N(0, 1): mean -3, variance Var(x0^2) + 1 = 3.
  return Moments{torch::tensor({0.0, -3.0}, torch::kFloat64), torch::tensor({1.0, std::sqrt(3.0)}, torch::kFloat64)};
}

}  // namespace nmcmc
