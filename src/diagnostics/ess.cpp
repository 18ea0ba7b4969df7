#include "nmcmc/diagnostics/ess.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>
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

/// sum over chains and overlapping pairs of y[c][i] y[c][i + t], computed lazily: the first lags
/// directly (a few passes over the draws), and all lags at once by FFT only when a sequence needs
/// more of them than that would cost. Both ESS conventions stop at the first lags where the
/// autocorrelation dies out, which for a chain that mixes is a few dozen lags, while an FFT of a
/// long run costs as much as ~100 direct lags.
class LaggedSums {
 public:
  LaggedSums(const double* y, int64_t chains, int64_t n) : y_(y), chains_(chains), n_(n) {}
  double operator()(int64_t t) {
    if (t >= static_cast<int64_t>(sums_.size())) extend(t);
    return sums_[t];
  }

 private:
  static constexpr int64_t kDirectLimit = 128;  // beyond this many lags one FFT is cheaper (measured)
  void extend(int64_t t) {
    const int64_t have = static_cast<int64_t>(sums_.size());
    const int64_t want = std::min(n_, std::max<int64_t>({t + 1, 2 * have, 16}));
    if (want > kDirectLimit) {
      torch::Tensor y = torch::from_blob(const_cast<double*>(y_), {chains_, n_}, torch::kFloat64);
      torch::Tensor all = lagged_products(y).sum(0).contiguous();
      sums_.assign(all.data_ptr<double>(), all.data_ptr<double>() + n_);
      return;
    }
    sums_.resize(want, 0.0);
    for (int64_t c = 0; c < chains_; ++c) {
      const double* y = y_ + c * n_;
      // Eight lags per pass: eight independent accumulators over one contiguous sweep.
      int64_t t0 = have;
      for (; t0 + 8 <= want; t0 += 8) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const int64_t full = n_ - (t0 + 7);  // i where all eight lags have a pair
        for (int64_t i = 0; i < full; ++i) {
          const double yi = y[i];
          const double* z = y + i + t0;
          for (int k = 0; k < 8; ++k) acc[k] += yi * z[k];
        }
        for (int k = 0; k < 7; ++k)  // the pairs the shorter lags have beyond `full`
          for (int64_t i = std::max<int64_t>(full, 0); i + t0 + k < n_; ++i) acc[k] += y[i] * y[i + t0 + k];
        for (int k = 0; k < 8; ++k) sums_[t0 + k] += acc[k];
      }
      for (; t0 < want; ++t0) {
        double acc = 0;
        for (int64_t i = 0; i + t0 < n_; ++i) acc += y[i] * y[i + t0];
        sums_[t0] += acc;
      }
    }
  }
  const double* y_;
  int64_t chains_, n_;
  std::vector<double> sums_;
};

