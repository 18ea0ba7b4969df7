// NUTS: what the invariance tests cannot see. Biased progressive sampling (Stan's rule, not the
// uniform multinomial one), exact per-chain gradient accounting, divergences on a density that
// returns NaN, the accept statistic; dense covariance estimation for the metric.
#include <gtest/gtest.h>

#include <cmath>

#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/targets.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {
const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

/// U(x) = 0 (a flat "density"): every leaf has the same weight and the trajectory never turns.
class Flat : public Target {
 public:
  explicit Flat(int64_t d) : Target(kF64), d_(d) {}
  std::string name() const override { return "flat"; }
  int64_t dim() const override { return d_; }
  json spec() const override { return {{"name", "flat"}}; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override { return 0.0 * x.sum(1); }

 private:
  int64_t d_;
};

/// A standard normal whose energy is NaN where x0 > 1.5 (a model that fails on part of the space).
class NanBeyond : public Target {
 public:
  NanBeyond() : Target(kF64) {}
  std::string name() const override { return "nan_beyond"; }
  int64_t dim() const override { return 2; }
  json spec() const override { return {{"name", "nan_beyond"}}; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    torch::Tensor u = 0.5 * x.pow(2).sum(1);
    return torch::where(x.select(1, 0) > 1.5, torch::full_like(u, NAN), u);
  }
};

std::pair<ChainState, StepInfo> one_step(Target& t, Nuts& nuts, const torch::Tensor& x0, uint64_t seed) {
  at::Generator gen = make_generator(seed);
  ChainState s = nuts.init(t, x0);
  return nuts.step(t, s, gen);
}
}  // namespace

TEST(Nuts, BiasedProgressiveSamplingOnAFlatTarget) {
  // On a flat target every leaf weighs the same and the trajectory never turns, so with max
  // depth 3 every chain builds 1 + 2 + 4 = 7 leaves. Stan's biased progressive sampling then
  // always moves to the newest subtree (min(1, w_new / w_old) = 1): no chain stays at its start.
  // The uniform multinomial rule (an exact kernel too, but not Stan's) keeps the start with
  // probability 1/8: ~500 of 4000 chains, so this test cannot miss it.
  Flat flat(1);
  const torch::Tensor x0 = torch::zeros({4000, 1}, kF64);
  Nuts stan(NutsOptions().set_step_size(1.0).set_max_depth(3));
  auto [s, info] = one_step(flat, stan, x0, 5);
  EXPECT_TRUE(torch::equal(info.tree_depth, torch::full({4000}, 3, torch::kInt64)));
  EXPECT_TRUE(torch::equal(info.n_grad_chain, torch::full({4000}, 7, torch::kInt64)));
  EXPECT_NEAR(info.accept_prob.min().item<double>(), 1.0, 1e-12);
  EXPECT_EQ((s.x == x0).sum().item<int64_t>(), 0);
  // The momentum never changes, so the sample sits k whole steps from the start (|p| from the
  // reported energy K = p^2 / 2); the newest subtree lies outside the old trajectory, which
  // holds the start: 1 <= |k| <= 7.
  torch::Tensor k = s.x.squeeze(1).abs() / torch::sqrt(2.0 * info.energy);
  EXPECT_GE(k.min().item<double>(), 1.0 - 1e-9);
  EXPECT_LE(k.max().item<double>(), 7.0 + 1e-9);
  EXPECT_LT((k - k.round()).abs().max().item<double>(), 1e-9);

  Nuts uniform(NutsOptions().set_step_size(1.0).set_max_depth(3), NutsDefect::kUniformTopLevel);
  auto [su, infou] = one_step(flat, uniform, x0, 5);
  const int64_t stayed = (su.x == x0).sum().item<int64_t>();
  EXPECT_GT(stayed, 350) << "the uniform rule keeps the start in ~1/8 of chains";
  EXPECT_LT(stayed, 650);
}

TEST(Nuts, GradientsAreCountedPerChainExactly) {
  // One chain: its count is the target's count. Many chains: each is between 2^depth - 1 (full
  // doublings) and 2^(depth+1) - 1 (plus a rejected last subtree), and the target's own counter
  // (one per batched leaf) equals the busiest chain's count: waiting chains are never evaluated.
  auto t = make_target({{"name", "funnel"}, {"dim", 10}, {"sigma", 3.0}}, kF64);
  at::Generator gen = make_generator(3);
  Nuts nuts(NutsOptions().set_step_size(0.2));
  ChainState s1 = nuts.init(*t, t->sample(1, gen));
  for (int i = 0; i < 20; ++i) {
    const int64_t g0 = t->grad_evals();
    auto [next, info] = nuts.step(*t, s1, gen);
    EXPECT_EQ(info.n_grad_chain.item<int64_t>(), t->grad_evals() - g0);
    s1 = next;
  }
  ChainState s = nuts.init(*t, t->sample(256, gen));
  for (int i = 0; i < 5; ++i) {
    const int64_t g0 = t->grad_evals();
    auto [next, info] = nuts.step(*t, s, gen);
    torch::Tensor lo = torch::pow(2, info.tree_depth) - 1, hi = torch::pow(2, info.tree_depth + 1) - 1;
    EXPECT_TRUE((info.n_grad_chain >= lo).all().item<bool>());
    EXPECT_TRUE((info.n_grad_chain <= hi).all().item<bool>());
    EXPECT_EQ(info.n_grad_chain.max().item<int64_t>(), t->grad_evals() - g0);
    EXPECT_GT(info.n_grad_chain.max().item<int64_t>(), info.n_grad_chain.min().item<int64_t>())
        << "chains in a funnel build trees of different sizes";
    s = next;
  }
}

