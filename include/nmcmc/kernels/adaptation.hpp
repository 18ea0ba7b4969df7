#pragma once
/// Warm-up adaptation: dual averaging of the step size (Hoffman & Gelman 2014, section 3.2)
/// and windowed metric estimation (Stan's schedule): from draws (Stan's diagonal and dense) or
/// from draws and gradients (Note [Metrics from draws and gradients]).
//
// Note [Metrics from draws and gradients]
// Seyboldt, Carlson & Carpenter (arXiv 2603.18845, 2026; nutpie's default) choose the metric that
// minimises the Fisher divergence between the preconditioned posterior and a standard normal,
// estimated from the warm-up window's draws x and gradients g = dU(x). Among diagonal metrics the
// minimiser is closed-form: per coordinate
//   M^{-1}_ii = sigma_i^2 = sqrt(Var x_i / Var g_i)
// (for a Gaussian with covariance Sigma this is sqrt(Sigma_ii / (Sigma^{-1})_ii): Sigma_ii when
// Sigma is diagonal; between the marginal and the conditional variance otherwise). Their low-rank
// estimate (Algorithm 1) then works in the scaled coordinates x~ = (x - mean) / sigma,
// g~ = (g - mean) * sigma: Q, an orthonormal basis [D, m] of the leading left singular vectors
// of x~ and of g~ (at most `max_rank` each); in that subspace the projected covariances
// Cx = P_x^T P_x / n + gamma I and Cg = P_g^T P_g / n + gamma I (gamma keeps both invertible; it
// must be small: for a Gaussian the gradients are exact, g = Sigma^{-1} x, so the estimate is
// exact from draws that have not yet explored the wide directions, and a large gamma would pull
// those towards the draws' own spread: with gamma = 1 NUTS on a 2-d Gaussian of variances 100
// and 0.1 ended its warm-up at 16 and 0.5); the Fisher-optimal Sigma solves Sigma Cg Sigma = Cx,
// the geometric mean
//   Sigma = Cg^{-1/2} (Cg^{1/2} Cx Cg^{1/2})^{1/2} Cg^{-1/2};
// its eigenvectors V with eigenvalues outside [1/c, c] are kept (the others are set to 1), and
//   M^{-1} = S (I + U (Lambda - I) U^T) S,  S = diag(sigma), U = Q V,
// which every metric operation applies in O(D K) (kernels/metric.hpp). Defaults: gamma = 1e-5,
// c = 2, max_rank 10 (as nutpie's). Written from the paper's description (no code was ported).
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "nmcmc/kernels/metric.hpp"

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

// Note [A step size per chain]
// Warm-up adapts one step size for every chain by dual averaging on the chains' mean accept
// statistic; with RunOptions::step_size_per_chain (NUTS only) each chain adapts its own on its own
// statistic, as Stan does (one sampler per chain). The mean is the less noisy input, so the pooled
// averaging ends nearer its target (on a 20-d Gaussian: accept 0.82 at step 0.75, against 0.85 at
// 0.63-0.71 per chain); over posteriordb's 16 small posteriors (NUTS diag, 4 x 1,000, seed 1) it
// gave 1.29x the bulk-ESS per gradient by the geometric mean over the 15 both pass (0.85-2.1x;
// all-in, warm-up counted, 1.25x per gradient and 1.41x per second over 14 of them), and per
// chain low_dim_gauss_mix failed (R-hat 1.53): three chains that began in a flat stretch of the
// components' gap adapted steps of 0.003 there (the pooled step 0.75) and never left it, where a
// pooled step would have left them unable to move and so restarted from a moving chain (Note
// [Stuck chains in warm-up]). On a funnel the per-chain steps are smaller. On Inference Gym's
// Brownian motion (a funnel in the observation noise's scale) over 4 x 20,000 draws the pooled
// step (0.19-0.25) under-samples the neck: both scales' means 5.4-6.7 of their standard errors
// off the ground truth at seeds 1-3, with 8-27 divergent transitions (which the summary warns of,
// naming --target-accept; at 0.95 the pooled step passes, 2.7). Per chain it passed at seed 1
// (2.6) and failed R-hat at seeds 2 and 3 (1.06 and 1.03: one chain's step 5e-4 or 8e-3); Stan's
// own run lands 3 standard errors off at 4 x 10,000. So the pooled step stays the default. The
// step-size search (Stan's heuristic) uses the chains' mean either way: a window's end restarts
// every chain's averaging around it.

/// Dual averaging for a run's chains: one step size for all, fed their mean accept statistic, or
/// one per chain, each fed its own (Note [A step size per chain]).
class ChainsDualAveraging {
 public:
  /// chains: 1 for one step size for all, else the number of chains.
  ChainsDualAveraging(double initial_step, double target_accept, int64_t chains);
  bool per_chain() const { return da_.size() > 1; }
  /// Every chain's averaging restarts around `step`.
  void restart(double step);
  /// Feeds the chains' accept statistics ([C]); returns the step sizes to use next (one, or C).
  std::vector<double> update(const torch::Tensor& accept);
  /// The averaged step sizes to freeze after warm-up (one, or C).
  std::vector<double> final_steps() const;

 private:
  std::vector<DualAveraging> da_;
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
  /// The population variance (sum of squared deviations / n).
  torch::Tensor population_variance() const;
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

/// The diagonal Fisher estimate: per coordinate sqrt(Var x / Var g) from the draws x and
/// gradients g ([n, D] each, float64; population variances), clamped to [1e-10, 1e10].
torch::Tensor fisher_diagonal(const torch::Tensor& var_x, const torch::Tensor& var_g);

/// Settings of the low-rank estimate (Note [Metrics from draws and gradients]).
struct LowRankOptions {
  int64_t max_rank = 10;   // singular vectors kept from the draws and from the gradients, each
  double gamma = 1e-5;     // regularisation of the projected covariances (+ gamma I)
  double cutoff = 2.0;     // eigenvalues within [1/cutoff, cutoff] are set to 1 (dropped)
};

/// The low-rank-plus-diagonal Fisher estimate from draws x and gradients g ([n, D], n >= 2).
Metric fisher_low_rank(const torch::Tensor& x, const torch::Tensor& g, const LowRankOptions& options = {});

/// What run_sampler's warm-up uses: collects a slow window's draws (and gradients) and turns
/// them into the metric `kind` asks for (not kUnit).
class MetricEstimator {
 public:
  explicit MetricEstimator(MetricAdapt kind, LowRankOptions low_rank = {}, int64_t max_rows = 8192);
  /// Whether the estimate needs the chains' gradients.
  bool needs_gradients() const { return kind_ == MetricAdapt::kFisherDiag || kind_ == MetricAdapt::kFisherLowRank; }
  /// x, grad [C, D] (grad: dU, only when needs_gradients()).
  void add(const torch::Tensor& x, const torch::Tensor& grad);
  /// Draws collected since the last reset (the low-rank estimate keeps the newest max_rows).
  int64_t count() const { return n_; }
  /// The estimate (float64, CPU); needs count() > 1.
  Metric estimate() const;
  void reset();

 private:
  MetricAdapt kind_;
  LowRankOptions low_rank_;
  int64_t max_rows_;
  int64_t n_ = 0;
  VarianceEstimator var_x_, var_g_;
  CovarianceEstimator cov_;
  std::deque<torch::Tensor> xs_, gs_;  // low-rank: the window's rows, [C, D] each
  int64_t rows_ = 0;
};

}  // namespace nmcmc