/// The multi-chain ESS from the chains' mean autocovariances, step for step as R's posterior
/// package (1.4, `.ess`) computes it (tests/outside/against_posterior.py holds it to that).
/// mean_acov(t): mean over chains of the biased autocovariance at lag t; between: the variance of
/// the chain means (0 for one chain). Fewer than 4 draws per chain: NaN.
double geyer_ess(int64_t chains, int64_t n, const std::function<double(int64_t)>& mean_acov, double between) {
  if (n < 4) return kNaN;
  const double nd = static_cast<double>(n);
  const double mean_var = mean_acov(0) * nd / (nd - 1.0);
  double var_plus = mean_var * (nd - 1.0) / nd + between;
  if (!(var_plus > 0) || !std::isfinite(var_plus)) return kNaN;
  std::vector<double> rho(n, 0.0);
  rho[0] = 1.0;
  double rho_even = 1.0;
  double rho_odd = 1.0 - (mean_var - mean_acov(1)) / var_plus;
  rho[1] = rho_odd;
  // Geyer's initial positive sequence (Geyer 1992, 3.3): sum the pairs Gamma_k = rho_2k + rho_2k+1
  // while they stay positive; `even` is the last even lag looked at.
  int64_t even = 0;
  while (even < n - 5 && rho_even + rho_odd > 0.0) {
    even += 2;
    rho_even = 1.0 - (mean_var - mean_acov(even)) / var_plus;
    rho_odd = 1.0 - (mean_var - mean_acov(even + 1)) / var_plus;
    if (rho_even + rho_odd >= 0.0) {
      rho[even] = rho_even;
      rho[even + 1] = rho_odd;
    }
  }
  // The last even lag stands in for the tail (it lowers the variance for antithetic chains).
  if (rho_even > 0.0) rho[even] = rho_even;
  // Geyer's initial monotone sequence: Gamma_k <- min(Gamma_k, Gamma_k-1).
  for (int64_t t = 2; t <= even - 2; t += 2) {
    if (rho[t] + rho[t + 1] > rho[t - 2] + rho[t - 1]) {
      rho[t] = 0.5 * (rho[t - 2] + rho[t - 1]);
      rho[t + 1] = rho[t];
    }
  }
  // (Where no pair was looked at, posterior's sum over lags 1:max_t, R's 1:0, still takes lag 0.)
  double sum = 0.0;
  for (int64_t k = 0; k < std::max<int64_t>(even, 1); ++k) sum += rho[k];
  double tau = -1.0 + 2.0 * sum + rho[even];
  const double total = static_cast<double>(chains) * nd;
  tau = std::max(tau, 1.0 / std::log10(total));
  return total / tau;
}

/// ESS of chains x [chains][n] (contiguous), centred per chain here (in `y`, reused).
double ess_of(const double* x, int64_t chains, int64_t n, std::vector<double>& y) {
  if (n < 4) return kNaN;
  y.assign(x, x + chains * n);
  std::vector<double> means(chains);
  for (int64_t c = 0; c < chains; ++c) {
    double m = 0;
    for (int64_t i = 0; i < n; ++i) m += y[c * n + i];
    m /= static_cast<double>(n);
    means[c] = m;
    for (int64_t i = 0; i < n; ++i) y[c * n + i] -= m;
  }
  double between = 0;
  if (chains > 1) {
    const double grand = std::accumulate(means.begin(), means.end(), 0.0) / static_cast<double>(chains);
    for (double m : means) between += (m - grand) * (m - grand);
    between /= static_cast<double>(chains - 1);
  }
  LaggedSums sums(y.data(), chains, n);
  const double scale = static_cast<double>(chains) * static_cast<double>(n);
  return geyer_ess(chains, n, [&](int64_t t) { return sums(t) / scale; }, between);
}

/// Split R-hat of x [chains][n] (contiguous).
double rhat_of(const double* x, int64_t chains, int64_t n) {
  if (n < 2 || chains < 2) return kNaN;
  const double nd = static_cast<double>(n);
  std::vector<double> means(chains);
  double within = 0;
  for (int64_t c = 0; c < chains; ++c) {
    double m = 0;
    for (int64_t i = 0; i < n; ++i) m += x[c * n + i];
    m /= nd;
    double v = 0;
    for (int64_t i = 0; i < n; ++i) v += (x[c * n + i] - m) * (x[c * n + i] - m);
    means[c] = m;
    within += v / (nd - 1.0);
  }
  within /= static_cast<double>(chains);
  const double grand = std::accumulate(means.begin(), means.end(), 0.0) / static_cast<double>(chains);
  double between = 0;
  for (double m : means) between += (m - grand) * (m - grand);
  between = nd * between / static_cast<double>(chains - 1);
  if (!(within > 0)) return kNaN;
  return std::sqrt((between / nd + within * (nd - 1.0) / nd) / within);
}

