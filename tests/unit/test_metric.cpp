// Metrics: the low-rank-plus-diagonal metric's algebra against its dense equivalent, and the metric
// estimates from draws and gradients (Note [Metrics from draws and gradients]) on Gaussians whose
// answer is known, and inside run_sampler's warm-up.
#include <gtest/gtest.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/targets/targets.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {

/// A random low-rank metric in D = 7 with K = 3.
Metric random_low_rank(uint64_t seed) {
  at::Generator g = make_generator(seed);
  torch::Tensor scale2 = torch::rand({7}, g, kF64) * 3 + 0.2;
  torch::Tensor q = std::get<0>(torch::linalg_qr(torch::randn({7, 3}, g, kF64), "reduced"));
  return Metric::low_rank(scale2, q, torch::tensor({9.0, 0.05, 2.5}, kF64));
}

/// Exact draws of N(0, cov) and their gradients dU = cov^{-1} x, [n, D] each.
std::pair<torch::Tensor, torch::Tensor> gaussian_draws(const torch::Tensor& cov, int64_t n, uint64_t seed) {
  at::Generator g = make_generator(seed);
  torch::Tensor l = torch::linalg_cholesky(cov);
  torch::Tensor x = torch::matmul(torch::randn({n, cov.size(0)}, g, kF64), l.t());
  return {x, torch::matmul(x, torch::linalg_inv(cov))};
}

/// The condition number of the covariance seen through the metric: eig(M^{1/2} cov M^{1/2}),
/// computed as eig(L^{-1} cov L^{-T}) with M^{-1} = L L^T.
double preconditioned_condition(const Metric& m, const torch::Tensor& cov) {
  torch::Tensor l = torch::linalg_cholesky(m.kind() == MetricKind::kDiag ? torch::diag(m.inv_mass()) : m.inv_mass());
  torch::Tensor li = torch::linalg_inv(l);
  torch::Tensor e = torch::linalg_eigvalsh(torch::matmul(torch::matmul(li, cov), li.t()), "L");
  return (e.max() / e.min()).item<double>();
}
}  // namespace

TEST(Metric, LowRankAgreesWithItsDenseEquivalent) {
  // Every operation of the O(D K) low-rank metric against the dense metric with the same M^{-1}:
  // the velocity, drift, kinetic energy and mass quadratic form to 1e-10; the momentum and noise
  // use another square root of M (M^{-1}), so through the identities that define them:
  // K(momentum(z)) = |z|^2 / 2 and mass_quadratic(noise(z)) = |z|^2 for 64 random z in D = 7
  // (together: R R^T = M and L L^T = M^{-1} exactly). A wrong power in any of them fails.
  const Metric lr = random_low_rank(3);
  const Metric dense(lr.inv_mass());
  ASSERT_EQ(lr.kind(), MetricKind::kLowRank);
  at::Generator g = make_generator(4);
  torch::Tensor v = torch::randn({64, 7}, g, kF64), z = torch::randn({64, 7}, g, kF64);
  EXPECT_LT((lr.velocity(v) - dense.velocity(v)).abs().max().item<double>(), 1e-10);
  EXPECT_LT((lr.drift(v, 0.3) - dense.drift(v, 0.3)).abs().max().item<double>(), 1e-10);
  EXPECT_LT((lr.kinetic(v) - dense.kinetic(v)).abs().max().item<double>(), 1e-10);
  EXPECT_LT((lr.mass_quadratic(v) - dense.mass_quadratic(v)).abs().max().item<double>(), 1e-9);
  const torch::Tensor z2 = (z * z).sum(1);
  EXPECT_LT((lr.kinetic(lr.momentum(z)) - 0.5 * z2).abs().max().item<double>(), 1e-9);
  EXPECT_LT((lr.mass_quadratic(lr.noise(z)) - z2).abs().max().item<double>(), 1e-9);
  EXPECT_LT((lr.noise(z, 0.7) - 0.7 * lr.noise(z)).abs().max().item<double>(), 1e-12);
  // In float32, as the kernels use it with a float32 target.
  const Metric lr32 = lr.to(torch::TensorOptions().dtype(torch::kFloat32));
  EXPECT_LT((lr32.velocity(v.to(torch::kFloat32)).to(torch::kFloat64) - dense.velocity(v)).abs().max().item<double>(), 1e-4);
  // The metric's own checks.
  EXPECT_THROW(Metric::low_rank(torch::ones({3}, kF64), torch::ones({4, 1}, kF64), torch::ones({1}, kF64)), c10::Error);
  EXPECT_THROW(Metric::low_rank(torch::ones({3}, kF64), torch::zeros({3, 1}, kF64), torch::zeros({1}, kF64)), c10::Error);
}

