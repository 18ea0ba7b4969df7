// NUTS: what the invariance tests cannot see. Biased progressive sampling (Stan's rule, not the
// uniform multinomial one), exact per-chain gradient accounting, divergences on a density that
// returns NaN, the accept statistic; dense covariance estimation for the metric.
#include <gtest/gtest.h>

#include <cmath>

#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/diagnostics/summary.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/chain_stream.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/targets.hpp"
#include "broken.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {

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

  Nuts uniform(NutsOptions().set_step_size(1.0).set_max_depth(3), NutsRules::multinomial());
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

// Note [A step size per chain]: one averaging per chain on its own accept statistic (as Stan), or
// (the default) one for all on their mean, bit for bit the single averaging it was.
TEST(Nuts, EachChainAdaptsItsOwnStepSizeWhenAsked) {
  ChainsDualAveraging pooled(0.5, 0.8, 1), each(0.5, 0.8, 3);
  DualAveraging one(0.5, 0.8);
  const torch::Tensor a = torch::tensor({0.95, 0.2, 0.8}, kF64);
  EXPECT_EQ(pooled.update(a), std::vector<double>{one.update(a.mean().item<double>())});
  const std::vector<double> e = each.update(a);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_GT(e[0], e[2]);  // above the target: a longer step; below: a shorter one
  EXPECT_LT(e[1], e[2]);

  auto funnel = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 3}}, kF64);
  RunOptions run;
  run.set_chains(4).set_warmup(300).set_draws(20).set_adapt_mass(true);
  run.step_size_per_chain = true;
  Nuts nuts;
  SampleResult r = run_sampler(*funnel, nuts, run, 5);
  ASSERT_TRUE(r.step_size_chain.defined());
  ASSERT_EQ(r.step_size_chain.numel(), 4);
  const double lo = r.step_size_chain.min().item<double>(), hi = r.step_size_chain.max().item<double>();
  EXPECT_GT(hi / lo, 1.05) << r.step_size_chain;  // the chains settled apart
  EXPECT_NEAR(r.step_size, r.step_size_chain.mean().item<double>(), 1e-12);
  EXPECT_EQ(nuts.step_sizes().size(), 4u);
  EXPECT_EQ(summarise(r, *funnel)["step_sizes"].size(), 4u);
  run.step_size_per_chain = false;  // the default
  Nuts together;
  SampleResult q = run_sampler(*funnel, together, run, 5);
  EXPECT_FALSE(q.step_size_chain.defined());
  EXPECT_TRUE(together.step_sizes().empty());
  EXPECT_FALSE(summarise(q, *funnel).contains("step_sizes"));
}

// The engine takes each chain's step size: a chain with a step 5e4 times shorter hardly moves.
TEST(Nuts, EachChainStepsWithItsOwnStepSize) {
  auto t = make_target({{"name", "icg"}, {"dim", 4}}, kF64);
  Nuts nuts;
  nuts.set_step_sizes({1e-6, 0.05, 0.05});
  EXPECT_NEAR(nuts.step_size(), (1e-6 + 0.1) / 3.0, 1e-15);
  auto gen = make_generator(7);
  const torch::Tensor x0 = torch::full({3, 4}, 0.3, kF64);
  ChainState s = nuts.init(*t, x0);
  for (int i = 0; i < 5; ++i) s = nuts.step(*t, s, gen).first;
  const torch::Tensor moved = (s.x - x0).norm(2, 1);
  EXPECT_LT(moved[0].item<double>(), 0.05) << moved;
  EXPECT_GT(moved[1].item<double>(), 0.05) << moved;
  EXPECT_THROW(nuts.step(*t, nuts.init(*t, torch::zeros({2, 4}, kF64)), gen), c10::Error);  // 3 steps, 2 chains
  nuts.set_step_size(0.5);
  EXPECT_TRUE(nuts.step_sizes().empty());
  EXPECT_THROW(nuts.set_step_sizes({0.5, -1.0}), c10::Error);
}

