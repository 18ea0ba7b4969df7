#include "nmcmc/targets/targets.hpp"

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

EnergyGrad GaussianTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
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
