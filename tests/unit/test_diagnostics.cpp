// ESS, R-hat and friends: AR(1) chains with analytic values, hand-computed cases, and a direct
// (non-FFT) re-implementation of the paper's estimator.
#include <gtest/gtest.h>

#include <cmath>

#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
namespace {

/// AR(1) chains x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t started in stationarity: [S, C, 1].
torch::Tensor ar1(double phi, int64_t steps, int64_t chains, uint64_t seed) {
  at::Generator gen = make_generator(seed);
  torch::Tensor e = torch::randn({steps, chains}, gen, kF64);
  torch::Tensor x = torch::empty({steps, chains}, kF64);
  x[0] = e[0];
  const double s = std::sqrt(1 - phi * phi);
  auto xa = x.accessor<double, 2>();
  auto ea = e.accessor<double, 2>();
  for (int64_t t = 1; t < steps; ++t)
    for (int64_t c = 0; c < chains; ++c) xa[t][c] = phi * xa[t - 1][c] + s * ea[t][c];
  return x.unsqueeze(2);
}

/// The paper's estimator's expectation for AR(1): autocorrelations phi^s summed while >= 0.05.
double truncated_ar1_ratio(double phi) {
  double sum = 0, r = phi;
  while (r >= 0.05) {
    sum += r;
    r *= phi;
  }
  return 1.0 / (1.0 + 2.0 * sum);
}
}  // namespace

TEST(PaperEss, MatchesAr1AnalyticValue) {
  for (auto [phi, steps] : {std::pair{0.5, 5000}, std::pair{0.9, 20000}}) {
    torch::Tensor x = ar1(phi, steps, 100, 31);
    const double ratio =
        paper_ess_ratio(x, torch::zeros({1}, kF64), torch::ones({1}, kF64)).item<double>();
    EXPECT_NEAR(ratio / truncated_ar1_ratio(phi), 1.0, 0.05) << "phi " << phi << " ratio " << ratio;
  }
}

TEST(PaperEss, FftAgreesWithDirectSums) {
  at::Generator gen = make_generator(8);
  torch::Tensor x = torch::randn({60, 3, 2}, gen, kF64).cumsum(0) * 0.3;  // strongly correlated
  torch::Tensor mean = torch::tensor({0.1, -0.2}, kF64), sd = torch::tensor({1.3, 0.7}, kF64);
  torch::Tensor fast = paper_ess_ratio(x, mean, sd);
  for (int64_t d = 0; d < 2; ++d) {
    std::vector<std::vector<double>> y(3, std::vector<double>(60));
    for (int64_t c = 0; c < 3; ++c)
      for (int t = 0; t < 60; ++t) y[c][t] = (x[t][c][d].item<double>() - mean[d].item<double>()) / sd[d].item<double>();
    double sum = 0;
    for (int s = 1; s < 60; ++s) {
      double r = 0;
      for (int64_t c = 0; c < 3; ++c)
        for (int t = 0; t + s < 60; ++t) r += y[c][t] * y[c][t + s] / (60 - s) / 3.0;
      if (r < 0.05) break;
      sum += r;
    }
    EXPECT_NEAR(fast[d].item<double>(), 1.0 / (1.0 + 2.0 * sum), 1e-12);
  }
}

TEST(PaperEss, StuckChainsHaveLowEss) {
  // Chains that never move: each sits at an exact draw. Averaging the autocorrelation over chains
  // first gives rho ~= 1 at every lag, so ESS/S is ~1/S, not ~1.
  at::Generator gen = make_generator(4);
  torch::Tensor start = torch::randn({1, 500, 1}, gen, kF64);
  torch::Tensor x = start.expand({200, 500, 1}).contiguous();
  EXPECT_LT(paper_ess_ratio(x, torch::zeros({1}, kF64), torch::ones({1}, kF64)).item<double>(), 0.01);
}

TEST(StanEss, Ar1AndIndependentDraws) {
  torch::Tensor x = ar1(0.5, 5000, 4, 12).squeeze(2).t();  // [C, S]
  const double expected = 4 * 5000 * (1 - 0.5) / (1 + 0.5);
  EXPECT_NEAR(ess_geyer(x) / expected, 1.0, 0.1);
  at::Generator gen = make_generator(13);
  torch::Tensor iid = torch::randn({4, 5000}, gen, kF64);
  EXPECT_NEAR(ess_geyer(iid) / 20000.0, 1.0, 0.1);
  // Antithetic chains have ESS above N; it is capped only by the log10 rule.
  torch::Tensor alternating = ar1(-0.5, 5000, 4, 14).squeeze(2).t();
  EXPECT_GT(ess_geyer(alternating), 20000.0);
  // Constant values have no ESS.
  EXPECT_TRUE(std::isnan(ess_geyer(torch::ones({2, 100}, kF64))));
}

