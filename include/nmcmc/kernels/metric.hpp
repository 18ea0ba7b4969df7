#pragma once
/// The Euclidean metric (inverse mass matrix) shared by HMC, MALA, RWM and NUTS: unit, diagonal,
/// dense, or low-rank plus diagonal. Momentum p ~ N(0, M); velocity dK/dp = M^{-1} p;
/// K(p) = p^T M^{-1} p / 2.
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "nmcmc/core/enum_names.hpp"
#include "nmcmc/core/transform.hpp"

namespace nmcmc {

/// The form of a metric.
enum class MetricKind { kUnit, kDiag, kDense, kLowRank };

/// How warm-up adapts the metric over Stan's windows (`--metric`):
///  unit            none;
///  diag            Stan's: the variances of the window's draws (regularised);
///  dense           Stan's: their covariance (regularised);
///  fisher-diag     per coordinate sqrt(Var x / Var dU) from the window's draws and gradients
///                  (Note [Metrics from draws and gradients], kernels/adaptation.hpp);
///  fisher-lowrank  that diagonal times a low-rank correction, the same criterion.
enum class MetricAdapt { kUnit, kDiag, kDense, kFisherDiag, kFisherLowRank };

template <>
struct EnumNames<MetricKind> {
  static constexpr const char* what = "metric form";
  static std::vector<std::pair<MetricKind, const char*>> values() {
    return {{MetricKind::kUnit, "unit"}, {MetricKind::kDiag, "diag"}, {MetricKind::kDense, "dense"},
            {MetricKind::kLowRank, "low-rank"}};
  }
};

template <>
struct EnumNames<MetricAdapt> {
  static constexpr const char* what = "metric";
  static std::vector<std::pair<MetricAdapt, const char*>> values() {
    return {{MetricAdapt::kUnit, "unit"},
            {MetricAdapt::kDiag, "diag"},
            {MetricAdapt::kDense, "dense"},
            {MetricAdapt::kFisherDiag, "fisher-diag"},
            {MetricAdapt::kFisherLowRank, "fisher-lowrank"}};
  }
};
NMCMC_ENUM_JSON(MetricAdapt)

/// Whether the adaptation's metric may be other than diagonal (needs Kernel::has_dense_metric).
inline bool is_full_rank_metric(MetricAdapt m) { return m == MetricAdapt::kDense || m == MetricAdapt::kFisherLowRank; }

class Metric {
 public:
  /// The unit metric.
  Metric() = default;
  /// From an inverse mass matrix: [D] (diagonal) or [D, D] (dense, symmetric positive definite).
  /// Throws c10::Error if a dense one has no Cholesky factor.
  explicit Metric(const torch::Tensor& inv_mass);
  /// Low rank plus diagonal: M^{-1} = S (I + U (Lambda - I) U^T) S with S = diag(sqrt(scale2)),
  /// scale2 [D] > 0, U [D, K] with orthonormal columns, eigenvalues Lambda [K] > 0 (K may be 0:
  /// the diagonal metric scale2). Every operation costs O(D K).
  static Metric low_rank(const torch::Tensor& scale2, const torch::Tensor& basis, const torch::Tensor& eigenvalues);

  MetricKind kind() const { return kind_; }
  /// The inverse mass matrix: [D] (diagonal), [D, D] (dense; low-rank: the equivalent dense
  /// matrix, built on each call: for reports), undefined for the unit metric.
  torch::Tensor inv_mass() const;
  /// Low-rank: S^2 [D], U [D, K], Lambda [K]; undefined otherwise.
  const torch::Tensor& scale2() const { return inv_mass_; }
  const torch::Tensor& basis() const { return basis_; }
  const torch::Tensor& eigenvalues() const { return eigenvalues_; }
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
  /// Low-rank: y + U ((Lambda^a - 1) * (U^T y)) for rows y, i.e. (I + U (Lambda^a - I) U^T) y.
  torch::Tensor low_rank_apply(const torch::Tensor& y, double power) const;

  MetricKind kind_ = MetricKind::kUnit;
  torch::Tensor inv_mass_;     // diag: [D]; dense: [D, D]; low-rank: S^2 [D]
  torch::Tensor chol_;         // dense: L with M^{-1} = L L^T, [D, D]
  torch::Tensor chol_inv_;     // dense: L^{-1}, [D, D]
  torch::Tensor basis_;        // low-rank: U [D, K]
  torch::Tensor eigenvalues_;  // low-rank: Lambda [K]
};

/// The metric as a change of variables (Note [Transform]): x = L y with M^{-1} = L L^T: the
/// identity (unit), sqrt(M^{-1}) (diagonal), its Cholesky factor (dense), the symmetric root
/// S (I + U (Lambda^{1/2} - I) U^T) (low rank), in the metric's dtype. HMC, MALA and random-walk
/// Metropolis with this metric on U are the same samplers as with the unit metric on U(L y), up to
/// rounding (the kernels keep the metric's own products). `dim` sizes the unit metric's identity.
AffineTransform metric_transform(const Metric& metric, int64_t dim);

}  // namespace nmcmc
