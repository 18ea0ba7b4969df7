#include "nmcmc/core/transform.hpp"

#include <limits>

namespace nmcmc {

namespace {
/// `t` on `like`'s device and in its dtype.
torch::Tensor as(const torch::Tensor& t, const torch::Tensor& like) { return t.to(like.device(), like.scalar_type()); }
}  // namespace

// ------------------------------------------------------------------ Transform's defaults

torch::Tensor Transform::pulled_energy(Target& inner, const torch::Tensor& y, bool jacobian) const {
  torch::NoGradGuard no_grad;
  TransformPass fwd = forward(y);
  torch::Tensor u = as(inner.energy(fwd.out.to(inner.options())), fwd.log_det);
  return (jacobian ? u - fwd.log_det : u).to(inner.options());
}

EnergyGrad Transform::pulled_energy_and_grad(Target& inner, const torch::Tensor& y, bool create_graph,
                                             bool jacobian) const {
  torch::AutoGradMode enable(true);
  if (create_graph) {
    // Training through the gradient: grad U_y = J^T dU(T(y)) - grad log|det| as a differentiable
    // function of y, by one vector-Jacobian product whose vector dU carries its own graph.
    torch::Tensor yl = y.requires_grad() ? y : y.detach().requires_grad_(true);
    TransformPass fwd = forward(yl);
    EnergyGrad eg = inner.energy_and_grad(fwd.out.to(inner.options()), true);
    torch::Tensor g = as(eg.grad, fwd.out);
    // A log|det| that does not depend on y (an affine map; a flow whose parameters are frozen, as
    // training freezes them, and that has no coupling layers) has no graph to differentiate.
    std::vector<torch::Tensor> outs{fwd.out}, vs{g};
    if (jacobian && fwd.log_det.requires_grad()) {
      outs.push_back(fwd.log_det);
      vs.push_back(-torch::ones_like(fwd.log_det));
    }
    torch::Tensor gy = torch::autograd::grad(outs, {yl}, vs, /*retain_graph=*/true, /*create_graph=*/true,
                                             /*allow_unused=*/true)[0];
    if (!gy.defined()) gy = torch::zeros_like(yl);
    torch::Tensor u = as(eg.energy, fwd.log_det);
    if (jacobian) u = u - fwd.log_det;
    return {u.to(inner.options()), gy.to(inner.options())};
  }
  torch::Tensor yl = y.detach().requires_grad_(true);
  TransformPass fwd = forward(yl);
  EnergyGrad eg = inner.energy_and_grad(fwd.out.detach().to(inner.options()), false);
  torch::Tensor g = as(eg.grad, fwd.out);
  // A failed row (NaN) stays NaN; the kernels reject it.
  torch::Tensor s = (fwd.out * g.nan_to_num(0.0, 0.0, 0.0)).sum();
  if (jacobian && fwd.log_det.requires_grad()) s = s - fwd.log_det.sum();
  torch::Tensor gy = torch::autograd::grad({s}, {yl})[0];
  torch::Tensor bad = ~(torch::isfinite(g).all(1));
  gy = gy.masked_fill(bad.unsqueeze(1), std::numeric_limits<double>::quiet_NaN());
  torch::Tensor u = as(eg.energy, fwd.log_det);
  if (jacobian) u = u - fwd.log_det.detach();
  return {u.to(inner.options()), gy.to(inner.options())};
}

std::pair<torch::Tensor, torch::Tensor> Transform::latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const {
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = inverse(x).out;
  }
  torch::AutoGradMode enable(true);
  y = y.detach().requires_grad_(true);
  const TransformPass fwd = forward(y);
  std::vector<torch::Tensor> outs{fwd.out}, vs{g};
  if (fwd.log_det.requires_grad()) {
    outs.push_back(fwd.log_det);
    vs.push_back(-torch::ones_like(fwd.log_det));
  }
  torch::Tensor gy = torch::autograd::grad(outs, {y}, vs, c10::nullopt, false, /*allow_unused=*/true)[0];
  if (!gy.defined()) gy = torch::zeros_like(y);
  return {y.detach(), gy.detach()};
}

