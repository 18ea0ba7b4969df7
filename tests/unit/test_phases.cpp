// A warm-up in phases (Note [Warm-up in phases]): the run loop runs each phase on its transformed
// target, hands the adapter every step's state, counts every phase as warm-up, and maps the last
// phase's draws back to the run's target.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/transform.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/factory.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;

namespace {
constexpr int64_t kChains = 4;

/// N(mean, diag(sd^2)) in three dimensions, far from the starting box.
GaussianTarget shifted_gaussian() {
  return GaussianTarget("shifted", nlohmann::json{{"name", "shifted"}}, torch::tensor({1.0, 4.0, 0.25}, kF64),
                        torch::Tensor(), torch::tensor({4.0, -2.0, 1.0}, kF64), kF64);
}

/// Two phases before the last, each on its own diagonal map (the second nearer the target), then
/// sampling on the map that whitens it; or the run ended after the first phase (`end_early`).
/// Records what each phase handed over.
class TwoPhases : public PhaseAdapter {
 public:
  TwoPhases(Target& target, bool end_early) : end_early_(end_early) {
    auto map = [&](torch::Tensor m, torch::Tensor scale) {
      return std::make_unique<TransformedTarget>(
          target, std::make_shared<AffineTransform>(AffineTransform::diagonal(m, scale, scale.log().sum())));
    };
    maps_.push_back(map(torch::zeros({3}, kF64), torch::ones({3}, kF64)));
    maps_.push_back(map(torch::tensor({2.0, -1.0, 0.5}, kF64), torch::tensor({1.0, 1.5, 0.7}, kF64)));
    maps_.push_back(map(torch::tensor({4.0, -2.0, 1.0}, kF64), torch::tensor({1.0, 2.0, 0.5}, kF64)));
  }
  WarmupPhase first() override { return phase(0, 30, 2); }
  std::optional<WarmupPhase> next(PhaseEnd& ended) override {
    ends.push_back({ended.x.size(0), ended.grad.sizes() == ended.x.sizes(),
                    ended.result.grads_warmup + ended.result.grads_sampling, ended.result.draws.size(0)});
    // where the chains ended, on the next map
    last_x_ = maps_[ends.size() - 1]->to_ambient(ended.result.draws[ended.result.draws.size(0) - 1]);
    if (end_early_) return std::nullopt;
    if (ends.size() == 1) return phase(1, 20, 1);
    WarmupPhase last = phase(2, 200, 0);
    last.sampling = true;
    return last;
  }
  int64_t iterations_before() const override { return 0; }
  int64_t iterations_planned() const override { return 250; }

  struct End {
    int64_t rows = 0;
    bool grads = false;
    int64_t grads_per_chain = 0, draws = 0;
  };
  std::vector<End> ends;

 private:
  WarmupPhase phase(size_t k, int64_t iterations, int64_t draws) {
    WarmupPhase ph;
    ph.target = maps_[k].get();
    ph.iterations = iterations;
    ph.draws = draws;
    ph.metric = MetricAdapt::kDiag;
    ph.seed = 100 + k;
    if (last_x_.defined()) ph.init_x = maps_[k]->to_latent(last_x_);
    return ph;
  }
  bool end_early_;
  std::vector<std::unique_ptr<TransformedTarget>> maps_;
  torch::Tensor last_x_;
};

const RunOptions kRun = RunOptions().set_chains(kChains).set_warmup(250).set_draws(1000);

std::unique_ptr<Kernel> hmc5() { return make_baseline_kernel(ProposalOptions().set_sampler(SamplerKind::kHmc).set_leapfrog(5)); }
}  // namespace

TEST(Phases, EveryPhaseIsWarmUpAndTheLastOnesDrawsComeBackMapped) {
  GaussianTarget target = shifted_gaussian();
  auto hmc = hmc5();
  TwoPhases adapter(target, /*end_early=*/false);
  SampleResult r = run_in_phases(target, *hmc, kRun, adapter, 7);
  ASSERT_TRUE(r.complete);
  ASSERT_EQ(adapter.ends.size(), 2u);
  // every step of a phase (its warm-up and its draws) handed over, with its gradients
  EXPECT_EQ(adapter.ends[0].rows, (30 + 2) * kChains);
  EXPECT_EQ(adapter.ends[1].rows, (20 + 1) * kChains);
  EXPECT_TRUE(adapter.ends[0].grads && adapter.ends[1].grads);
  EXPECT_EQ(adapter.ends[0].draws, 2);
  // the phases' gradients are the run's warm-up, beside the last phase's own
  const int64_t phases = adapter.ends[0].grads_per_chain + adapter.ends[1].grads_per_chain;
  EXPECT_GT(phases, 50 * 5);
  EXPECT_GT(r.grads_warmup, phases + 200 * 5);
  EXPECT_EQ(r.grads_sampling, 1000 * 5);
  // the draws on the run's target: its mean and sds (within 5 MCSE); the latent draws, not mapped
  // back (the broken variant), are N(0, I) there and fail the same check
  const torch::Tensor mean = torch::tensor({4.0, -2.0, 1.0}, kF64), sd = torch::tensor({1.0, 2.0, 0.5}, kF64);
  EXPECT_EQ(test_support::moments_within(r.draws, mean, sd), "");
  TwoPhases again(target, false);
  EXPECT_TRUE(torch::equal(r.draws, run_in_phases(target, *hmc5(), kRun, again, 7).draws)) << "same seed, same draws";
  const torch::Tensor latent = (r.draws - mean) / sd;
  EXPECT_NE(test_support::moments_within(latent, mean, sd), "");
}

TEST(Phases, AnAdapterThatEndsTheRunLeavesNoDrawsAndCountsItsPhase) {
  GaussianTarget target = shifted_gaussian();
  auto hmc = hmc5();
  TwoPhases adapter(target, /*end_early=*/true);
  SampleResult r = run_in_phases(target, *hmc, kRun, adapter, 7);
  EXPECT_TRUE(r.complete);
  EXPECT_FALSE(r.draws.defined());
  ASSERT_EQ(adapter.ends.size(), 1u);
  EXPECT_EQ(r.grads_warmup, adapter.ends[0].grads_per_chain);
  EXPECT_EQ(r.grads_sampling, 0);
}

TEST(Phases, AKernelWithoutGradientsIsRefusedWithOneMessage) {
  GaussianTarget target = shifted_gaussian();
  auto rwm = make_baseline_kernel(ProposalOptions().set_sampler(SamplerKind::kRwm));
  TwoPhases adapter(target, false);
  try {
    run_in_phases(target, *rwm, kRun, adapter, 7);
    FAIL() << "a random walk gives no gradients to fit from";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("from gradients"), std::string::npos) << e.what();
  }
}
