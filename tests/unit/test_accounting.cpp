// All-in accounting (Note [All-in accounting], Note [The best NUTS]): the cost of a number of
// effective draws, the break-even of two samplers, and the comparison with the best of several.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nmcmc/services/accounting.hpp"

using namespace nmcmc;

namespace {
RunCost cost(double fixed_grads, double fixed_seconds, double sampling_grads, double sampling_seconds, double ess) {
  RunCost c;
  c.fixed_grads = fixed_grads;
  c.fixed_seconds = fixed_seconds;
  c.sampling_grads = sampling_grads;
  c.sampling_seconds = sampling_seconds;
  c.ess = ess;
  return c;
}
}  // namespace

TEST(Accounting, CostOfGoalsAndAllInRates) {
  const RunCost c = cost(1000, 10, 4000, 2, 2000);  // 2 gradients and 1 ms per effective draw
  EXPECT_DOUBLE_EQ(c.grads_per_ess(), 2.0);
  EXPECT_DOUBLE_EQ(c.grads_for(10000), 21000.0);
  EXPECT_DOUBLE_EQ(c.seconds_for(1000), 11.0);
  const auto j = all_in_json(c);
  EXPECT_DOUBLE_EQ(j["all_in_ess_per_grad"].get<double>(), 2000.0 / 5000.0);
  EXPECT_DOUBLE_EQ(j["all_in_ess_per_second"].get<double>(), 2000.0 / 12.0);
  EXPECT_DOUBLE_EQ(j["grads_for_1000"].get<double>(), 3000.0);
  EXPECT_DOUBLE_EQ(j["seconds_for_10000"].get<double>(), 20.0);
  // Without ESS there is no rate: no finite cost is reported.
  EXPECT_TRUE(all_in_json(cost(1, 1, 1, 1, 0))["grads_for_1000"].is_null());
  // Round trip through JSON.
  const RunCost back = run_cost_from_json(to_json_value(c));
  EXPECT_EQ(back.fixed_grads, c.fixed_grads);
  EXPECT_EQ(back.ess, c.ess);
}

TEST(Accounting, BreakEvenInEveryCase) {
  // A pays 1000 up front, then 1 per effective draw; B pays 0, then 3: equal at 500 (cost 1500).
  BreakEven b = break_even(1000, 1, 0, 3);
  EXPECT_EQ(b.kind, BreakEven::Kind::kFrom);
  EXPECT_DOUBLE_EQ(b.ess, 500.0);
  EXPECT_DOUBLE_EQ(b.cost, 1500.0);
  // Cheaper up front and per draw: always; dearer in both: never.
  EXPECT_EQ(break_even(0, 1, 10, 3).kind, BreakEven::Kind::kAlways);
  EXPECT_EQ(break_even(10, 3, 0, 1).kind, BreakEven::Kind::kNever);
  // Cheaper up front but dearer per draw: only short runs (below 5 effective draws here).
  b = break_even(0, 3, 10, 1);
  EXPECT_EQ(b.kind, BreakEven::Kind::kUntil);
  EXPECT_DOUBLE_EQ(b.ess, 5.0);
  // A sampler without ESS never breaks even; against one without ESS it always does.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(break_even(0, inf, 10, 1).kind, BreakEven::Kind::kNever);
  EXPECT_EQ(break_even(10, 1, 0, inf).kind, BreakEven::Kind::kAlways);
  EXPECT_EQ(describe(break_even(1000, 1, 0, 3), "gradients"), "from 500 effective draws on (1.5e+03 gradients)");
}

TEST(Accounting, AgainstTheBestNutsFigureByFigure) {
  // Two NUTS runs: "cheap" has the smaller fixed cost, "fast" the better rate; the learned
  // sampler (large fixed cost, best rate) is measured against the best on each figure, and its
  // break-even is the later of its two.
  const RunCost learned = cost(100000, 100, 1000, 1, 1000);  // 1 gradient, 1 ms per effective draw
  std::map<std::string, RunCost> nuts{{"cheap", cost(1000, 1, 10000, 10, 1000)},    // 10 per draw
                                      {"fast", cost(20000, 20, 5000, 5, 1000)}};    // 5 per draw
  const auto v = against_best(learned, nuts);
  EXPECT_EQ(v["ess_per_grad"]["nuts"], "fast");
  EXPECT_DOUBLE_EQ(v["ess_per_grad"]["ratio"].get<double>(), 5.0);
  EXPECT_EQ(v["grads_for_1000"]["nuts"], "cheap");  // 1000 + 10,000 against 20000 + 5,000
  EXPECT_DOUBLE_EQ(v["grads_for_1000"]["ratio"].get<double>(), 11000.0 / 101000.0);
  // break-evens: against cheap (100000 - 1000) / 9 = 11000; against fast 80000 / 4 = 20000
  EXPECT_EQ(v["break_even_grads"]["kind"], "from");
  EXPECT_DOUBLE_EQ(v["break_even_grads"]["effective_draws"].get<double>(), 20000.0);
  // A NUTS run it never beats makes it "never".
  nuts["better"] = cost(1000, 1, 500, 0.5, 1000);
  EXPECT_EQ(against_best(learned, nuts)["break_even_grads"]["kind"], "never");
  EXPECT_TRUE(against_best(learned, {}).empty());
}