/// Linear-interpolation quantile (numpy's / torch's default) of sorted values.
double sorted_quantile(const std::vector<std::pair<double, int64_t>>& sorted, double q) {
  const int64_t n = static_cast<int64_t>(sorted.size());
  const double pos = q * static_cast<double>(n - 1);
  const int64_t lo = static_cast<int64_t>(std::floor(pos));
  const int64_t hi = std::min(lo + 1, n - 1);
  const double w = pos - static_cast<double>(lo), a = sorted[lo].first, b = sorted[hi].first;
  return w < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w);  // torch's lerp
}

struct ParameterSummary {
  double mean, sd, mcse_mean, mcse_sd, ess_bulk, ess_tail, rhat, q05, q50, q95;
};

double ess_of(const double* x, int64_t chains, int64_t n) {
  std::vector<double> y;
  return ess_of(x, chains, n, y);
}
}  // namespace

/// Buffers of about 80 bytes per draw, kept from one parameter to the next: a long run's summary
/// allocated (and the kernel zeroed) them afresh for every parameter.
struct SummaryWorkspace::Buffers {
  std::vector<double> values, centred, split_values, indicator, u, z;
  std::vector<std::pair<double, int64_t>> sorted;
};
SummaryWorkspace::SummaryWorkspace() : buffers(std::make_unique<Buffers>()) {}
SummaryWorkspace::~SummaryWorkspace() = default;

