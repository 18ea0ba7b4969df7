#include "nmcmc/diagnostics/ess.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace nmcmc {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t fft_size(int64_t n) {
  int64_t m = 1;
  while (m < 2 * n) m <<= 1;
  return m;
}

/// Sums over overlapping pairs: out[..., s] = sum_t y[..., t] y[..., t + s], for s = 0..S-1.
torch::Tensor lagged_products(const torch::Tensor& y) {
  const int64_t s = y.size(-1);
  const int64_t m = fft_size(s);
  torch::Tensor f = torch::fft::rfft(y, m);
  torch::Tensor power = torch::real(f * f.conj());
  return torch::fft::irfft(power, m).narrow(-1, 0, s);
}
}  // namespace

torch::Tensor paper_ess_ratio(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd,
                              double cutoff) {
  TORCH_CHECK(draws.dim() == 3, "paper_ess_ratio expects draws [S, C, D]");
  const int64_t s = draws.size(0);
  TORCH_CHECK(s >= 2, "paper_ess_ratio needs at least 2 draws");
  torch::Tensor y = ((draws.to(torch::kFloat64) - mean.to(torch::kFloat64)) / sd.to(torch::kFloat64))
                        .permute({1, 2, 0})
                        .contiguous();  // [C, D, S]
  torch::Tensor pairs = torch::arange(s, 0, -1, torch::kFloat64);        // S - lag
  // Autocorrelation with the known moments, averaged over the S - s pairs and over chains.
  torch::Tensor rho = (lagged_products(y) / pairs).mean(0);               // [D, S]
  torch::Tensor lagged = rho.narrow(-1, 1, s - 1);                         // lags 1..S-1
  // Keep lags before the first one below the cutoff.
  torch::Tensor keep = (lagged >= cutoff).to(torch::kFloat64).cumprod(-1);
  torch::Tensor tau = 1.0 + 2.0 * (lagged * keep).sum(-1);                 // [D]
  return 1.0 / tau;
}

torch::Tensor split_chains(const torch::Tensor& values) {
  const int64_t half = values.size(1) / 2;
  return torch::cat({values.narrow(1, 0, half), values.narrow(1, values.size(1) - half, half)}, 0);
}

torch::Tensor rank_normalise(const torch::Tensor& values) {
  torch::Tensor flat = values.reshape({-1}).to(torch::kFloat64).contiguous();
  const int64_t n = flat.numel();
  auto sorted = std::get<1>(torch::sort(flat, /*stable=*/true, 0, false));
  auto idx = sorted.accessor<int64_t, 1>();
  auto v = flat.accessor<double, 1>();
  std::vector<double> rank(n);
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && v[idx[j + 1]] == v[idx[i]]) ++j;
    const double average = 0.5 * static_cast<double>(i + j) + 1.0;  // 1-based average rank of the tie group
    for (int64_t k = i; k <= j; ++k) rank[idx[k]] = average;
    i = j + 1;
  }
  torch::Tensor r = torch::tensor(rank, torch::kFloat64);
  torch::Tensor u = (r - 0.375) / (static_cast<double>(n) + 0.25);
  return torch::special::ndtri(u).reshape(values.sizes());
}

// Multi-chain ESS as Stan computes it (Stan Reference Manual, "Effective sample size"; Vehtari,
// Gelman, Simpson, Carpenter & Buerkner 2021, eqs. 10-11): rho_t = 1 - (W - mean acov_t) / var+,
// with var+ = (n-1)/n W + B/n (Gelman et al. BDA3 eq. 11.3), truncated by Geyer's (1992, Statistical
// Science 7(4), section 3.3) initial positive sequence and made monotone by his initial monotone
// sequence; tau = -1 + 2 sum rho_t, ESS = C n / tau, with tau >= 1 / log10(C n) as in Stan.
double ess_geyer(const torch::Tensor& values_in) {
  torch::Tensor values = values_in.to(torch::kFloat64);
  const int64_t chains = values.size(0), n = values.size(1);
  if (n < 4) return kNaN;
  torch::Tensor chain_mean = values.mean(1);                                      // [C]
  torch::Tensor acov = lagged_products(values - chain_mean.unsqueeze(1)) / static_cast<double>(n);  // biased
  torch::Tensor mean_acov = acov.mean(0).contiguous();                            // [S]
  auto a = mean_acov.accessor<double, 1>();
  const double nd = static_cast<double>(n);
  const double mean_var = a[0] * nd / (nd - 1.0);
  double var_plus = mean_var * (nd - 1.0) / nd;
  if (chains > 1) var_plus += chain_mean.var(0, /*unbiased=*/true).item<double>();
  if (!(var_plus > 0) || !std::isfinite(var_plus)) return kNaN;
  std::vector<double> rho(n, 0.0);
  rho[0] = 1.0;
  double rho_even = 1.0;
  double rho_odd = 1.0 - (mean_var - a[1]) / var_plus;
  rho[1] = rho_odd;
  int64_t t = 1;
  // Geyer's initial positive sequence (Geyer 1992, 3.3): sum pairs Gamma_k = rho_2k + rho_2k+1
  // while they stay positive.
  while (t < n - 3 && rho_even + rho_odd > 0.0) {
    rho_even = 1.0 - (mean_var - a[t + 1]) / var_plus;
    rho_odd = 1.0 - (mean_var - a[t + 2]) / var_plus;
    if (rho_even + rho_odd >= 0.0) {
      rho[t + 1] = rho_even;
      rho[t + 2] = rho_odd;
    }
    t += 2;
  }
  const int64_t max_t = t - 2;
  if (rho_odd > 0.0 && max_t + 1 < n) rho[max_t + 1] = rho_odd;
  // Geyer's initial monotone sequence: Gamma_k <- min(Gamma_k, Gamma_k-1).
  for (t = 1; t <= max_t - 2; t += 2) {
    if (rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]) {
      rho[t + 1] = 0.5 * (rho[t - 1] + rho[t]);
      rho[t + 2] = rho[t + 1];
    }
  }
  double sum = 0.0;
  for (int64_t k = 0; k <= max_t; ++k) sum += rho[k];
  double tau = -1.0 + 2.0 * sum + (max_t + 1 < n ? rho[max_t + 1] : 0.0);
  const double total = static_cast<double>(chains) * nd;
  tau = std::max(tau, 1.0 / std::log10(total));
  return total / tau;
}

