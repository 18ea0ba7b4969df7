#include "nmcmc/kernels/metric.hpp"

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

MetricKind parse_metric(const std::string& name) {
  if (name == "unit") return MetricKind::kUnit;
  if (name == "diag") return MetricKind::kDiag;
  if (name == "dense") return MetricKind::kDense;
  throw UsageError("unknown metric '" + name + "' (unit, diag, dense)");
}

std::string metric_name(MetricKind kind) {
  switch (kind) {
    case MetricKind::kUnit: return "unit";
    case MetricKind::kDiag: return "diag";
    case MetricKind::kDense: return "dense";
  }
  return "unit";
}

Metric::Metric(const torch::Tensor& inv_mass) : inv_mass_(inv_mass) {
  TORCH_CHECK(inv_mass.defined() && (inv_mass.dim() == 1 || (inv_mass.dim() == 2 && inv_mass.size(0) == inv_mass.size(1))),
              "an inverse mass matrix is [D] or [D, D]");
  if (inv_mass.dim() == 1) {
    kind_ = MetricKind::kDiag;
    return;
  }
  kind_ = MetricKind::kDense;
  // M^{-1} = L L^T: M^{-1/2} z = L z, M^{1/2} z = L^{-T} z, v^T M v = |L^{-1} v|^2 (row vectors below).
  torch::Tensor sym = 0.5 * (inv_mass + inv_mass.t());
  chol_ = torch::linalg::cholesky(sym.to(torch::kFloat64)).to(inv_mass.options());
  chol_inv_ = torch::linalg::inv(chol_.to(torch::kFloat64)).to(inv_mass.options());
  inv_mass_ = sym;
}

Metric Metric::to(const torch::TensorOptions& options) const {
  if (kind_ == MetricKind::kUnit) return *this;
  Metric m = *this;
  m.inv_mass_ = inv_mass_.to(options);
  if (chol_.defined()) {
    m.chol_ = chol_.to(options);
    m.chol_inv_ = chol_inv_.to(options);
  }
  return m;
}

torch::Tensor Metric::momentum(const torch::Tensor& z) const {
  switch (kind_) {
    case MetricKind::kUnit: return z;
    case MetricKind::kDiag: return z / inv_mass_.sqrt();
    case MetricKind::kDense: return torch::matmul(z, chol_inv_);  // row form of L^{-T} z
  }
  return z;
}

torch::Tensor Metric::velocity(const torch::Tensor& p) const {
  switch (kind_) {
    case MetricKind::kUnit: return p;
    case MetricKind::kDiag: return inv_mass_ * p;
    case MetricKind::kDense: return torch::matmul(p, inv_mass_);  // symmetric
  }
  return p;
}

torch::Tensor Metric::noise(const torch::Tensor& z) const {
  switch (kind_) {
    case MetricKind::kUnit: return z;
    case MetricKind::kDiag: return inv_mass_.sqrt() * z;
    case MetricKind::kDense: return torch::matmul(z, chol_.t());  // row form of L z
  }
  return z;
}

torch::Tensor Metric::noise(const torch::Tensor& z, double c) const {
  switch (kind_) {
    case MetricKind::kUnit: return c * z;
    case MetricKind::kDiag: return c * inv_mass_.sqrt() * z;
    case MetricKind::kDense: return c * torch::matmul(z, chol_.t());
  }
  return z;
}

torch::Tensor Metric::drift(const torch::Tensor& v, double c) const {
  switch (kind_) {
    case MetricKind::kUnit: return c * v;
    case MetricKind::kDiag: return c * inv_mass_ * v;
    case MetricKind::kDense: return c * torch::matmul(v, inv_mass_);
  }
  return v;
}

torch::Tensor Metric::kinetic(const torch::Tensor& p) const {
  torch::Tensor p64 = p.to(torch::kFloat64);
  switch (kind_) {
    case MetricKind::kUnit: return 0.5 * (p64 * p64).sum(1);
    case MetricKind::kDiag: return 0.5 * (p64 * p64 * inv_mass_.to(torch::kFloat64)).sum(1);
    case MetricKind::kDense: return 0.5 * (p64 * torch::matmul(p64, inv_mass_.to(torch::kFloat64))).sum(1);
  }
  return p64;
}

torch::Tensor Metric::mass_quadratic(const torch::Tensor& v) const {
  torch::Tensor v64 = v.to(torch::kFloat64);
  switch (kind_) {
    case MetricKind::kUnit: return (v64 * v64).sum(1);
    case MetricKind::kDiag: return (v64 * v64 / inv_mass_.to(torch::kFloat64)).sum(1);
    case MetricKind::kDense: return torch::matmul(v64, chol_inv_.to(torch::kFloat64).t()).pow(2).sum(1);
  }
  return v64;
}

}  // namespace nmcmc