// The run's summary counts the divergent transitions and, as Stan does, warns where there are any,
// naming --target-accept; a run without any says nothing of them.
TEST(Nuts, SummaryWarnsOfDivergences) {
  auto funnel = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 3}}, kF64);
  Nuts nuts;
  RunOptions run;
  run.set_chains(4).set_warmup(200).set_draws(200);
  SampleResult r = run_sampler(*funnel, nuts, run, 3);
  json s = summarise(r, *funnel);
  const int64_t divergent = r.divergent.sum().item<int64_t>();
  ASSERT_GT(divergent, 0);
  EXPECT_EQ(s["divergences"].get<int64_t>(), divergent);
  const std::string text = format_summary(s);
  EXPECT_NE(text.find("warning: " + std::to_string(divergent) + " of 800 transitions diverged"), std::string::npos) << text;
  EXPECT_NE(text.find("--target-accept"), std::string::npos) << text;
  auto icg = make_target({{"name", "icg"}, {"dim", 4}}, kF64);
  Nuts calm;
  SampleResult q = run_sampler(*icg, calm, run, 3);
  json c = summarise(q, *icg);
  ASSERT_EQ(c["divergences"].get<int64_t>(), 0);
  EXPECT_EQ(format_summary(c).find("diverged"), std::string::npos);
}

// Note [Convergence warnings]: a run whose chains mix says nothing more; chains that have not met
// (started far apart, no warm-up, small steps) are told not to be used, with the worst quantity.
TEST(Nuts, SummaryWarnsWhereChainsHaveNotMixed) {
  auto icg = make_target({{"name", "icg"}, {"dim", 4}}, kF64);
  Nuts nuts;
  RunOptions run;
  run.set_chains(4).set_warmup(500).set_draws(1000);
  json good = summarise(run_sampler(*icg, nuts, run, 3), *icg);
  ASSERT_LE(good["max_rhat"].get<double>(), 1.01);
  ASSERT_GE(good["min_ess_tail"].get<double>(), 400.0);
  ASSERT_GE(good["min_ess_bulk"].get<double>(), 400.0);
  EXPECT_EQ(format_summary(good).find("warning"), std::string::npos) << format_summary(good);

  Nuts slow;
  slow.set_step_size(0.01);
  RunOptions apart;
  apart.set_chains(4).set_warmup(0).set_draws(30).set_adapt_step(false);
  apart.set_init_x(torch::arange(4, kF64).unsqueeze(1).expand({4, 4}).contiguous() * 3.0);
  json bad = summarise(run_sampler(*icg, slow, apart, 3), *icg);
  ASSERT_GT(bad["max_rhat"].get<double>(), 1.01);
  const std::string text = format_summary(bad);
  EXPECT_NE(text.find("warning: the chains have not mixed: max R-hat"), std::string::npos) << text;
  EXPECT_NE(text.find("do not use these draws"), std::string::npos) << text;
  EXPECT_NE(text.find("warning: too few effective draws"), std::string::npos) << text;
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

// ---- transitions derived by hand (Note [Batched NUTS]) ----
//
// U(x) = x^2 / 2 in 1-d, unit metric, eps = 0.9, from x = 0 with p = 1. The leapfrog step
// (p' = p - 0.45 x; x' = x + 0.9 p'; p'' = p' - 0.45 x') gives, forward, p = 1, 0.595, -0.292,
// -0.942 at steps 0..3, and backward the same momenta (the mirror image in x). Depth 0 adds one
// leaf: rho = 1.595 and both ends positive, so the tree goes on (depth 1). Depth 1 adds two leaves:
//  - the same way again: the subtree {-0.292, -0.942} is valid inside (rho -1.234, both ends
//    negative), so the depth becomes 2; the whole trajectory (rho 0.36, far end -0.942) U-turns;
//  - the other way: the subtree {0.595, -0.292} has rho 0.303 against an end at -0.292: invalid,
//    the depth stays 1.
// Either way 3 leapfrog steps (3 gradients), and the depth is 2 exactly when both extensions went
// the same way (half the chains). NUTS without the U-turn checks inside subtrees (the broken
// variant, tests/support) goes on past the invalid subtree in the other chains: not as derived.
TEST(Nuts, HandDerivedTransitionOnAOneDimensionalNormal) {
  auto t = make_target({{"name", "gaussian"}, {"dim", 1}}, kF64);
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "Stan's rules" : "without the checks inside subtrees");
    Nuts nuts(NutsOptions().set_step_size(0.9).set_max_depth(10),
              exact ? NutsRules::stan() : test_support::nuts_without_subtree_checks());
    const int64_t c = 400;
    ChainState s = nuts.init(*t, torch::zeros({c, 1}, kF64));
    at::Generator gen = make_generator(31);
    auto [next, info] = nuts.transition(*t, s, torch::ones({c, 1}, kF64), gen);
    const int64_t deep = (info.tree_depth == 2).sum().item<int64_t>(), shallow = (info.tree_depth == 1).sum().item<int64_t>();
    // A chain of depth 1 draws from its first two points only: x in {0, +-0.9}.
    torch::Tensor x = next.x.squeeze(1).abs();
    torch::Tensor first_two = (x < 1e-12) | ((x - 0.9).abs() < 1e-12);
    // Binomial(400, 1/2): outside (140, 260) with probability < 1e-9
    const bool as_derived = torch::equal(info.n_grad_chain, torch::full({c}, int64_t{3})) && deep + shallow == c &&
                            deep > 140 && deep < 260 && first_two.masked_select(info.tree_depth == 1).all().item<bool>();
    EXPECT_EQ(as_derived, exact) << "depths " << info.tree_depth.bincount() << " gradients " << info.n_grad_chain.bincount();
  }
}

