#pragma once
/// Effective sample size, R-hat and Monte Carlo standard error.
//
// Two conventions, both over draws shaped [S, C, D] (draws, chains, dimensions), float64:
// - paper_ess_ratio: the L2HMC / A-NICE-MC convention that the paper's table uses. Per
//   dimension, autocorrelations are computed with the KNOWN mean and sd,
//   rho_s = mean over chains and over the S - s overlapping pairs of (x_t - mu)(x_{t+s} - mu) / sd^2,
//   summed over lags s = 1, 2, ... up to (not including) the first lag where rho_s < cutoff (0.05);
//   ESS/S = 1 / (1 + 2 sum rho). The autocorrelation is averaged over chains BEFORE the sum
//   (as A-NICE-MC's code does): a per-chain estimate is badly biased for chains that barely move
//   (a chain stuck near the mean shows no correlation at all).
// - Stan / ArviZ (Vehtari, Gelman, Simpson, Carpenter, Buerkner 2021): rank-normalised split
//   bulk-ESS, tail-ESS (min over the 5% and 95% quantile indicators), rank-normalised split
//   R-hat (max of bulk and folded, folded about the median), the MCSE of the mean from the
//   plain split ESS, and the MCSE of the sd as R's posterior package computes it: from the split
//   ESS of the squared centred draws and their fourth moment, sqrt((m4 - m2^2) / ESS / m2 / 4).
// Both compute the autocovariances lazily: the first lags directly, all lags by FFT only when the
// truncation rule needs more than ~100 of them; a parameter's quantiles, median and both rank
// normalisations come from one sort. Long runs (millions of draws per parameter) summarise in
// about a second per parameter.
#include <torch/torch.h>

#include <memory>

namespace nmcmc {

/// ESS / S per dimension [D] (paper convention, see above). mean, sd: [D].
torch::Tensor paper_ess_ratio(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd,
                              double cutoff = 0.05);

/// Per-dimension Stan-convention summary. All fields [D] float64.
struct StanSummary {
  torch::Tensor mean, sd, mcse_mean, mcse_sd, ess_bulk, ess_tail, rhat, q05, q50, q95;
};
/// Buffers stan_summary reuses across calls (a blocked summary of a long run calls it per block).
class SummaryWorkspace {
 public:
  SummaryWorkspace();
  ~SummaryWorkspace();
  struct Buffers;
  std::unique_ptr<Buffers> buffers;
};
StanSummary stan_summary(const torch::Tensor& draws, SummaryWorkspace* workspace = nullptr);

/// Geyer initial-monotone-sequence ESS of one scalar quantity over chains (values [C, S]),
/// as in Stan's / ArviZ's ess; no splitting or rank normalisation.
double ess_geyer(const torch::Tensor& values);
/// Split R-hat of values [C, S] (no rank normalisation).
double split_rhat_plain(const torch::Tensor& values);
/// Splits each chain in two halves: [C, S] -> [2C, floor(S/2)].
torch::Tensor split_chains(const torch::Tensor& values);
/// Rank-normalises all values jointly: Phi^{-1}((rank - 3/8) / (n + 1/4)), average ranks for ties.
torch::Tensor rank_normalise(const torch::Tensor& values);

/// The same quantities computed the plain way over whole tensors (FFT autocovariances, a sort
/// per rank normalisation, torch::quantile): the reference the fast versions above are tested
/// against. Too slow for long runs (~15 s per parameter at 12.8 M draws, against ~1 s).
namespace simple {
torch::Tensor paper_ess_ratio(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd,
                              double cutoff = 0.05);
StanSummary stan_summary(const torch::Tensor& draws);
}  // namespace simple

/// Mean squared jump distance per step: mean over steps and chains of |x_{t+1} - x_t|^2.
double mean_squared_jump(const torch::Tensor& draws);

}  // namespace nmcmc
