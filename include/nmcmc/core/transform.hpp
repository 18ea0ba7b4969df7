#pragma once
/// A change of variables x = T(y), the affine family of them, and the target pulled back through
/// one (Note [Transform]).
//
// Note [Transform]
// Every change of variables a sampler runs through is a Transform: a bijection x = T(y) of R^D
// with its log-determinant and the chain rule for energy gradients both ways. Two kinds exist:
//  - AffineTransform (here): x = m + L y with L the identity, diagonal, lower triangular (L0 or
//    L0 M) or "diagonal times identity plus k directions" (low rank). It is the learned
//    sampler's preconditioner (Note [Affine preconditioner], flows/learned.hpp) and the value of a
//    Euclidean metric (metric_transform, kernels/metric.hpp: HMC with inverse mass matrix
//    M^-1 = L L^T is HMC with the unit metric on U(L y)).
//  - FlowTransform (flows/transport.hpp): the fitted normalizing flow, an affine base map after
//    coupling layers (Note [Flow transport]).
// TransformedTarget is the one pulled-back target every kernel runs on:
//   U_y(y) = U(T(y)) - log|det dT/dy|,   grad U_y(y) = J(y)^T dU(T(y)) - grad_y log|det dT/dy|,
// each evaluation one (counted) evaluation of the inner target, so draws y map to exact draws
// x = T(y). With Jacobian::kOmit (allowed only where log|det| is constant) it is the view a
// proposal uses that carries the constant in its own densities: U_y(y) = U(T(y)), the energies
// those of the real target (the learned sampler's preconditioner).
// The implementations keep their own arithmetic (the flow its native pass and its graph paths,
// the affine maps their closed forms): a Transform's defaults compute by autograd through
// forward() and inverse(), which an implementation overrides where it has a cheaper or exact form.
// Kernels keep Metric's own products (kernels/metric.hpp): the same chain on the transformed
// target rounds differently, so a metric run through its transform is the same sampler, not the
// same bits (test_transform.cpp holds the two equal to rounding).
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nmcmc/core/target.hpp"

namespace nmcmc {

/// A pass through a transform: the mapped rows [C, D] and log|det| of the map taken [C] (float64).
struct TransformPass {
  torch::Tensor out;
  torch::Tensor log_det;
};

/// A bijection x = T(y) of R^D (Note [Transform]).
class Transform {
 public:
  virtual ~Transform() = default;
  virtual int64_t dim() const = 0;
  /// y [C, D] -> x = T(y) and log|det dT/dy| [C].
  virtual TransformPass forward(const torch::Tensor& y) const = 0;
  /// x [C, D] -> y = T^-1(x) and log|det dT^-1/dx| [C] (= -log|det dT/dy| at y).
  virtual TransformPass inverse(const torch::Tensor& x) const = 0;
  /// Whether log|det dT/dy| is the same at every y (an affine map).
  virtual bool constant_log_det() const = 0;

  /// U(T(y)) [C], less log|det dT/dy| when `jacobian`: one evaluation of `inner`. Default:
  /// forward() then inner.energy.
  virtual torch::Tensor pulled_energy(Target& inner, const torch::Tensor& y, bool jacobian) const;
  /// The same and its gradient in y [C, D] (J^T dU, less grad log|det| when `jacobian`): one
  /// evaluation of `inner` with its gradient. Default: a vector-Jacobian product through
  /// forward()'s graph (differentiable in y when create_graph); a row whose energy gradient is
  /// not finite keeps a NaN gradient (the kernels reject it).
  virtual EnergyGrad pulled_energy_and_grad(Target& inner, const torch::Tensor& y, bool create_graph,
                                            bool jacobian) const;
  /// Positions x [n, D] with energy gradients g = dU(x) as latent pairs (y = T^-1(x),
  /// grad U_y(y) = J^T g - grad log|det dT/dy|) without a target evaluation. Default: one graph
  /// through forward().
  virtual std::pair<torch::Tensor, torch::Tensor> latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const;
  /// The other way: latent positions y with grad U_y(y) = g_y as (x, dU(x)), dU = J^-T (g_y +
  /// grad log|det dT/dy|). Default: graphs through forward() and inverse().
  virtual std::pair<torch::Tensor, torch::Tensor> ambient_pairs(const torch::Tensor& y, const torch::Tensor& g_y) const;
};

/// x = m + L y (Note [Transform]); L is one of
///   identity                      (no factor: x = m + y),
///   diagonal      diag(scale),
///   dense         L0 or L0 M (L0, M lower triangular),
///   low rank      diag(scale) (I + Q diag(exp(t) - 1) Q^T), Q [D, k] orthonormal,
/// and log|det L| is given (a float64 scalar; the caller knows it in its own parametrisation, and
/// the learned sampler's optimiser differentiates through it). The tensors may carry graphs: every
/// operation is differentiable in them. Rows throughout ([C, D]).
class AffineTransform : public Transform {
 public:
  /// x = y (m = 0) in D dimensions, with `options`' dtype.
  static AffineTransform identity(int64_t dim, const torch::TensorOptions& options = torch::kFloat64);
  /// x = m + scale * y, scale [D] > 0.
  static AffineTransform diagonal(torch::Tensor m, torch::Tensor scale, torch::Tensor log_det);
  /// x = m + L0 M y; M may be undefined (L = L0).
  static AffineTransform dense(torch::Tensor m, torch::Tensor l0, torch::Tensor l2, torch::Tensor log_det);
  /// x = m + diag(scale) (I + Q diag(exp(t) - 1) Q^T) y.
  static AffineTransform low_rank(torch::Tensor m, torch::Tensor scale, torch::Tensor q, torch::Tensor t,
                                  torch::Tensor log_det);

