#include "nmcmc/kernels/metric.hpp"

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

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
  chol_ = torch::linalg_cholesky(sym.to(torch::kFloat64)).to(inv_mass.options());
  chol_inv_ = torch::linalg_inv(chol_.to(torch::kFloat64)).to(inv_mass.options());
  inv_mass_ = sym;
}

Metric Metric::low_rank(const torch::Tensor& scale2, const torch::Tensor& basis, const torch::Tensor& eigenvalues) {
  TORCH_CHECK(scale2.defined() && scale2.dim() == 1, "a low-rank metric's diagonal is [D]");
  TORCH_CHECK(basis.defined() && basis.dim() == 2 && basis.size(0) == scale2.size(0),
              "a low-rank metric's basis is [D, K] with D = ", scale2.size(0));
  TORCH_CHECK(eigenvalues.defined() && eigenvalues.dim() == 1 && eigenvalues.size(0) == basis.size(1),
              "a low-rank metric has one eigenvalue per basis vector");
  TORCH_CHECK((scale2 > 0).all().item<bool>() && (eigenvalues > 0).all().item<bool>(),
              "a low-rank metric's diagonal and eigenvalues are positive");
  Metric m;
  m.kind_ = MetricKind::kLowRank;
  m.inv_mass_ = scale2;
  m.basis_ = basis.to(scale2.options());
  m.eigenvalues_ = eigenvalues.to(scale2.options());
  return m;
}

torch::Tensor Metric::inv_mass() const {
  if (kind_ != MetricKind::kLowRank) return inv_mass_;
  const torch::Tensor s = inv_mass_.sqrt();  // [D]
  const torch::Tensor a = torch::eye(s.size(0), inv_mass_.options()) +
                          torch::matmul(basis_ * (eigenvalues_ - 1), basis_.t());  // I + U (Lambda - I) U^T
  return s.unsqueeze(1) * a * s.unsqueeze(0);
}

torch::Tensor Metric::low_rank_apply(const torch::Tensor& y, double power) const {
  if (basis_.size(1) == 0) return y;
  const torch::Tensor coef = torch::matmul(y, basis_);  // [C, K]
  return y + torch::matmul(coef * (eigenvalues_.pow(power) - 1), basis_.t());
}

Metric Metric::to(const torch::TensorOptions& options) const {
  if (kind_ == MetricKind::kUnit) return *this;
  Metric m = *this;
  m.inv_mass_ = inv_mass_.to(options);
  if (chol_.defined()) {
    m.chol_ = chol_.to(options);
    m.chol_inv_ = chol_inv_.to(options);
  }
  if (basis_.defined()) {
    m.basis_ = basis_.to(options);
    m.eigenvalues_ = eigenvalues_.to(options);
  }
  return m;
}

torch::Tensor Metric::momentum(const torch::Tensor& z) const {
  switch (kind_) {
    case MetricKind::kUnit: return z;
    case MetricKind::kDiag: return z / inv_mass_.sqrt();
    case MetricKind::kDense: return torch::matmul(z, chol_inv_);  // row form of L^{-T} z
    // M^{-1} = S A S = L L^T with L = S A^{1/2}: M^{1/2} z = L^{-T} z = S^{-1} A^{-1/2} z
    case MetricKind::kLowRank: return low_rank_apply(z, -0.5) / inv_mass_.sqrt();
  }
  return z;
}

torch::Tensor Metric::velocity(const torch::Tensor& p) const {
  switch (kind_) {
    case MetricKind::kUnit: return p;
    case MetricKind::kDiag: return inv_mass_ * p;
    case MetricKind::kDense: return torch::matmul(p, inv_mass_);  // symmetric
    case MetricKind::kLowRank: {
      const torch::Tensor s = inv_mass_.sqrt();
      return low_rank_apply(p * s, 1.0) * s;
    }
  }
  return p;
}