TEST(MetricAdaptation, FisherDiagonalIsSqrtOfVarianceOverGradientVariance) {
  // For N(0, Sigma) the population answer is sqrt(Sigma_ii / (Sigma^{-1})_ii): Sigma_ii for a
  // diagonal Sigma, between the conditional and the marginal variance for a correlated one. From
  // 200,000 exact draws the estimate is within 1 % (its relative sd here is ~0.2 %).
  torch::Tensor cov = torch::tensor({{4.0, 1.2, 0.0}, {1.2, 1.0, -0.3}, {0.0, -0.3, 0.25}}, kF64);
  auto [x, g] = gaussian_draws(cov, 200000, 5);
  MetricEstimator est(MetricAdapt::kFisherDiag);
  for (int64_t k = 0; k < 200000; k += 10000) est.add(x.narrow(0, k, 10000), g.narrow(0, k, 10000));
  const Metric m = est.estimate();
  ASSERT_EQ(m.kind(), MetricKind::kDiag);
  const torch::Tensor expected = (cov.diagonal() / torch::linalg_inv(cov).diagonal()).sqrt();
  EXPECT_LT(((m.inv_mass() / expected) - 1).abs().max().item<double>(), 0.01) << m.inv_mass() << expected;
  // Stan's diagonal estimate converges to the marginal variances instead: a different answer
  // for a correlated target (the test can tell them apart).
  EXPECT_GT(((cov.diagonal() / expected) - 1).abs().max().item<double>(), 0.1);
  // Diagonal Sigma: the variances themselves.
  torch::Tensor diag = torch::diag(torch::tensor({0.01, 1.0, 100.0}, kF64));
  auto [xd, gd] = gaussian_draws(diag, 100000, 6);
  MetricEstimator est2(MetricAdapt::kFisherDiag);
  est2.add(xd, gd);
  EXPECT_LT(((est2.estimate().inv_mass() / torch::tensor({0.01, 1.0, 100.0}, kF64)) - 1).abs().max().item<double>(), 0.01);
}

TEST(MetricAdaptation, FisherLowRankRecoversWideAndNarrowDirections) {
  // D = 20: scales from 0.1 to 10 per coordinate, and in those scaled coordinates one direction
  // 100x wider and another 100x narrower (in variance). Seen through the diagonal estimate the
  // target stays ~10^4 : 1 (both directions missed); through the low-rank one it must be nearly
  // round, with both directions found (rank >= 2). By design eigenvalues within [1/2, 2] are left
  // at 1, so an exact estimate leaves a condition number of up to 4; below 5 allows the estimate's
  // noise (4,000 draws), and a metric that missed either direction would leave ~100.
  const int64_t d = 20;
  at::Generator g = make_generator(8);
  torch::Tensor s = torch::logspace(-1, 1, d, 10.0, kF64);
  torch::Tensor q = std::get<0>(torch::linalg_qr(torch::randn({d, 2}, g, kF64), "reduced"));
  torch::Tensor inner = torch::eye(d, kF64) + 99.0 * torch::outer(q.select(1, 0), q.select(1, 0)) -
                        0.99 * torch::outer(q.select(1, 1), q.select(1, 1));
  torch::Tensor cov = s.unsqueeze(1) * inner * s.unsqueeze(0);
  auto [x, grad] = gaussian_draws(cov, 4000, 9);
  MetricEstimator low(MetricAdapt::kFisherLowRank), diag(MetricAdapt::kFisherDiag);
  low.add(x, grad);
  diag.add(x, grad);
  const Metric m = low.estimate();
  ASSERT_EQ(m.kind(), MetricKind::kLowRank);
  EXPECT_GE(m.basis().size(1), 2);
  const double kappa_low = preconditioned_condition(m, cov), kappa_diag = preconditioned_condition(diag.estimate(), cov);
  std::cout << "  condition through the metric: fisher-diag " << kappa_diag << ", fisher-lowrank " << kappa_low
            << " (rank " << m.basis().size(1) << ")\n";
  EXPECT_LT(kappa_low, 5.0);
  EXPECT_GT(kappa_diag, 1000.0);
  // The basis is orthonormal.
  EXPECT_LT((torch::matmul(m.basis().t(), m.basis()) - torch::eye(m.basis().size(1), kF64)).abs().max().item<double>(), 1e-10);
}

