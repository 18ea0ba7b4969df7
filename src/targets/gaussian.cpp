#include "nmcmc/targets/targets.hpp"
#include "row_loop.hpp"

namespace nmcmc {

GaussianTarget::GaussianTarget(std::string name, nlohmann::json spec, torch::Tensor variances, torch::Tensor rotation,
                               torch::Tensor mean, torch::TensorOptions options)
    : Target(options), name_(std::move(name)), spec_(std::move(spec)) {
  var64_ = variances.to(torch::kFloat64).contiguous();
  dim_ = var64_.size(0);
  TORCH_CHECK(var64_.dim() == 1 && (var64_ > 0).all().item<bool>(), "Gaussian variances must be a positive vector");
  rot64_ = rotation.defined() ? rotation.to(torch::kFloat64).contiguous() : torch::Tensor();
  mean64_ = mean.defined() ? mean.to(torch::kFloat64).contiguous() : torch::zeros({dim_}, torch::kFloat64);
  sd_ = var64_.sqrt().to(options);
  inv_sd_ = var64_.rsqrt().to(options);
  mean_ = mean64_.to(options);
  if (rot64_.defined()) {
    rot_ = rot64_.to(options);
    rot_t_ = rot64_.t().contiguous().to(options);
  }
}

torch::Tensor GaussianTarget::whiten(const torch::Tensor& x) const {
  torch::Tensor centred = x - mean_;  // [C, D]
  if (rot_.defined()) centred = torch::matmul(centred, rot_);
  return centred * inv_sd_;
}

torch::Tensor GaussianTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor w = whiten(x);
  return 0.5 * (w * w).sum(1);
}

namespace {
/// U and dU of an axis-aligned Gaussian row by row (Note [The funnel's rows]): each row in
/// float64, rounded once to the batch's dtype.
template <typename T>
EnergyGrad axis_gaussian_rows(const torch::Tensor& x, const torch::Tensor& mean64, const torch::Tensor& var64) {
  const int64_t c = x.size(0), d = x.size(1);
  torch::Tensor u = torch::empty({c}, x.options()), g = torch::empty({c, d}, x.options());
  const T* xs = x.data_ptr<T>();
  const double* mu = mean64.data_ptr<double>();
  const double* var = var64.data_ptr<double>();
  T* us = u.data_ptr<T>();
  T* gs = g.data_ptr<T>();
  for (int64_t i = 0; i < c; ++i) {
    const T* row = xs + i * d;
    T* grow = gs + i * d;
    double two_u = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double centred = static_cast<double>(row[j]) - mu[j], gj = centred / var[j];
      two_u += centred * gj;
      grow[j] = static_cast<T>(gj);
    }
    us[i] = static_cast<T>(0.5 * two_u);
  }
  return {u, g};
}
}  // namespace

EnergyGrad GaussianTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  if (!rot_.defined()) {
    if (auto eg = detail::on_rows(x, create_graph, dim_, [&](auto t) {
          return axis_gaussian_rows<typename decltype(t)::type>(x, mean64_, var64_);
        })) {
      return *eg;
    }
  }
  torch::AutoGradMode mode(create_graph);
  torch::Tensor w = whiten(x);                 // [C, D]
  torch::Tensor g = w * inv_sd_;               // Sigma^{-1}(x - mu) in the eigenbasis
  if (rot_.defined()) g = torch::matmul(g, rot_t_);
  return {0.5 * (w * w).sum(1), g};
}

torch::Tensor GaussianTarget::sample(int64_t n, at::Generator& gen) const {
  torch::NoGradGuard no_grad;
  torch::Tensor z = torch::randn({n, dim_}, gen, options_) * sd_;
  if (rot_.defined()) z = torch::matmul(z, rot_t_);
  return z + mean_;
}

std::optional<Moments> GaussianTarget::reference_moments() const {
  torch::Tensor cov = covariance();
  return Moments{mean64_.clone(), cov.diagonal().sqrt()};
}

torch::Tensor GaussianTarget::covariance() const {
  if (!rot64_.defined()) return torch::diag(var64_);
  return torch::matmul(rot64_ * var64_, rot64_.t());
}

}  // namespace nmcmc