// The dense metric: N(0, Sigma) with Sigma = [[4, 1.9], [1.9, 1]] and the metric M^{-1} = Sigma is,
// in whitened coordinates y = L^{-1} x (L L^T = Sigma), unit-metric NUTS on N(0, I). From y = (0, 1)
// with whitened momentum (1, 0) the leapfrog points turn about the origin by 2 asin(eps / 2) = 0.933
// rad per step at eps = 0.9. Subtrees of up to 3 steps (2.8 rad) never turn back on themselves,
// and the whole trajectory turns once it spans more than pi: after depth 2 (3 steps) it goes on,
// after depth 3 (7 steps, 6.5 rad) it stops. So every chain, whatever its directions, takes 7
// leapfrog steps at depth 3. The criterion on p instead of M^{-1} p (wrong unless M = I) does not.
TEST(Nuts, HandDerivedTransitionWithADenseMetric) {
  torch::Tensor sigma = torch::tensor({{4.0, 1.9}, {1.9, 1.0}}, kF64);
  torch::Tensor l = torch::linalg_cholesky(sigma);
  // The target N(0, Sigma) as a Gaussian given by its eigen-decomposition.
  auto [evals, evecs] = torch::linalg_eigh(sigma, "L");
  GaussianTarget target("sigma", {{"name", "sigma"}}, evals, evecs, torch::Tensor(), kF64);
  const int64_t c = 64;
  torch::Tensor x0 = torch::matmul(torch::tensor({{0.0, 1.0}}, kF64), l.t()).expand({c, 2}).contiguous();   // x = L y
  torch::Tensor p0 = torch::linalg_solve(l.t(), torch::tensor({{1.0}, {0.0}}, kF64), /*left=*/true).t().expand({c, 2}).contiguous();  // L^{-T} z
  for (bool sharp : {true, false}) {
    SCOPED_TRACE(sharp ? "criterion on M^-1 p" : "criterion on p");
    Nuts nuts(NutsOptions().set_step_size(0.9).set_max_depth(10),
              sharp ? NutsRules::stan() : test_support::nuts_with_criterion_on_p());
    nuts.set_inv_mass(sigma);
    ChainState s = nuts.init(target, x0);
    at::Generator gen = make_generator(37);
    auto [next, info] = nuts.transition(target, s, p0, gen);
    const bool as_derived = torch::equal(info.n_grad_chain, torch::full({c}, int64_t{7})) &&
                            torch::equal(info.tree_depth, torch::full({c}, int64_t{3}));
    EXPECT_EQ(as_derived, sharp) << info.tree_depth << info.n_grad_chain;
  }
}