torch::Tensor Metric::noise(const torch::Tensor& z) const {
  switch (kind_) {
    case MetricKind::kUnit: return z;
    case MetricKind::kDiag: return inv_mass_.sqrt() * z;
    case MetricKind::kDense: return torch::matmul(z, chol_.t());  // row form of L z
    case MetricKind::kLowRank: return low_rank_apply(z, 0.5) * inv_mass_.sqrt();
  }
  return z;
}

torch::Tensor Metric::noise(const torch::Tensor& z, double c) const {
  switch (kind_) {
    case MetricKind::kUnit: return c * z;
    case MetricKind::kDiag: return c * inv_mass_.sqrt() * z;
    case MetricKind::kDense: return c * torch::matmul(z, chol_.t());
    case MetricKind::kLowRank: return low_rank_apply(z, 0.5) * (c * inv_mass_.sqrt());
  }
  return z;
}

torch::Tensor Metric::drift(const torch::Tensor& v, double c) const {
  switch (kind_) {
    case MetricKind::kUnit: return c * v;
    case MetricKind::kDiag: return c * inv_mass_ * v;
    case MetricKind::kDense: return c * torch::matmul(v, inv_mass_);
    case MetricKind::kLowRank: return c * velocity(v);
  }
  return v;
}

torch::Tensor Metric::kinetic(const torch::Tensor& p) const {
  torch::Tensor p64 = p.to(torch::kFloat64);
  switch (kind_) {
    case MetricKind::kUnit: return 0.5 * (p64 * p64).sum(1);
    case MetricKind::kDiag: return 0.5 * (p64 * p64 * inv_mass_.to(torch::kFloat64)).sum(1);
    case MetricKind::kDense: return 0.5 * (p64 * torch::matmul(p64, inv_mass_.to(torch::kFloat64))).sum(1);
    case MetricKind::kLowRank: return 0.5 * (p64 * to(p64.options()).velocity(p64)).sum(1);
  }
  return p64;
}

torch::Tensor Metric::mass_quadratic(const torch::Tensor& v) const {
  torch::Tensor v64 = v.to(torch::kFloat64);
  switch (kind_) {
    case MetricKind::kUnit: return (v64 * v64).sum(1);
    case MetricKind::kDiag: return (v64 * v64 / inv_mass_.to(torch::kFloat64)).sum(1);
    case MetricKind::kDense: return torch::matmul(v64, chol_inv_.to(torch::kFloat64).t()).pow(2).sum(1);
    case MetricKind::kLowRank: {
      // v^T M v = w^T A^{-1} w with w = S^{-1} v
      const Metric m64 = to(v64.options());
      const torch::Tensor w = v64 / m64.inv_mass_.sqrt();
      return (w * m64.low_rank_apply(w, -1.0)).sum(1);
    }
  }
  return v64;
}

AffineTransform metric_transform(const Metric& metric, int64_t dim) {
  // diag: M^{-1} [D]; dense: M^{-1} [D, D]; low rank: S^2 [D]
  const torch::Tensor s2 = metric.kind() == MetricKind::kLowRank ? metric.scale2() : metric.inv_mass();
  switch (metric.kind()) {
    case MetricKind::kUnit: return AffineTransform::identity(dim);
    case MetricKind::kDiag:
      return AffineTransform::diagonal(torch::zeros({dim}, s2.options()), s2.sqrt(),
                                       0.5 * s2.log().sum().to(torch::kFloat64));
    case MetricKind::kDense: {
      torch::Tensor l = torch::linalg_cholesky(s2);
      return AffineTransform::dense(torch::zeros({dim}, s2.options()), l, torch::Tensor(),
                                    l.diagonal().log().sum().to(torch::kFloat64));
    }
    case MetricKind::kLowRank: {
      torch::Tensor t = 0.5 * metric.eigenvalues().log();
      return AffineTransform::low_rank(torch::zeros({dim}, s2.options()), s2.sqrt(), metric.basis(), t,
                                       (0.5 * s2.log().sum() + t.sum()).to(torch::kFloat64));
    }
  }
  TORCH_CHECK(false, "metric_transform: unknown metric form");
}

}  // namespace nmcmc