  bool is_identity() const { return !scale_.defined() && !l_.defined(); }
  bool is_dense() const { return l_.defined(); }
  bool is_low_rank() const { return q_.defined(); }
  /// m [D]; scale [D] (diagonal, low rank); L0 and M (dense; M may be undefined); Q, t (low rank).
  const torch::Tensor& shift() const { return m_; }
  const torch::Tensor& scale() const { return scale_; }
  const torch::Tensor& l0() const { return l_; }
  const torch::Tensor& l2() const { return l2_; }
  const torch::Tensor& directions() const { return q_; }
  const torch::Tensor& log_eigen() const { return t_; }
  /// log|det L|, a float64 scalar.
  const torch::Tensor& log_det() const { return log_det_; }

  /// y = L^-1 (x - m).
  torch::Tensor to_latent(const torch::Tensor& x) const;
  /// x = m + L y.
  torch::Tensor from_latent(const torch::Tensor& y) const;
  /// L^T g by rows: an energy gradient in x as one in y.
  torch::Tensor latent_grad(const torch::Tensor& g) const;
  /// L^-T g_y by rows: the other way.
  torch::Tensor ambient_grad(const torch::Tensor& g_y) const;
  /// L [D, D] (identity: I; low rank: built column by column from from_latent).
  torch::Tensor matrix() const;

  int64_t dim() const override { return m_.size(0); }
  TransformPass forward(const torch::Tensor& y) const override;
  TransformPass inverse(const torch::Tensor& x) const override;
  bool constant_log_det() const override { return true; }
  torch::Tensor pulled_energy(Target& inner, const torch::Tensor& y, bool jacobian) const override;
  EnergyGrad pulled_energy_and_grad(Target& inner, const torch::Tensor& y, bool create_graph,
                                    bool jacobian) const override;
  std::pair<torch::Tensor, torch::Tensor> latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const override;
  std::pair<torch::Tensor, torch::Tensor> ambient_pairs(const torch::Tensor& y, const torch::Tensor& g_y) const override;

 private:
  AffineTransform() = default;
  /// Low rank: rows y (I + Q diag(exp(sign t) - 1) Q^T).
  torch::Tensor factor(const torch::Tensor& y, double sign) const;
  torch::Tensor m_, scale_, l_, l2_, q_, t_, log_det_;
};

/// Whether a pulled-back target subtracts log|det dT/dy| (Note [Transform]).
enum class Jacobian { kInclude, kOmit };

/// The target pulled back through a transform (Note [Transform]): U_y(y) = U(T(y)) - log|det|
/// (the log-determinant omitted with Jacobian::kOmit). Every evaluation is one (counted)
/// evaluation of the inner target, which must outlive it; the transform must not change while a
/// kernel runs on it.
class TransformedTarget : public Target {
 public:
  /// Throws c10::Error when the dimensions differ, or kOmit with a log|det| that is not constant.
  TransformedTarget(Target& inner, std::shared_ptr<const Transform> transform, Jacobian jacobian = Jacobian::kInclude);
  std::string name() const override { return inner_->name(); }
  int64_t dim() const override { return inner_->dim(); }
  nlohmann::json spec() const override { return inner_->spec(); }
  std::vector<std::string> parameter_names() const override { return inner_->parameter_names(); }
  Target& inner() const { return *inner_; }
  const Transform& transform() const { return *transform_; }
  /// The same transform (and Jacobian rule) over another inner target, e.g. the inner target in
  /// float64; `inner` must outlive the result.
  std::unique_ptr<TransformedTarget> over(Target& inner) const {
    return std::make_unique<TransformedTarget>(inner, transform_, jacobian_ ? Jacobian::kInclude : Jacobian::kOmit);
  }
  /// y [n, D] -> x = T(y) in the inner target's dtype.
  torch::Tensor to_ambient(const torch::Tensor& y) const;
  /// x -> y = T^-1(x) in this target's dtype.
  torch::Tensor to_latent(const torch::Tensor& x) const;
  /// log|det dT/dy| [n] float64 at y.
  torch::Tensor log_det(const torch::Tensor& y) const;
  /// Transform::ambient_pairs: (x, dU(x)) float64 from latent positions and gradients, without a
  /// target evaluation.
  std::pair<torch::Tensor, torch::Tensor> ambient_pairs(const torch::Tensor& y, const torch::Tensor& g_y) const;
  /// Transform::latent_pairs, float64; rows with a non-finite x or g are dropped.
  std::pair<torch::Tensor, torch::Tensor> latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const;

 protected:
  torch::Tensor compute_energy(const torch::Tensor& y) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& y, bool create_graph) const override;

 private:
  Target* inner_;
  std::shared_ptr<const Transform> transform_;
  bool jacobian_;
};

}  // namespace nmcmc
