// Invariance of every baseline kernel on icg, scg and Funnel-3, and the power of the same
// tests against deliberately broken kernels. See Note [Invariance tests] in support/stats.hpp
// for the false-fail rate (1e-6 per case) and the smallest detectable error.
#include <gtest/gtest.h>

#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {
const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr int64_t kChains = 20000;
constexpr int64_t kSteps = 10;
constexpr int kProjections = 20;

/// Runs the kernel from exact draws and whitens the result with the target's known law.
test_support::InvarianceReport invariance(const json& spec, std::shared_ptr<Proposal> proposal, uint64_t seed) {
  auto target = make_target(spec, kF64);
  torch::Tensor x = test_support::run_from_exact(*target, std::move(proposal), kChains, kSteps, seed);
  torch::Tensor z;
  if (spec["name"] == "funnel") {
    z = test_support::whiten_funnel(x, spec["sigma"].get<double>());
  } else {
    auto* g = dynamic_cast<GaussianTarget*>(target.get());
    z = test_support::whiten_gaussian(x, g->reference_moments()->mean, g->covariance());
  }
  return test_support::normal_tests(z, kProjections, seed + 1000);
}

const json kIcg = {{"name", "icg"}};
const json kScg = {{"name", "scg"}};
const json kFunnel3 = {{"name", "funnel"}, {"dim", 20}, {"sigma", 3.0}};
}  // namespace

TEST(Invariance, RandomWalk) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.05}, std::pair{kScg, 0.5}, std::pair{kFunnel3, 0.3}}) {
    auto r = invariance(spec, std::make_shared<RandomWalk>(eps), 101);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(Invariance, Mala) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.3}, std::pair{kFunnel3, 0.25}}) {
    auto r = invariance(spec, std::make_shared<Mala>(eps), 102);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(Invariance, Hmc) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<Hmc>(eps, 8), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_TRUE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(Invariance, HmcWithMassMatrix) {
  auto hmc = std::make_shared<Hmc>(0.6, 5);
  hmc->set_inv_mass(torch::logspace(-2, 2, 50, 10.0, kF64));  // the icg variances
  auto r = invariance(kIcg, hmc, 104);
  EXPECT_TRUE(r.passes()) << r.describe();
}

// ---- power: the same tests must reject broken kernels ----

TEST(InvariancePower, MalaWithoutQRatioFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kFunnel3, 0.25}}) {
    auto r = invariance(spec, std::make_shared<Mala>(eps, /*drop_q_ratio=*/true), 102);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_FALSE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(InvariancePower, HmcWithWrongKineticSignFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<Hmc>(eps, 8, HmcDefect::kWrongKineticSign), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_FALSE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}

TEST(InvariancePower, HmcWithIrreversibleIntegratorFails) {
  for (auto [spec, eps] : {std::pair{kIcg, 0.12}, std::pair{kScg, 0.25}, std::pair{kFunnel3, 0.15}}) {
    auto r = invariance(spec, std::make_shared<Hmc>(eps, 8, HmcDefect::kNoFinalHalfStep), 103);
    std::cout << "  " << spec.dump() << ": " << r.describe() << "\n";
    EXPECT_FALSE(r.passes()) << spec.dump() << ": " << r.describe();
  }
}