TEST(Nuts, NanDensityIsADivergenceNeverAChainValue) {
  NanBeyond t;
  at::Generator gen = make_generator(1);
  Nuts nuts(NutsOptions().set_step_size(0.5));
  ChainState s = nuts.init(t, torch::randn({500, 2}, gen, kF64) * 0.3);
  int64_t divergent = 0;
  for (int i = 0; i < 20; ++i) {
    auto [next, info] = nuts.step(t, s, gen);
    divergent += info.divergent.sum().item<int64_t>();
    EXPECT_TRUE(torch::isfinite(next.x).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(next.energy).all().item<bool>());
    EXPECT_TRUE((next.x.select(1, 0) <= 1.5).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(info.accept_prob).all().item<bool>());
    s = next;
  }
  EXPECT_GT(divergent, 0);
}

TEST(Nuts, RunSamplerAdaptsAndReportsTreeStatistics) {
  auto t = make_target({{"name", "icg"}, {"dim", 10}}, kF64);
  Nuts nuts;
  RunOptions run;
  run.set_chains(4).set_warmup(300).set_draws(200).set_adapt_mass(true).set_target_accept(0.8);
  SampleResult r = run_sampler(*t, nuts, run, 2);
  ASSERT_TRUE(r.tree_depth.defined());
  EXPECT_EQ(r.tree_depth.sizes(), (std::vector<int64_t>{200, 4}));
  EXPECT_EQ(r.max_tree_depth, 10);
  EXPECT_GT(r.step_size, 0.0);
  ASSERT_TRUE(r.inv_mass.defined());
  // The adapted diagonal metric tracks the variances, spanning 1e-2..1e2.
  EXPECT_GT(r.inv_mass[9].item<double>() / r.inv_mass[0].item<double>(), 300.0);
  json s = summarise(r, *t);
  EXPECT_NEAR(s["grads_per_step"].get<double>(), r.n_grad_chain.to(torch::kFloat64).mean().item<double>(), 1e-12);
  EXPECT_TRUE(s.contains("tree_depth_hits"));
  EXPECT_GT(s["accept_rate"].get<double>(), 0.6);
}

TEST(Adaptation, DenseMetricLearnsACovariance) {
  at::Generator gen = make_generator(4);
  torch::Tensor l = torch::tensor({1.0, 0.0, 0.0, 0.9, 0.3, 0.0, -0.5, 0.2, 2.0}, kF64).reshape({3, 3});
  torch::Tensor cov = torch::matmul(l, l.t());
  CovarianceEstimator est;
  for (int i = 0; i < 40; ++i) est.add(torch::matmul(torch::randn({500, 3}, gen, kF64), l.t()));
  torch::Tensor got = est.regularised_covariance();
  EXPECT_LT((got - cov).abs().max().item<double>(), 0.1) << got;
  // Stan's regularisation: shrinks towards 1e-3 I with weight 5 / (n + 5). Three draws in 2-d:
  // variances 1/3, covariance 1/3 (the draws lie on a line).
  CovarianceEstimator three;
  three.add(torch::tensor({0.0, 0.0, 1.0, 1.0, 0.0, 0.0}, kF64).reshape({3, 2}));
  torch::Tensor r = three.regularised_covariance();
  EXPECT_NEAR(r[0][0].item<double>(), (3.0 / 8.0) / 3.0 + 1e-3 * 5.0 / 8.0, 1e-15);
  EXPECT_NEAR(r[0][1].item<double>(), (3.0 / 8.0) / 3.0, 1e-15);
  // n <= D draws: S is singular; only its diagonal is kept (a diagonal metric for that window).
  CovarianceEstimator two;
  two.add(torch::tensor({0.0, 0.0, 1.0, 1.0}, kF64).reshape({2, 2}));
  torch::Tensor d = two.regularised_covariance();
  EXPECT_NEAR(d[0][0].item<double>(), (2.0 / 7.0) * 0.5 + 1e-3 * 5.0 / 7.0, 1e-15);
  EXPECT_EQ(d[0][1].item<double>(), 0.0);
}