std::pair<torch::Tensor, torch::Tensor> Transform::ambient_pairs(const torch::Tensor& y, const torch::Tensor& g_y) const {
  torch::AutoGradMode enable(true);
  torch::Tensor yl = y.detach().requires_grad_(true);
  TransformPass fwd = forward(yl);
  torch::Tensor grad_ld;
  if (fwd.log_det.requires_grad()) {
    grad_ld = torch::autograd::grad({fwd.log_det.sum()}, {yl}, {}, c10::nullopt, false, /*allow_unused=*/true)[0];
  }
  if (!grad_ld.defined()) grad_ld = torch::zeros_like(yl);
  torch::Tensor x = fwd.out.detach().requires_grad_(true);
  torch::Tensor y_back = inverse(x).out;
  torch::Tensor v = as(g_y, yl) + grad_ld;
  torch::Tensor g = torch::autograd::grad({y_back}, {x}, {v})[0];  // J^-T v
  return {x.detach(), g.detach()};
}

// ------------------------------------------------------------------ AffineTransform

AffineTransform AffineTransform::identity(int64_t dim, const torch::TensorOptions& options) {
  AffineTransform a;
  a.m_ = torch::zeros({dim}, options);
  a.log_det_ = torch::zeros({}, torch::kFloat64);
  return a;
}

AffineTransform AffineTransform::diagonal(torch::Tensor m, torch::Tensor scale, torch::Tensor log_det) {
  AffineTransform a;
  a.m_ = std::move(m);
  a.scale_ = std::move(scale);
  a.log_det_ = std::move(log_det);
  return a;
}

AffineTransform AffineTransform::dense(torch::Tensor m, torch::Tensor l0, torch::Tensor l2, torch::Tensor log_det) {
  AffineTransform a;
  a.m_ = std::move(m);
  a.l_ = std::move(l0);
  a.l2_ = std::move(l2);
  a.log_det_ = std::move(log_det);
  return a;
}

AffineTransform AffineTransform::low_rank(torch::Tensor m, torch::Tensor scale, torch::Tensor q, torch::Tensor t,
                                          torch::Tensor log_det) {
  AffineTransform a;
  a.m_ = std::move(m);
  a.scale_ = std::move(scale);
  a.q_ = std::move(q);
  a.t_ = std::move(t);
  a.log_det_ = std::move(log_det);
  return a;
}

torch::Tensor AffineTransform::factor(const torch::Tensor& y, double sign) const {
  return y + (y.matmul(q_) * torch::expm1(sign * t_)).matmul(q_.t());
}

namespace {
torch::Tensor solve_right(const torch::Tensor& a, const torch::Tensor& b) {  // rows solve x A = b
  return torch::linalg_solve_triangular(a, b, /*upper=*/false, /*left=*/false);
}
}  // namespace

torch::Tensor AffineTransform::to_latent(const torch::Tensor& x) const {  // rows solve y L^T = x - m
  if (is_identity()) return x - m_;
  if (is_low_rank()) return factor((x - m_) / scale_, -1.0);
  if (!is_dense()) return (x - m_) / scale_;
  torch::Tensor u = torch::linalg_solve_triangular(l_.t(), x - m_, /*upper=*/true, /*left=*/false);
  return l2_.defined() ? torch::linalg_solve_triangular(l2_.t(), u, /*upper=*/true, /*left=*/false) : u;
}

torch::Tensor AffineTransform::from_latent(const torch::Tensor& y) const {
  if (is_identity()) return m_ + y;
  if (is_low_rank()) return m_ + factor(y, 1.0) * scale_;
  if (!is_dense()) return m_ + y * scale_;
  return m_ + (l2_.defined() ? y.matmul(l2_.t()) : y).matmul(l_.t());
}

torch::Tensor AffineTransform::latent_grad(const torch::Tensor& g) const {  // rows: g L0 M
  if (is_identity()) return g;
  if (is_low_rank()) return factor(g * scale_, 1.0);
  if (!is_dense()) return g * scale_;
  torch::Tensor v = g.matmul(l_);
  return l2_.defined() ? v.matmul(l2_) : v;
}

torch::Tensor AffineTransform::ambient_grad(const torch::Tensor& g_y) const {  // rows solve g L0 M = g_y
  if (is_identity()) return g_y;
  if (is_low_rank()) return factor(g_y, -1.0) / scale_;
  if (!is_dense()) return g_y / scale_;
  return solve_right(l_, l2_.defined() ? solve_right(l2_, g_y) : g_y);
}

