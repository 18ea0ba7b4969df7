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

ChainsDualAveraging::ChainsDualAveraging(double initial_step, double target_accept, int64_t chains)
    : da_(static_cast<size_t>(std::max<int64_t>(chains, 1)), DualAveraging(initial_step, target_accept)) {}

void ChainsDualAveraging::restart(double step) {
  for (DualAveraging& d : da_) d.restart(step);
}

std::vector<double> ChainsDualAveraging::update(const torch::Tensor& accept) {
  if (!per_chain()) return {da_[0].update(accept.mean().item<double>())};
  const torch::Tensor a = accept.detach().to(torch::kCPU, torch::kFloat64).reshape({-1}).contiguous();
  TORCH_CHECK(a.numel() == static_cast<int64_t>(da_.size()), "step-size adaptation: ", a.numel(),
              " accept statistics for ", da_.size(), " chains");
  std::vector<double> out(da_.size());
  for (size_t c = 0; c < da_.size(); ++c) out[c] = da_[c].update(a.data_ptr<double>()[c]);
  return out;
}

std::vector<double> ChainsDualAveraging::final_steps() const {
  std::vector<double> out;
  for (const DualAveraging& d : da_) out.push_back(d.final_step());
  return out;
}

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

namespace {
/// Merges a batch of `c` points (its mean and sum of squared deviations, or of their outer
/// products) into the running ones: Chan et al.'s parallel update. `cross` is delta's square, or
/// its outer product, for the batch's mean minus the running mean `delta`.
template <typename Cross>
void merge_moments(torch::Tensor& mean, torch::Tensor& m2, int64_t& count, const torch::Tensor& batch_mean,
                   const torch::Tensor& batch_m2, int64_t c, Cross cross) {
  if (count == 0) {
    mean = batch_mean;
    m2 = batch_m2;
    count = c;
    return;
  }
  const double n_a = static_cast<double>(count), n_b = static_cast<double>(c), n = n_a + n_b;
  torch::Tensor delta = batch_mean - mean;
  mean = mean + delta * (n_b / n);
  m2 = m2 + batch_m2 + cross(delta) * (n_a * n_b / n);
  count += c;
}
}  // namespace

void VarianceEstimator::add(const torch::Tensor& x) {
  torch::Tensor x64 = x.detach().to(torch::kFloat64);  // [C, D]
  const int64_t c = x64.size(0);
  torch::Tensor batch_mean = x64.mean(0);
  torch::Tensor batch_m2 = (x64 - batch_mean).pow(2).sum(0);
  merge_moments(mean_, m2_, n_, batch_mean, batch_m2, c, [](const torch::Tensor& d) { return d * d; });
}

torch::Tensor VarianceEstimator::regularised_variance() const {
  TORCH_CHECK(n_ > 1, "VarianceEstimator needs at least two draws");
  const double n = static_cast<double>(n_);
  torch::Tensor var = m2_ / (n - 1.0);
  return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0));
}

