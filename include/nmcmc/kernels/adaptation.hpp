#pragma once
/// Warm-up adaptation: dual averaging of the step size (Hoffman & Gelman 2014, section 3.2)
/// and windowed diagonal mass-matrix estimation (Stan's schedule).
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace nmcmc {

/// Nesterov dual averaging of log step size towards a target mean accept probability: Hoffman &
/// Gelman (2014, JMLR 15), section 3.2.1, eq. (6) and Algorithm 5:
///   H_t = (1 - 1/(t + t0)) H_{t-1} + (delta - alpha_t) / (t + t0),
///   log eps_t = mu - sqrt(t) / gamma * H_t,   log eps~_t = t^-kappa log eps_t + (1 - t^-kappa) log eps~_{t-1},
/// with mu = log(10 eps_0), gamma = 0.05, t0 = 10, kappa = 0.75 (Stan's defaults).
class DualAveraging {
 public:
  DualAveraging(double initial_step, double target_accept, double gamma = 0.05, double t0 = 10.0,
                double kappa = 0.75);
  /// Restarts around `step` (mu = log(10 step)), as Stan does after each mass-matrix window.
  void restart(double step);
  /// Feeds one mean accept statistic; returns the step size to use next.
  double update(double accept_stat);
  /// The averaged step size to freeze after warm-up.
  double final_step() const;
  double current_step() const;

 private:
  double target_, gamma_, t0_, kappa_;
  double mu_ = 0, log_eps_ = 0, log_eps_bar_ = 0, h_bar_ = 0;
  int64_t t_ = 0;
};

/// Stan's windowed warm-up (Stan Reference Manual, "HMC algorithm parameters", automatic
/// parameter tuning): an initial fast buffer (75), doubling slow windows starting at 25, a
/// terminal fast buffer (50); 15 % / 75 % / 10 % for warm-ups shorter than their sum.
class WarmupSchedule {
 public:
  explicit WarmupSchedule(int64_t warmup, int64_t init_buffer = 75, int64_t term_buffer = 50,
                          int64_t base_window = 25);
  /// Whether iteration `i` (0-based) collects draws for the variance estimate.
  bool in_slow_window(int64_t i) const;
  /// Whether iteration `i` ends a slow window (update the metric, restart dual averaging).
  bool ends_window(int64_t i) const;

 private:
  std::vector<std::pair<int64_t, int64_t>> windows_;  // [begin, end) of each slow window
};

/// Accumulates per-coordinate mean and variance of draws over chains (Welford, float64).
class VarianceEstimator {
 public:
  void add(const torch::Tensor& x);  // x [C, D]
  /// Stan's regularised estimate (stan/mcmc/var_adaptation): (n / (n + 5)) var + 1e-3 (5 / (n + 5)),
  /// shrinking the sample variance towards 1e-3 while n is small.
  torch::Tensor regularised_variance() const;
  void reset();
  int64_t count() const { return n_; }

 private:
  int64_t n_ = 0;
  torch::Tensor mean_, m2_;
};

/// Accumulates the mean and covariance of draws over chains (Chan et al.'s parallel update,
/// float64), for dense metric adaptation.
class CovarianceEstimator {
 public:
  void add(const torch::Tensor& x);  // x [C, D]
  /// Stan's regularised estimate (stan/mcmc/covar_adaptation): (n / (n + 5)) S + 1e-3 (5 / (n + 5)) I;
  /// with n <= D draws (S singular) S's diagonal only, a diagonal metric for that window.
  torch::Tensor regularised_covariance() const;
  void reset();
  int64_t count() const { return n_; }

 private:
  int64_t n_ = 0;
  torch::Tensor mean_, m2_;  // [D], [D, D]
};

}  // namespace nmcmc