TEST(MetricAdaptation, FisherLowRankFallsBackToItsDiagonalWhereProductsOverflow) {
  // A chain far out in a recursion's tail (ARMA through the flow, 52154a8+): finite draws and
  // gradients whose squares overflow made LAPACK's eigendecomposition fail and ended the run.
  // Now the estimate is the diagonal part alone, finite and positive.
  at::Generator g = make_generator(10);
  torch::Tensor x = torch::randn({200, 4}, g, kF64), grad = -x.clone();
  grad[7][2] = 1e200;
  grad[8][2] = -1e200;
  const Metric m = fisher_low_rank(x, grad);
  EXPECT_EQ(m.kind(), MetricKind::kLowRank);
  EXPECT_EQ(m.basis().size(1), 0);
  EXPECT_TRUE(torch::isfinite(m.inv_mass()).all().item<bool>());
  EXPECT_TRUE((torch::linalg_eigvalsh(m.inv_mass(), "L") > 0).all().item<bool>());
  // (FisherLowRankRecoversWideAndNarrowDirections: the low-rank part where nothing overflows)
}

TEST(MetricAdaptation, WarmupAdaptsEachMetricWithNuts) {
  // run_sampler with each metric on a correlated 6-d Gaussian: the adapted metric's form, and how
  // round it makes the target. Stan's diagonal and fisher-diag cannot undo the correlation
  // (0.95 between two coordinates); dense and fisher-lowrank do.
  torch::Tensor cov = torch::diag(torch::tensor({1.0, 4.0, 0.25, 1.0, 9.0, 0.5}, kF64));
  cov[0][1] = cov[1][0] = 0.95 * 2.0;
  auto [values, vectors] = torch::linalg_eigh(cov, "L");
  auto target = std::make_shared<GaussianTarget>("correlated", json{{"name", "correlated"}}, values, vectors, torch::Tensor(), kF64);
  ASSERT_LT((target->covariance() - cov).abs().max().item<double>(), 1e-12);
  for (auto [metric, form, max_condition] : {std::tuple{MetricAdapt::kDiag, "diag", 1e9},
                                            std::tuple{MetricAdapt::kDense, "dense", 3.0},
                                            std::tuple{MetricAdapt::kFisherDiag, "diag", 1e9},
                                            std::tuple{MetricAdapt::kFisherLowRank, "low-rank", 3.0}}) {
    Nuts nuts;
    SampleResult r = run_sampler(*target, nuts, RunOptions().set_chains(8).set_warmup(400).set_draws(50).set_metric(metric), 3);
    EXPECT_EQ(r.metric, form) << metric;
    ASSERT_TRUE(r.inv_mass.defined());
    const Metric m(r.inv_mass);  // a low-rank metric is reported as its dense equivalent
    const double kappa = preconditioned_condition(m, cov);
    std::cout << "  " << metric << ": condition " << kappa << "\n";
    EXPECT_LT(kappa, max_condition) << metric;
    if (metric == MetricAdapt::kDiag || metric == MetricAdapt::kFisherDiag) EXPECT_GT(kappa, 10.0) << metric;
  }
  // The gradient-based metrics need a sampler that computes gradients.
  MetropolisHastings rwm(std::make_shared<RandomWalk>(0.5));
  EXPECT_THROW(run_sampler(*target, rwm, RunOptions().set_chains(2).set_warmup(50).set_draws(5).set_metric(MetricAdapt::kFisherDiag), 1),
               UsageError);
  // Names at the edge.
  EXPECT_EQ(parse_enum<MetricAdapt>("fisher-lowrank"), MetricAdapt::kFisherLowRank);
  EXPECT_THROW(parse_enum<MetricAdapt>("fisher"), UsageError);
}