torch::Tensor VarianceEstimator::population_variance() const {
  TORCH_CHECK(n_ > 0, "VarianceEstimator has no draws");
  return m2_ / static_cast<double>(n_);
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
  merge_moments(mean_, m2_, n_, batch_mean, batch_m2, c, [](const torch::Tensor& d) { return torch::outer(d, d); });
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

torch::Tensor fisher_diagonal(const torch::Tensor& var_x, const torch::Tensor& var_g) {
  // A coordinate whose gradient never varied (or whose draws never moved) has no scale to learn:
  // the clamp keeps the metric finite and positive (nutpie clips likewise).
  torch::Tensor r = (var_x / var_g).sqrt();
  r = torch::where(torch::isfinite(r), r, torch::ones_like(r));
  return r.clamp(1e-10, 1e10);
}

namespace {

/// A^{power} for a symmetric positive definite A [m, m] (eigendecomposition).
torch::Tensor spd_power(const torch::Tensor& a, double power) {
  auto [w, v] = torch::linalg_eigh(0.5 * (a + a.t()), "L");
  return torch::matmul(v * w.clamp_min(1e-300).pow(power), v.t());
}

/// The leading left singular vectors [D, <= k] of the rows of y [n, D] (as columns), dropping
/// those of (numerically) zero singular value.
torch::Tensor leading_directions(const torch::Tensor& y, int64_t k) {
  auto [u, s, vh] = torch::linalg_svd(y.t(), /*full_matrices=*/false, c10::nullopt);  // u [D, r]
  const double top = s.numel() > 0 ? s.max().item<double>() : 0.0;
  const int64_t keep = std::min<int64_t>(k, (s > 1e-10 * top).sum().item<int64_t>());
  return u.narrow(1, 0, top > 0 ? keep : 0);
}

Metric low_rank_part(const torch::Tensor& xs, const torch::Tensor& gs, const torch::Tensor& scale2, double n,
                     const LowRankOptions& o);

}  // namespace

Metric fisher_low_rank(const torch::Tensor& x, const torch::Tensor& g, const LowRankOptions& o) {
  TORCH_CHECK(x.dim() == 2 && x.sizes() == g.sizes() && x.size(0) >= 2, "fisher_low_rank: x and g are [n, D], n >= 2");
  TORCH_CHECK(o.max_rank >= 0 && o.gamma > 0 && o.cutoff >= 1, "fisher_low_rank: max_rank >= 0, gamma > 0, cutoff >= 1");
  const torch::Tensor x64 = x.detach().to(torch::kFloat64).cpu();
  const torch::Tensor g64 = g.detach().to(torch::kFloat64).cpu();
  const double n = static_cast<double>(x64.size(0));
  const int64_t d = x64.size(1);
  const torch::Tensor xc = x64 - x64.mean(0), gc = g64 - g64.mean(0);  // [n, D]
  const torch::Tensor scale2 = fisher_diagonal(xc.pow(2).mean(0), gc.pow(2).mean(0));  // sigma^2 [D]
  const torch::Tensor sigma = scale2.sqrt();
  const torch::Tensor xs = xc / sigma, gs = gc * sigma;  // the scaled coordinates
  const Metric diagonal_only = Metric::low_rank(scale2, torch::zeros({d, 0}, scale2.options()), torch::zeros({0}, scale2.options()));
  // Draws or gradients so large that their products overflow (a chain far out in a recursion's
  // tail) leave no low-rank part to estimate: the diagonal alone, rather than a LAPACK failure.
  if (!torch::isfinite(xs).all().item<bool>() || !torch::isfinite(gs).all().item<bool>() ||
      !torch::isfinite(xs.square().sum()).item<bool>() || !torch::isfinite(gs.square().sum()).item<bool>()) {
    return diagonal_only;
  }
  try {
    return low_rank_part(xs, gs, scale2, n, o);
  } catch (const c10::Error&) {  // an eigendecomposition or SVD that did not converge
    return diagonal_only;
  }
}

namespace {
Metric low_rank_part(const torch::Tensor& xs, const torch::Tensor& gs, const torch::Tensor& scale2, double n,
                     const LowRankOptions& o) {
  const torch::Tensor both = torch::cat({leading_directions(xs, o.max_rank), leading_directions(gs, o.max_rank)}, 1);
  const int64_t d = xs.size(1);
  if (both.size(1) == 0) return Metric::low_rank(scale2, torch::zeros({d, 0}, scale2.options()), torch::zeros({0}, scale2.options()));
  const torch::Tensor q = std::get<0>(torch::linalg_qr(both, "reduced"));  // [D, m] orthonormal
  const torch::Tensor px = torch::matmul(xs, q), pg = torch::matmul(gs, q);  // [n, m]
  const torch::Tensor eye = torch::eye(q.size(1), q.options());
  const torch::Tensor cx = torch::matmul(px.t(), px) / n + o.gamma * eye;
  const torch::Tensor cg = torch::matmul(pg.t(), pg) / n + o.gamma * eye;
  // the geometric mean: Sigma Cg Sigma = Cx
  const torch::Tensor cg_half = spd_power(cg, 0.5), cg_inv_half = spd_power(cg, -0.5);
  const torch::Tensor mean = torch::matmul(torch::matmul(cg_inv_half, spd_power(torch::matmul(torch::matmul(cg_half, cx), cg_half), 0.5)),
                                           cg_inv_half);
  auto [lambda, v] = torch::linalg_eigh(0.5 * (mean + mean.t()), "L");
  const torch::Tensor keep = ((lambda > o.cutoff) | (lambda < 1.0 / o.cutoff)).nonzero().reshape({-1});
  return Metric::low_rank(scale2, torch::matmul(q, v.index_select(1, keep)), lambda.index_select(0, keep));
}
}  // namespace

MetricEstimator::MetricEstimator(MetricAdapt kind, LowRankOptions low_rank, int64_t max_rows)
    : kind_(kind), low_rank_(low_rank), max_rows_(max_rows) {
  TORCH_CHECK(kind != MetricAdapt::kUnit, "MetricEstimator: the unit metric has nothing to estimate");
}

void MetricEstimator::add(const torch::Tensor& x, const torch::Tensor& grad) {
  if (needs_gradients()) {
    TORCH_CHECK(grad.defined() && grad.sizes() == x.sizes(), "metric ", enum_name(kind_), " needs the chains' gradients");
  }
  n_ += x.size(0);
  switch (kind_) {
    case MetricAdapt::kUnit: break;
    case MetricAdapt::kDiag: var_x_.add(x); break;
    case MetricAdapt::kDense: cov_.add(x); break;
    case MetricAdapt::kFisherDiag:
      var_x_.add(x);
      var_g_.add(grad);
      break;
    case MetricAdapt::kFisherLowRank:
      xs_.push_back(x.detach().to(torch::kFloat64).cpu());
      gs_.push_back(grad.detach().to(torch::kFloat64).cpu());
      rows_ += x.size(0);
      while (rows_ - xs_.front().size(0) >= max_rows_) {  // keep the newest max_rows (at least)
        rows_ -= xs_.front().size(0);
        xs_.pop_front();
        gs_.pop_front();
      }
      break;
  }
}

Metric MetricEstimator::estimate() const {
  TORCH_CHECK(n_ > 1, "MetricEstimator needs at least two draws");
  switch (kind_) {
    case MetricAdapt::kUnit: return Metric();
    case MetricAdapt::kDiag: return Metric(var_x_.regularised_variance());
    case MetricAdapt::kDense: return Metric(cov_.regularised_covariance());
    case MetricAdapt::kFisherDiag: return Metric(fisher_diagonal(var_x_.population_variance(), var_g_.population_variance()));
    case MetricAdapt::kFisherLowRank:
      return fisher_low_rank(torch::cat(std::vector<torch::Tensor>(xs_.begin(), xs_.end())),
                             torch::cat(std::vector<torch::Tensor>(gs_.begin(), gs_.end())), low_rank_);
  }
  return Metric();
}

void MetricEstimator::reset() {
  n_ = 0;
  rows_ = 0;
  var_x_.reset();
  var_g_.reset();
  cov_.reset();
  xs_.clear();
  gs_.clear();
}

}  // namespace nmcmc