double split_rhat_plain(const torch::Tensor& values_in) {
  torch::Tensor values = values_in.to(torch::kFloat64);
  const double n = static_cast<double>(values.size(1));
  if (values.size(1) < 2 || values.size(0) < 2) return kNaN;
  const double between = n * values.mean(1).var(0, true).item<double>();
  const double within = values.var(1, true).mean().item<double>();
  if (!(within > 0)) return kNaN;
  return std::sqrt((between / n + within * (n - 1.0) / n) / within);
}

namespace {
double rhat_rank(const torch::Tensor& values) {
  torch::Tensor split = split_chains(values);
  const double bulk = split_rhat_plain(rank_normalise(split));
  torch::Tensor folded = (values - values.median()).abs();
  const double tail = split_rhat_plain(rank_normalise(split_chains(folded)));
  if (std::isnan(bulk) || std::isnan(tail)) return kNaN;
  return std::max(bulk, tail);
}

double ess_tail(const torch::Tensor& values, double q05, double q95) {
  const double low = ess_geyer(split_chains((values <= q05).to(torch::kFloat64)));
  const double high = ess_geyer(split_chains((values <= q95).to(torch::kFloat64)));
  if (std::isnan(low) || std::isnan(high)) return kNaN;
  return std::min(low, high);
}
}  // namespace

StanSummary stan_summary(const torch::Tensor& draws) {
  TORCH_CHECK(draws.dim() == 3, "stan_summary expects draws [S, C, D]");
  torch::Tensor d64 = draws.to(torch::kFloat64);
  const int64_t dim = d64.size(2);
  StanSummary out;
  torch::Tensor flat = d64.reshape({-1, dim});  // [S*C, D]
  out.mean = flat.mean(0);
  out.sd = flat.std(0, true);
  torch::Tensor q = torch::quantile(flat, torch::tensor({0.05, 0.5, 0.95}, torch::kFloat64), 0);  // [3, D]
  out.q05 = q[0];
  out.q50 = q[1];
  out.q95 = q[2];
  out.mcse_mean = torch::empty({dim}, torch::kFloat64);
  out.ess_bulk = torch::empty({dim}, torch::kFloat64);
  out.ess_tail = torch::empty({dim}, torch::kFloat64);
  out.rhat = torch::empty({dim}, torch::kFloat64);
  for (int64_t j = 0; j < dim; ++j) {
    torch::Tensor v = d64.select(2, j).t().contiguous();  // [C, S]
    out.ess_bulk[j] = ess_geyer(split_chains(rank_normalise(v)));
    out.ess_tail[j] = ess_tail(v, out.q05[j].item<double>(), out.q95[j].item<double>());
    out.rhat[j] = rhat_rank(v);
    const double ess_mean = ess_geyer(split_chains(v));
    out.mcse_mean[j] = out.sd[j].item<double>() / std::sqrt(ess_mean);
  }
  return out;
}

double mean_squared_jump(const torch::Tensor& draws) {
  if (draws.size(0) < 2) return kNaN;
  torch::Tensor diff = draws.narrow(0, 1, draws.size(0) - 1) - draws.narrow(0, 0, draws.size(0) - 1);
  return diff.to(torch::kFloat64).pow(2).sum(-1).mean().item<double>();
}

}  // namespace nmcmc