namespace {
/// The Stan summary of one parameter, values v [C][S] (contiguous), from ONE sort: the quantiles
/// and the median are read off it, the bulk ranks are its order, and the ranks of the folded
/// values |v - median| come from merging its two sides outward from the median.
ParameterSummary summarise_parameter(const double* v, int64_t chains, int64_t s, SummaryWorkspace::Buffers& w) {
  const int64_t n = chains * s;
  ParameterSummary out{};
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += v[i];
  mean /= static_cast<double>(n);
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (v[i] - mean) * (v[i] - mean);
  out.mean = mean;
  out.sd = n > 1 ? std::sqrt(ss / static_cast<double>(n - 1)) : kNaN;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) {  // (the kernels reject non-finite states; never sort NaN)
      out.mcse_mean = out.mcse_sd = out.ess_bulk = out.ess_tail = out.rhat = out.q05 = out.q50 = out.q95 = kNaN;
      return out;
    }
  // Split chains: the first and the last `half` draws of each chain; chain c's first half is split
  // chain c, its second half split chain C + c (split_chains' order). An odd S drops the middle
  // draw, marked -1. Each draw is sorted with its split position.
  const int64_t half = s / 2, split_n = 2 * chains * half;
  auto& sorted = w.sorted;
  auto& split_values = w.split_values;
  sorted.resize(n);
  split_values.resize(split_n);
  for (int64_t c = 0; c < chains; ++c)
    for (int64_t t = 0; t < s; ++t) {
      const int64_t j = t < half ? c * half + t : t >= s - half ? (chains + c) * half + (t - (s - half)) : -1;
      const double x = v[c * s + t];
      sorted[c * s + t] = {x, j};
      if (j >= 0) split_values[j] = x;
    }
  std::sort(sorted.begin(), sorted.end());
  out.q05 = sorted_quantile(sorted, 0.05);
  out.q50 = sorted_quantile(sorted, 0.5);
  out.q95 = sorted_quantile(sorted, 0.95);
  const double ess_mean = ess_of(split_values.data(), 2 * chains, half, w.centred);
  out.mcse_mean = out.sd / std::sqrt(ess_mean);
  // Tail ESS: the indicators of the 5% and 95% quantiles.
  auto& indicator = w.indicator;
  indicator.resize(split_n);
  for (int64_t k = 0; k < split_n; ++k) indicator[k] = split_values[k] <= out.q05 ? 1.0 : 0.0;
  const double low = ess_of(indicator.data(), 2 * chains, half, w.centred);
  for (int64_t k = 0; k < split_n; ++k) indicator[k] = split_values[k] <= out.q95 ? 1.0 : 0.0;
  const double high = ess_of(indicator.data(), 2 * chains, half, w.centred);
  out.ess_tail = std::isnan(low) || std::isnan(high) ? kNaN : std::min(low, high);
  // MCSE of the sd (posterior's mcse_sd): the split ESS of the squared centred draws, with the
  // second and fourth central moments over all draws.
  double m2 = 0, m4 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double c2 = (v[i] - mean) * (v[i] - mean);
    m2 += c2;
    m4 += c2 * c2;
  }
  m2 /= static_cast<double>(n);
  m4 /= static_cast<double>(n);
  for (int64_t k = 0; k < split_n; ++k) indicator[k] = (split_values[k] - mean) * (split_values[k] - mean);
  const double ess_square = ess_of(indicator.data(), 2 * chains, half, w.centred);
  out.mcse_sd = std::sqrt((m4 - m2 * m2) / ess_square / m2 / 4.0);
  if (half < 1) {
    out.ess_bulk = out.rhat = kNaN;
    return out;
  }
  // Rank normalisation over the split draws: average ranks of ties, then
  // Phi^-1((r - 3/8) / (n + 1/4)). next() yields (key, split position) in increasing key order.
  auto& u = w.u;
  u.resize(split_n);
  w.z.resize(split_n);
  auto rank_normal = [&](auto&& next) {
    int64_t rank = 0;  // ranks given so far (among split draws)
    std::vector<int64_t> group;
    std::pair<double, int64_t> item = next();
    for (int64_t k = 0; k < n;) {
      const double key = item.first;
      group.clear();
      while (k < n && item.first == key) {
        if (item.second >= 0) group.push_back(item.second);
        if (++k < n) item = next();
      }
      const double average = static_cast<double>(rank) + 0.5 * static_cast<double>(group.size() - 1) + 1.0;
      const double value = (average - 0.375) / (static_cast<double>(split_n) + 0.25);
      for (int64_t j : group) u[j] = value;
      rank += static_cast<int64_t>(group.size());
    }
    torch::Tensor z = torch::from_blob(w.z.data(), {2 * chains, half}, torch::kFloat64);
    torch::special::ndtri_out(z, torch::from_blob(u.data(), {2 * chains, half}, torch::kFloat64));
    return w.z.data();
  };
  int64_t cursor = 0;
  const double* z = rank_normal([&] { return sorted[cursor++]; });
  out.ess_bulk = ess_of(z, 2 * chains, half, w.centred);
  const double rhat_bulk = rhat_of(z, 2 * chains, half);
  // Folded draws |v - median| in increasing order: merge the two sides outward from the median.
  const double median = out.q50;
  int64_t right = std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(median, int64_t{-2})) - sorted.begin();
  int64_t left = right - 1;
  const double* zf = rank_normal([&]() -> std::pair<double, int64_t> {
    const double dr = right < n ? std::abs(sorted[right].first - median) : kNaN;
    const double dl = left >= 0 ? std::abs(sorted[left].first - median) : kNaN;
    if (left < 0 || (right < n && dr <= dl)) return {dr, sorted[right++].second};
    return {dl, sorted[left--].second};
  });
  const double rhat_tail = rhat_of(zf, 2 * chains, half);
  out.rhat = std::isnan(rhat_bulk) || std::isnan(rhat_tail) ? kNaN : std::max(rhat_bulk, rhat_tail);
  return out;
}
}  // namespace

