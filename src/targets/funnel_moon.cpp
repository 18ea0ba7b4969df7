#include <algorithm>
#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/targets/targets.hpp"
#include "row_loop.hpp"

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

namespace {
/// U and dU of the funnel row by row, for a contiguous CPU batch without autograd (Note [The
/// funnel's rows]): the same formula as the tensor version, each row in float64.
template <typename T>
EnergyGrad funnel_rows(const torch::Tensor& x, double sigma, double cap) {
  const int64_t c = x.size(0), d = x.size(1);
  torch::Tensor u = torch::empty({c}, x.options()), g = torch::empty({c, d}, x.options());
  const T* xs = x.data_ptr<T>();
  T* us = u.data_ptr<T>();
  T* gs = g.data_ptr<T>();
  const double inv_s2 = 1.0 / (sigma * sigma), half_rest = 0.5 * static_cast<double>(d - 1);
  for (int64_t i = 0; i < c; ++i) {
    const T* row = xs + i * d;
    T* grow = gs + i * d;
    const double x0 = static_cast<double>(row[0]);
    const double e = std::exp(std::min(x0, cap));
    double sq = 0;
    for (int64_t j = 1; j < d; ++j) {
      const double v = static_cast<double>(row[j]);
      sq += v * v;
      grow[j] = static_cast<T>(e * v);
    }
    const double half_sq = 0.5 * sq;
    us[i] = static_cast<T>(0.5 * x0 * x0 * inv_s2 + e * half_sq - half_rest * x0);
    grow[0] = static_cast<T>(x0 * inv_s2 + (x0 < cap ? e : 0.0) * half_sq - half_rest);
  }
  return {u, g};
}
}  // namespace

// Note [The funnel's rows]
// The funnel's energy and gradient are a dozen tensor operations, each a few microseconds of
// LibTorch's dispatch whatever the batch: at NUTS's batches (tens of chains, a call per leaf) the
// dispatch was the whole cost of a gradient, so NUTS paid per batched call, not per chain's
// gradient, and its chains waiting for the deepest tree (utilisation 0.62 on Funnel-1 at 64
// chains) cost it as much as if they had computed. Without autograd, on a contiguous CPU batch,
// one loop over the rows does the same arithmetic (in float64, rounded once to the batch's dtype;
// the tensor version rounds each operation in the batch's dtype: float32 results differ in the
// last bits). The learned sampler's training (create_graph) keeps the tensor version.
EnergyGrad FunnelTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  if (auto eg = detail::on_rows(x, create_graph, dim_, [&](auto t) {
        return funnel_rows<typename decltype(t)::type>(x, sigma_, kExpCap);
      })) {
    return *eg;
  }
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