torch::Tensor AffineTransform::matrix() const {
  if (is_identity()) return torch::eye(dim(), m_.options());
  if (is_low_rank()) return from_latent(torch::eye(dim(), scale_.options())).sub(m_).t();  // columns L e_i
  if (!is_dense()) return torch::diag_embed(scale_);
  return l2_.defined() ? l_.matmul(l2_) : l_;
}

TransformPass AffineTransform::forward(const torch::Tensor& y) const {
  return {from_latent(y), log_det_.expand({y.size(0)})};
}

TransformPass AffineTransform::inverse(const torch::Tensor& x) const {
  return {to_latent(x), (-log_det_).expand({x.size(0)})};
}

torch::Tensor AffineTransform::pulled_energy(Target& inner, const torch::Tensor& y, bool jacobian) const {
  torch::Tensor u = inner.energy(from_latent(y));
  return jacobian ? (u - log_det_).to(inner.options()) : u;
}

EnergyGrad AffineTransform::pulled_energy_and_grad(Target& inner, const torch::Tensor& y, bool create_graph,
                                                   bool jacobian) const {
  EnergyGrad eg = inner.energy_and_grad(from_latent(y), create_graph);
  torch::Tensor u = jacobian ? (eg.energy - log_det_).to(inner.options()) : eg.energy;
  return {u, latent_grad(eg.grad)};
}

std::pair<torch::Tensor, torch::Tensor> AffineTransform::latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const {
  return {to_latent(x), latent_grad(g)};
}

std::pair<torch::Tensor, torch::Tensor> AffineTransform::ambient_pairs(const torch::Tensor& y,
                                                                       const torch::Tensor& g_y) const {
  return {from_latent(y), ambient_grad(g_y)};
}

// ------------------------------------------------------------------ TransformedTarget

TransformedTarget::TransformedTarget(Target& inner, std::shared_ptr<const Transform> transform, Jacobian jacobian)
    : Target(inner.options()), inner_(&inner), transform_(std::move(transform)), jacobian_(jacobian == Jacobian::kInclude) {
  TORCH_CHECK(transform_, "TransformedTarget: no transform");
  TORCH_CHECK(transform_->dim() == inner.dim(), "TransformedTarget: the transform has dimension ", transform_->dim(),
              ", the target ", inner.dim());
  TORCH_CHECK(jacobian_ || transform_->constant_log_det(),
              "TransformedTarget: the log-determinant may be left out only where it is constant");
}

torch::Tensor TransformedTarget::to_ambient(const torch::Tensor& y) const {
  torch::NoGradGuard no_grad;
  return transform_->forward(y).out.to(inner_->options());
}

torch::Tensor TransformedTarget::to_latent(const torch::Tensor& x) const {
  torch::NoGradGuard no_grad;
  return transform_->inverse(x).out.to(options_);
}

torch::Tensor TransformedTarget::log_det(const torch::Tensor& y) const {
  torch::NoGradGuard no_grad;
  return transform_->forward(y).log_det;
}

std::pair<torch::Tensor, torch::Tensor> TransformedTarget::ambient_pairs(const torch::Tensor& y,
                                                                         const torch::Tensor& g_y) const {
  return transform_->ambient_pairs(y, g_y);
}

std::pair<torch::Tensor, torch::Tensor> TransformedTarget::latent_pairs(const torch::Tensor& x_in,
                                                                        const torch::Tensor& g_in) const {
  torch::Tensor x = x_in.to(torch::kCPU, torch::kFloat64), g = g_in.to(torch::kCPU, torch::kFloat64);
  const torch::Tensor ok = torch::isfinite(x).all(1) & torch::isfinite(g).all(1);
  return transform_->latent_pairs(x.index({ok}), g.index({ok}));
}

torch::Tensor TransformedTarget::compute_energy(const torch::Tensor& y) const {
  return transform_->pulled_energy(*inner_, y, jacobian_);
}

EnergyGrad TransformedTarget::compute_energy_and_grad(const torch::Tensor& y, bool create_graph) const {
  return transform_->pulled_energy_and_grad(*inner_, y, create_graph, jacobian_);
}

}  // namespace nmcmc
