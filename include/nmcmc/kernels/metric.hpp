#pragma once
/// The Euclidean metric (inverse mass matrix) shared by HMC, MALA, RWM and NUTS: unit, diagonal
/// or dense. Momentum p ~ N(0, M); velocity dK/dp = M^{-1} p; K(p) = p^T M^{-1} p / 2.
#include <torch/torch.h>

#include <string>

namespace nmcmc {

enum class MetricKind { kUnit, kDiag, kDense };
/// "unit" | "diag" | "dense"; UsageError otherwise.
MetricKind parse_metric(const std::string& name);
std::string metric_name(MetricKind kind);

class Metric {
 public:
  /// The unit metric.
  Metric() = default;
  /// From an inverse mass matrix: [D] (diagonal) or [D, D] (dense, symmetric positive definite).
  /// Throws c10::Error if a dense one has no Cholesky factor.
  explicit Metric(const torch::Tensor& inv_mass);

  MetricKind kind() const { return kind_; }
  /// The inverse mass matrix ([D] or [D, D]); undefined for the unit metric.
  const torch::Tensor& inv_mass() const { return inv_mass_; }
  /// p ~ N(0, M), [C, D] from standard normal draws z [C, D]: p = M^{1/2} z.
  torch::Tensor momentum(const torch::Tensor& z) const;
  /// M^{-1} p, [C, D].
  torch::Tensor velocity(const torch::Tensor& p) const;
  /// M^{-1/2} z, [C, D]: noise with covariance M^{-1} (MALA, RWM).
  torch::Tensor noise(const torch::Tensor& z) const;
  /// c M^{-1/2} z, [C, D] (the scalar folded into the diagonal first).
  torch::Tensor noise(const torch::Tensor& z, double c) const;
  /// c M^{-1} v, [C, D]: MALA's drift (c = eps^2 / 2, v = dU).
  torch::Tensor drift(const torch::Tensor& v, double c) const;
  /// K(p) = p^T M^{-1} p / 2, [C] float64.
  torch::Tensor kinetic(const torch::Tensor& p) const;
  /// v^T M v, [C] float64 (the quadratic form of a Gaussian with covariance M^{-1}).
  torch::Tensor mass_quadratic(const torch::Tensor& v) const;
  /// The metric in another dtype/device.
  Metric to(const torch::TensorOptions& options) const;

 private:
  MetricKind kind_ = MetricKind::kUnit;
  torch::Tensor inv_mass_;   // [D] or [D, D]
  torch::Tensor chol_;       // dense: L with M^{-1} = L L^T, [D, D]
  torch::Tensor chol_inv_;   // dense: L^{-1}, [D, D]
};

}  // namespace nmcmc