TEST(StanEss, HandComputedRhatAndRanks) {
  torch::Tensor v = torch::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}, kF64).reshape({2, 4});
  // Chain means 2.5, 6.5; within-chain variances 5/3; B = 4 * 8 = 32;
  // var+ = (3/4)(5/3) + 32/4 = 9.25; R-hat = sqrt(9.25 / (5/3)).
  EXPECT_NEAR(split_rhat_plain(v), std::sqrt(9.25 / (5.0 / 3.0)), 1e-12);
  torch::Tensor split = split_chains(v);
  EXPECT_TRUE(torch::equal(split, torch::tensor({1.0, 2.0, 5.0, 6.0, 3.0, 4.0, 7.0, 8.0}, kF64).reshape({4, 2})));
  // Ranks with ties: [3, 1, 2, 2] -> [4, 1, 2.5, 2.5].
  torch::Tensor z = rank_normalise(torch::tensor({3.0, 1.0, 2.0, 2.0}, kF64));
  torch::Tensor ranks = torch::special::ndtr(z) * 4.25 + 0.375;
  EXPECT_TRUE(torch::allclose(ranks, torch::tensor({4.0, 1.0, 2.5, 2.5}, kF64), 0, 1e-9));
  // Identical chains: R-hat near 1; shifted chains: R-hat well above 1.01.
  at::Generator gen = make_generator(3);
  torch::Tensor good = torch::randn({4, 1000, 1}, gen, kF64).permute({1, 0, 2});
  EXPECT_LT(stan_summary(good).rhat[0].item<double>(), 1.01);
  torch::Tensor bad = good + torch::tensor({0.0, 0.0, 0.0, 1.0}, kF64).reshape({1, 4, 1});
  EXPECT_GT(stan_summary(bad).rhat[0].item<double>(), 1.05);
}

TEST(StanEss, SummaryOfIndependentNormals) {
  at::Generator gen = make_generator(21);
  torch::Tensor x = torch::randn({1000, 4, 3}, gen, kF64) * torch::tensor({1.0, 2.0, 0.5}, kF64);
  StanSummary s = stan_summary(x);
  for (int d = 0; d < 3; ++d) {
    EXPECT_NEAR(s.ess_bulk[d].item<double>() / 4000.0, 1.0, 0.12);
    EXPECT_NEAR(s.ess_tail[d].item<double>() / 4000.0, 1.0, 0.25);
    EXPECT_NEAR(s.mcse_mean[d].item<double>(), s.sd[d].item<double>() / std::sqrt(4000.0), 0.1 * s.sd[d].item<double>() / 60);
  }
}

TEST(Jumps, MeanSquaredJumpByHand) {
  // One chain, steps (0,0) -> (1,0) -> (1,2): jumps 1 and 4, mean 2.5.
  torch::Tensor x = torch::tensor({0.0, 0.0, 1.0, 0.0, 1.0, 2.0}, kF64).reshape({3, 1, 2});
  EXPECT_DOUBLE_EQ(mean_squared_jump(x), 2.5);
}

namespace {
void expect_summaries_agree(const torch::Tensor& x, const char* what) {
  SCOPED_TRACE(what);
  StanSummary fast = stan_summary(x), ref = simple::stan_summary(x);
  for (auto field : {&StanSummary::mean, &StanSummary::sd, &StanSummary::mcse_mean, &StanSummary::ess_bulk,
                     &StanSummary::ess_tail, &StanSummary::rhat, &StanSummary::q05, &StanSummary::q50, &StanSummary::q95}) {
    EXPECT_TRUE(torch::allclose(fast.*field, ref.*field, 1e-9, 1e-12, /*equal_nan=*/true))
        << "fast " << fast.*field << "\nreference " << ref.*field;
  }
}
}  // namespace

TEST(StanEss, FastSummaryMatchesTheWholeTensorReference) {
  // The fast summary (one sort per parameter, lazy direct autocovariances, FFT past 128 lags)
  // against the plain implementation: even and odd draw counts (an odd count drops each chain's
  // middle draw from the split chains), ties (rounded values), one chain, a stuck chain, slow
  // mixing that needs the FFT path, antithetic chains, and too few draws (NaN).
  at::Generator gen = make_generator(41);
  expect_summaries_agree(torch::randn({400, 4, 3}, gen, kF64), "independent, even S");
  expect_summaries_agree(torch::randn({401, 3, 2}, gen, kF64), "independent, odd S");
  expect_summaries_agree(torch::round(torch::randn({300, 4, 2}, gen, kF64) * 2), "many ties");
  expect_summaries_agree(ar1(0.5, 2001, 1, 42), "one chain");
  expect_summaries_agree(ar1(0.995, 6000, 4, 43), "slow mixing (FFT path)");
  expect_summaries_agree(ar1(0.9, 3000, 4, 44), "moderate mixing (direct lags)");
  expect_summaries_agree(ar1(-0.6, 3000, 4, 45), "antithetic");
  torch::Tensor stuck = torch::randn({500, 4, 1}, gen, kF64);
  stuck.select(1, 2).fill_(0.25);
  expect_summaries_agree(stuck, "one stuck chain");
  expect_summaries_agree(torch::randn({5, 2, 2}, gen, kF64), "five draws");
  expect_summaries_agree(torch::randn({2, 2, 1}, gen, kF64), "two draws");
}

TEST(PaperEss, LazyLagsMatchTheFftReference) {
  for (double phi : {0.3, 0.9, 0.995}) {
    torch::Tensor x = ar1(phi, 4000, 5, 46);
    torch::Tensor m = torch::zeros({1}, kF64), sd = torch::ones({1}, kF64);
    EXPECT_NEAR(paper_ess_ratio(x, m, sd).item<double>(), simple::paper_ess_ratio(x, m, sd).item<double>(), 1e-12)
        << "phi " << phi;
  }
}