// Note [Asynchronous NUTS chains]: a chain's transitions do not depend on which chains share its
// batches, so chains that run ahead of each other (run_steps with a lookahead) draw bit for bit
// what the same chains draw in lockstep, in fewer batched gradient calls (on a funnel the chains'
// trees differ in depth); and a callback that returns false stops the run at once.
TEST(Nuts, ChainsRunningAheadDrawWhatLockstepChainsDraw) {
  auto target = make_target({{"name", "funnel"}, {"dim", 10}, {"sigma", 1.0}}, kF64);
  const int64_t c = 16, n = 40;
  auto run = [&](int64_t lookahead, int64_t stop_after, int64_t* calls) {
    Nuts nuts(NutsOptions().set_step_size(0.4).set_lookahead(lookahead));
    nuts.set_inv_mass(torch::linspace(0.5, 2.0, 10, kF64));
    at::Generator gen = make_generator(41);
    ChainState s = nuts.init(*target, rand({c, 10}, gen, kF64) * 2.0 - 1.0);
    std::vector<torch::Tensor> xs;
    std::vector<torch::Tensor> depth;
    const int64_t before = target->grad_evals();
    ChainState last = nuts.run_steps(*target, s, n, gen, [&](const ChainState& now, const StepInfo& info) {
      xs.push_back(now.x.clone());
      depth.push_back(info.tree_depth.clone());
      return static_cast<int64_t>(xs.size()) < stop_after;
    });
    *calls = target->grad_evals() - before;
    EXPECT_TRUE(torch::equal(last.x, xs.back()));
    return std::make_pair(torch::stack(xs), torch::stack(depth));
  };
  int64_t lockstep_calls = 0, ahead_calls = 0, stopped_calls = 0;
  auto [lock_x, lock_depth] = run(1, n, &lockstep_calls);
  auto [ahead_x, ahead_depth] = run(8, n, &ahead_calls);
  ASSERT_EQ(lock_x.size(0), n);
  EXPECT_TRUE(torch::equal(lock_x, ahead_x)) << (lock_x - ahead_x).abs().max();
  EXPECT_TRUE(torch::equal(lock_depth, ahead_depth));
  EXPECT_LT(lock_depth.min().item<int64_t>(), lock_depth.max().item<int64_t>());  // the trees differ
  EXPECT_LT(ahead_calls, lockstep_calls * 0.9) << ahead_calls << " against " << lockstep_calls;
  auto [stopped_x, stopped_depth] = run(8, 5, &stopped_calls);
  EXPECT_EQ(stopped_x.size(0), 5);
  EXPECT_TRUE(torch::equal(stopped_x, lock_x.narrow(0, 0, 5)));
  EXPECT_LT(stopped_calls, ahead_calls);
}

namespace {
/// A standard normal with a wall, U(x) = |x|^2 / 2 + (2 x0)^200: finite everywhere, but beyond
/// |x0| ~ 0.6 so steep (U ~ 1e23 at 0.65, 1e35 at 0.75, as an ARMA model whose recursion
/// explodes) that no step size down to 1e-8 lets a chain move.
class SteepWall : public Target {
 public:
  SteepWall() : Target(kF64) {}
  std::string name() const override { return "steep_wall"; }
  int64_t dim() const override { return 2; }
  json spec() const override { return {{"name", "steep_wall"}}; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    return 0.5 * x.pow(2).sum(1) + (2.0 * x.select(1, 0)).pow(200);
  }
};
}  // namespace

