#include "nmcmc/kernels/adaptation.hpp"

#include <algorithm>
#include <cmath>

namespace nmcmc {

DualAveraging::DualAveraging(double initial_step, double target_accept, double gamma, double t0, double kappa)
    : target_(target_accept), gamma_(gamma), t0_(t0), kappa_(kappa) {
  restart(initial_step);
}

void DualAveraging::restart(double step) {
  mu_ = std::log(10.0 * step);
  log_eps_ = std::log(step);
  log_eps_bar_ = 0.0;
  h_bar_ = 0.0;
  t_ = 0;
}

double DualAveraging::update(double accept_stat) {
  if (!std::isfinite(accept_stat)) accept_stat = 0.0;
  accept_stat = std::min(1.0, accept_stat);
  ++t_;
  const double eta = 1.0 / (static_cast<double>(t_) + t0_);
  h_bar_ = (1.0 - eta) * h_bar_ + eta * (target_ - accept_stat);
  log_eps_ = mu_ - std::sqrt(static_cast<double>(t_)) / gamma_ * h_bar_;
  const double w = std::pow(static_cast<double>(t_), -kappa_);
  log_eps_bar_ = w * log_eps_ + (1.0 - w) * log_eps_bar_;
  return std::exp(log_eps_);
}

double DualAveraging::final_step() const { return t_ == 0 ? std::exp(log_eps_) : std::exp(log_eps_bar_); }
double DualAveraging::current_step() const { return std::exp(log_eps_); }

WarmupSchedule::WarmupSchedule(int64_t warmup, int64_t init_buffer, int64_t term_buffer, int64_t base_window) {
  if (warmup < 20) return;  // too short for any metric adaptation
  if (init_buffer + term_buffer + base_window > warmup) {
    // Stan: 15% / 75% / 10% split for short warm-ups.
    init_buffer = static_cast<int64_t>(0.15 * warmup);
    term_buffer = static_cast<int64_t>(0.1 * warmup);
    base_window = warmup - init_buffer - term_buffer;
  }
  const int64_t end_slow = warmup - term_buffer;
  int64_t begin = init_buffer, size = base_window;
  while (begin < end_slow) {
    int64_t end = begin + size;
    // The last window absorbs what would be too short for the next one.
    if (end + 2 * size > end_slow) end = end_slow;
    windows_.emplace_back(begin, end);
    begin = end;
    size *= 2;
  }
}

bool WarmupSchedule::in_slow_window(int64_t i) const {
  return std::any_of(windows_.begin(), windows_.end(), [i](auto w) { return i >= w.first && i < w.second; });
}

bool WarmupSchedule::ends_window(int64_t i) const {
  return std::any_of(windows_.begin(), windows_.end(), [i](auto w) { return i + 1 == w.second; });
}

void VarianceEstimator::add(const torch::Tensor& x) {
  torch::Tensor x64 = x.detach().to(torch::kFloat64);  // [C, D]
  const int64_t c = x64.size(0);
  torch::Tensor batch_mean = x64.mean(0);
  torch::Tensor batch_m2 = (x64 - batch_mean).pow(2).sum(0);
  if (n_ == 0) {
    mean_ = batch_mean;
    m2_ = batch_m2;
    n_ = c;
    return;
  }
  // Chan et al. parallel update of mean and sum of squared deviations.
  const double n_a = static_cast<double>(n_), n_b = static_cast<double>(c), n = n_a + n_b;
  torch::Tensor delta = batch_mean - mean_;
  mean_ = mean_ + delta * (n_b / n);
  m2_ = m2_ + batch_m2 + delta * delta * (n_a * n_b / n);
  n_ += c;
}

torch::Tensor VarianceEstimator::regularised_variance() const {
  TORCH_CHECK(n_ > 1, "VarianceEstimator needs at least two draws");
  const double n = static_cast<double>(n_);
  torch::Tensor var = m2_ / (n - 1.0);
  return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0));
}

void VarianceEstimator::reset() {
  n_ = 0;
  mean_ = torch::Tensor();
  m2_ = torch::Tensor();
}

void CovarianceEstimator::add(const torch::Tensor& x) {
  torch::Tensor x64 = x.detach().to(torch::kFloat64);  // [C, D]
  const int64_t c = x64.size(0);
  torch::Tensor batch_mean = x64.mean(0);
  torch::Tensor centred = x64 - batch_mean;
  torch::Tensor batch_m2 = torch::matmul(centred.t(), centred);  // [D, D]
  if (n_ == 0) {
    mean_ = batch_mean;
    m2_ = batch_m2;
    n_ = c;
    return;
  }
  const double n_a = static_cast<double>(n_), n_b = static_cast<double>(c), n = n_a + n_b;
  torch::Tensor delta = batch_mean - mean_;
  mean_ = mean_ + delta * (n_b / n);
  m2_ = m2_ + batch_m2 + torch::outer(delta, delta) * (n_a * n_b / n);
  n_ += c;
}

torch::Tensor CovarianceEstimator::regularised_covariance() const {
  TORCH_CHECK(n_ > 1, "CovarianceEstimator needs at least two draws");
  const double n = static_cast<double>(n_);
  torch::Tensor cov = m2_ / (n - 1.0);
  // No more draws than dimensions: S is singular, and Stan's estimate would put a variance of
  // ~1e-3 * 5 / n on every direction the draws missed (NUTS then ran at its tree-depth limit for
  // minutes on an 800-d target with 16 chains). Such a window adapts the diagonal only.
  if (n_ <= cov.size(0)) cov = torch::diag(cov.diagonal());
  return (n / (n + 5.0)) * cov + 1e-3 * (5.0 / (n + 5.0)) * torch::eye(cov.size(0), cov.options());
}

void CovarianceEstimator::reset() {
  n_ = 0;
  mean_ = torch::Tensor();
  m2_ = torch::Tensor();
}

}  // namespace nmcmc