torch::Tensor paper_ess_ratio(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd,
                              double cutoff) {
  TORCH_CHECK(draws.dim() == 3, "paper_ess_ratio expects draws [S, C, D]");
  const int64_t s = draws.size(0), chains = draws.size(1), dim = draws.size(2);
  TORCH_CHECK(s >= 2, "paper_ess_ratio needs at least 2 draws");
  torch::Tensor m64 = mean.to(torch::kFloat64).contiguous(), sd64 = sd.to(torch::kFloat64).contiguous();
  torch::Tensor out = torch::empty({dim}, torch::kFloat64);
  for (int64_t j = 0; j < dim; ++j) {
    // Standardised with the known moments, [C, S].
    torch::Tensor y = ((draws.select(2, j).to(torch::kFloat64) - m64[j]) / sd64[j]).t().contiguous();
    LaggedSums sums(y.data_ptr<double>(), chains, s);
    // Autocorrelation with the known moments, averaged over the S - t pairs and over chains; the
    // lags before the first one below the cutoff are summed.
    double total = 0;
    for (int64_t t = 1; t < s; ++t) {
      const double rho = sums(t) / (static_cast<double>(s - t) * static_cast<double>(chains));
      if (!(rho >= cutoff)) break;
      total += rho;
    }
    out[j] = 1.0 / (1.0 + 2.0 * total);
  }
  return out;
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
double ess_geyer(const torch::Tensor& values) {
  torch::Tensor v = values.to(torch::kFloat64).contiguous();
  return ess_of(v.data_ptr<double>(), v.size(0), v.size(1));
}

double split_rhat_plain(const torch::Tensor& values) {
  torch::Tensor v = values.to(torch::kFloat64).contiguous();
  return rhat_of(v.data_ptr<double>(), v.size(0), v.size(1));
}

StanSummary stan_summary(const torch::Tensor& draws, SummaryWorkspace* workspace) {
  TORCH_CHECK(draws.dim() == 3, "stan_summary expects draws [S, C, D]");
  SummaryWorkspace local;
  SummaryWorkspace::Buffers& w = workspace ? *workspace->buffers : *local.buffers;
  const int64_t s = draws.size(0), chains = draws.size(1), dim = draws.size(2);
  TORCH_CHECK(s >= 1, "stan_summary needs at least one draw");
  StanSummary out;
  for (auto* field : {&out.mean, &out.sd, &out.mcse_mean, &out.mcse_sd, &out.ess_bulk, &out.ess_tail, &out.rhat,
                      &out.q05, &out.q50, &out.q95})
    *field = torch::empty({dim}, torch::kFloat64);
  // (One parameter at a time: on two hardware threads a parallel loop over parameters measured no
  // faster, and it would double the temporaries.)
  for (int64_t j = 0; j < dim; ++j) {
    w.values.resize(chains * s);
    torch::Tensor v = torch::from_blob(w.values.data(), {chains, s}, torch::kFloat64);
    v.copy_(draws.select(2, j).t());  // [C, S]
    const ParameterSummary p = summarise_parameter(w.values.data(), chains, s, w);
    out.mean[j] = p.mean;
    out.sd[j] = p.sd;
    out.mcse_mean[j] = p.mcse_mean;
    out.mcse_sd[j] = p.mcse_sd;
    out.ess_bulk[j] = p.ess_bulk;
    out.ess_tail[j] = p.ess_tail;
    out.rhat[j] = p.rhat;
    out.q05[j] = p.q05;
    out.q50[j] = p.q50;
    out.q95[j] = p.q95;
  }
  return out;
}

double mean_squared_jump(const torch::Tensor& draws) {
  if (draws.size(0) < 2) return kNaN;
  torch::Tensor diff = draws.narrow(0, 1, draws.size(0) - 1) - draws.narrow(0, 0, draws.size(0) - 1);
  return diff.to(torch::kFloat64).pow(2).sum(-1).mean().item<double>();
}

// ---------------------------------------------------------------------------------------------
// Whole-tensor implementations, kept as the reference the fast ones are tested against.
namespace simple {
namespace {
double ess_fft(const torch::Tensor& values_in) {
  torch::Tensor values = values_in.to(torch::kFloat64);
  const int64_t chains = values.size(0), n = values.size(1);
  if (n < 4) return kNaN;
  torch::Tensor chain_mean = values.mean(1);
  torch::Tensor acov = lagged_products(values - chain_mean.unsqueeze(1)) / static_cast<double>(n);
  torch::Tensor mean_acov = acov.mean(0).contiguous();
  const double* a = mean_acov.data_ptr<double>();
  const double between = chains > 1 ? chain_mean.var(0, /*unbiased=*/true).item<double>() : 0.0;
  return geyer_ess(chains, n, [&](int64_t t) { return a[t]; }, between);
}

double rhat_plain(const torch::Tensor& values_in) {
  torch::Tensor values = values_in.to(torch::kFloat64);
  const double n = static_cast<double>(values.size(1));
  if (values.size(1) < 2 || values.size(0) < 2) return kNaN;
  const double between = n * values.mean(1).var(0, true).item<double>();
  const double within = values.var(1, true).mean().item<double>();
  if (!(within > 0)) return kNaN;
  return std::sqrt((between / n + within * (n - 1.0) / n) / within);
}
}  // namespace

torch::Tensor paper_ess_ratio(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd,
                              double cutoff) {
  const int64_t s = draws.size(0);
  torch::Tensor y = ((draws.to(torch::kFloat64) - mean.to(torch::kFloat64)) / sd.to(torch::kFloat64))
                        .permute({1, 2, 0})
                        .contiguous();                                   // [C, D, S]
  torch::Tensor pairs = torch::arange(s, 0, -1, torch::kFloat64);        // S - lag
  torch::Tensor rho = (lagged_products(y) / pairs).mean(0);               // [D, S]
  torch::Tensor lagged = rho.narrow(-1, 1, s - 1);                         // lags 1..S-1
  torch::Tensor keep = (lagged >= cutoff).to(torch::kFloat64).cumprod(-1);
  torch::Tensor tau = 1.0 + 2.0 * (lagged * keep).sum(-1);
  return 1.0 / tau;
}

StanSummary stan_summary(const torch::Tensor& draws) {
  torch::Tensor d64 = draws.to(torch::kFloat64);
  const int64_t dim = d64.size(2);
  StanSummary out;
  torch::Tensor flat = d64.reshape({-1, dim});
  out.mean = flat.mean(0);
  out.sd = flat.std(0, true);
  torch::Tensor q = torch::quantile(flat, torch::tensor({0.05, 0.5, 0.95}, torch::kFloat64), 0);
  out.q05 = q[0];
  out.q50 = q[1];
  out.q95 = q[2];
  for (auto* field : {&out.mcse_mean, &out.mcse_sd, &out.ess_bulk, &out.ess_tail, &out.rhat})
    *field = torch::empty({dim}, torch::kFloat64);
  for (int64_t j = 0; j < dim; ++j) {
    torch::Tensor v = d64.select(2, j).t().contiguous();  // [C, S]
    out.ess_bulk[j] = ess_fft(rank_normalise(split_chains(v)));  // split, then rank (as ArviZ / posterior)
    const double low = ess_fft(split_chains((v <= out.q05[j].item<double>()).to(torch::kFloat64)));
    const double high = ess_fft(split_chains((v <= out.q95[j].item<double>()).to(torch::kFloat64)));
    out.ess_tail[j] = std::isnan(low) || std::isnan(high) ? kNaN : std::min(low, high);
    torch::Tensor split = split_chains(v);
    const double bulk = rhat_plain(rank_normalise(split));
    const double tail = rhat_plain(rank_normalise(split_chains((v - out.q50[j].item<double>()).abs())));
    out.rhat[j] = std::isnan(bulk) || std::isnan(tail) ? kNaN : std::max(bulk, tail);
    out.mcse_mean[j] = out.sd[j].item<double>() / std::sqrt(ess_fft(split));
    torch::Tensor centred2 = (v - v.mean()).pow(2);  // [C, S]
    const double m2 = centred2.mean().item<double>(), m4 = centred2.pow(2).mean().item<double>();
    out.mcse_sd[j] = std::sqrt((m4 - m2 * m2) / ess_fft(split_chains(centred2)) / m2 / 4.0);
  }
  return out;
}
}  // namespace simple

}  // namespace nmcmc