TEST(Nuts, StartingPointsNoStepSizeCanMoveAreDrawnAgain) {
  // Note [Starting points that cannot move]. Seed 4's uniform(-2, 2) starts put 8 of 16 chains
  // beyond |x0| = 0.65 (checked below, so the test keeps its premise). Given as starting points
  // (never replaced), they drag the pooled step size to nothing (the power check: below 1e-6
  // after 30 warm-up iterations); drawn at random, they are screened and drawn again, and the
  // run adapts a usable step size and samples the right x1 (a standard normal; 4 sds of its
  // mean's MCSE at a bulk-ESS over 400: a false fail below 1e-4).
  SteepWall t;
  const uint64_t seed = 4;
  at::Generator gen = make_generator(seed);
  const torch::Tensor starts = initial_positions(t, "uniform", 16, gen);
  const int64_t hopeless = (starts.select(1, 0).abs() > 0.65).sum().item<int64_t>();
  ASSERT_GE(hopeless, 8) << starts;

  Nuts given(NutsOptions().set_max_depth(6));
  RunOptions o;
  o.set_chains(16).set_warmup(30).set_draws(5).set_metric(MetricAdapt::kDiag).set_init_x(starts);
  SampleResult stuck = run_sampler(t, given, o, seed);
  EXPECT_LT(stuck.step_size, 1e-6);
  EXPECT_EQ(stuck.chains_redrawn, 0);

  Nuts nuts;
  RunOptions r;
  r.set_chains(16).set_warmup(300).set_draws(300).set_metric(MetricAdapt::kDiag);
  SampleResult res = run_sampler(t, nuts, r, seed);
  EXPECT_GE(res.chains_redrawn, hopeless);
  EXPECT_GT(res.step_size, 0.1);
  EXPECT_LT(res.draws.select(2, 0).abs().max().item<double>(), 0.6);
  const StanSummary sum = stan_summary(res.draws.select(2, 1).unsqueeze(2));
  const double ess = sum.ess_bulk[0].item<double>(), mean = sum.mean[0].item<double>();
  EXPECT_GT(ess, 400);
  EXPECT_LT(sum.rhat[0].item<double>(), 1.02);
  EXPECT_LT(std::abs(mean), 4.0 / std::sqrt(ess)) << mean;
  EXPECT_NEAR(sum.sd[0].item<double>(), 1.0, 0.1);
}

namespace {
/// Whether n draws look N(0, 1): a chi-square over 64 equiprobable bins (df 63, fails above
/// 131.4: p < 1e-6) and the count beyond the ziggurat's tail edge r = 3.4426 as a z-score (fails
/// beyond 4.89: p < 1e-6).
::testing::AssertionResult looks_standard_normal(const std::vector<double>& z) {
  std::vector<double> bins(64, 0.0);
  double beyond = 0;
  for (double x : z) {
    const double u = 0.5 * std::erfc(-x / std::sqrt(2.0));
    bins[static_cast<size_t>(std::min(63.0, std::floor(u * 64)))] += 1;
    if (std::abs(x) > 3.442619855899) beyond += 1;
  }
  const double n = static_cast<double>(z.size()), e = n / 64;
  double chi2 = 0;
  for (double b : bins) chi2 += (b - e) * (b - e) / e;
  const double p_tail = std::erfc(3.442619855899 / std::sqrt(2.0));
  const double z_tail = (beyond - n * p_tail) / std::sqrt(n * p_tail * (1 - p_tail));
  if (chi2 > 131.4) return ::testing::AssertionFailure() << "chi-square " << chi2 << " over 64 bins";
  if (std::abs(z_tail) > 4.89) return ::testing::AssertionFailure() << "tail count z = " << z_tail;
  return ::testing::AssertionSuccess() << "chi-square " << chi2 << ", tail z " << z_tail;
}
}  // namespace

// A chain's momenta come from its own stream's normals (the ziggurat, Marsaglia & Tsang 2000).
// 4 million of them against N(0, 1): false-fail rate about 2e-6 (two checks at 1e-6). Power: the
// same checks reject the draws scaled by 1.01 (the chi-square's noncentrality is about 760) and the
// draws with the tail beyond r cut off (z about -48).
TEST(Nuts, ChainStreamNormalsAreStandardNormal) {
  nmcmc::detail::ChainStream rng{20261126};
  std::vector<double> z(4000000);
  for (double& x : z) x = rng.normal();
  EXPECT_TRUE(looks_standard_normal(z));
  std::vector<double> scaled = z, cut = z;
  for (double& x : scaled) x *= 1.01;
  for (double& x : cut) x = std::clamp(x, -3.442619855899, 3.442619855899);
  EXPECT_FALSE(looks_standard_normal(scaled));
  EXPECT_FALSE(looks_standard_normal(cut));
}
