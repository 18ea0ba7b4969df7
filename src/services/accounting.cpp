#include "nmcmc/services/accounting.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace nmcmc {

double RunCost::grads_per_ess() const { return ess > 0 ? sampling_grads / ess : std::numeric_limits<double>::infinity(); }

double RunCost::seconds_per_ess() const {
  return ess > 0 ? sampling_seconds / ess : std::numeric_limits<double>::infinity();
}

nlohmann::json to_json_value(const RunCost& c) {
  return {{"fixed_grads", c.fixed_grads},
          {"fixed_seconds", c.fixed_seconds},
          {"sampling_grads", c.sampling_grads},
          {"sampling_seconds", c.sampling_seconds},
          {"ess", c.ess}};
}

RunCost run_cost_from_json(const nlohmann::json& j) {
  RunCost c;
  c.fixed_grads = j.at("fixed_grads").get<double>();
  c.fixed_seconds = j.at("fixed_seconds").get<double>();
  c.sampling_grads = j.at("sampling_grads").get<double>();
  c.sampling_seconds = j.at("sampling_seconds").get<double>();
  c.ess = j.at("ess").get<double>();
  return c;
}

nlohmann::json all_in_json(const RunCost& c) {
  nlohmann::json j;
  j["fixed_grads"] = c.fixed_grads;
  j["fixed_seconds"] = c.fixed_seconds;
  j["all_in_ess_per_grad"] = c.ess / (c.fixed_grads + c.sampling_grads);
  j["all_in_ess_per_second"] = c.ess / (c.fixed_seconds + c.sampling_seconds);
  for (double goal : kAllInGoals) {
    const double g = c.grads_for(goal), s = c.seconds_for(goal);
    j[fmt::format("grads_for_{:.0f}", goal)] = std::isfinite(g) ? nlohmann::json(g) : nlohmann::json(nullptr);
    j[fmt::format("seconds_for_{:.0f}", goal)] = std::isfinite(s) ? nlohmann::json(s) : nlohmann::json(nullptr);
  }
  return j;
}

BreakEven break_even(double fixed_a, double rate_a, double fixed_b, double rate_b) {
  BreakEven b;
  if (!std::isfinite(rate_a) || !std::isfinite(fixed_a)) return b;  // A never delivers: never
  if (!std::isfinite(rate_b) || !std::isfinite(fixed_b)) {
    b.kind = BreakEven::Kind::kAlways;
    return b;
  }
  const double fixed = fixed_a - fixed_b, saving = rate_b - rate_a;  // per effective draw
  if (saving > 0) {
    if (fixed <= 0) {
      b.kind = BreakEven::Kind::kAlways;
      return b;
    }
    b.kind = BreakEven::Kind::kFrom;
  } else {
    if (fixed >= 0) return b;  // costs more up front and per draw: never
    if (saving == 0) {
      b.kind = BreakEven::Kind::kAlways;
      return b;
    }
    b.kind = BreakEven::Kind::kUntil;  // cheaper up front, dearer per draw
  }
  b.ess = fixed / saving;
  b.cost = fixed_a + b.ess * rate_a;
  return b;
}

nlohmann::json to_json_value(const BreakEven& b) {
  static const char* names[] = {"always", "from", "never", "until"};
  nlohmann::json j = {{"kind", names[static_cast<int>(b.kind)]}};
  if (b.kind == BreakEven::Kind::kFrom || b.kind == BreakEven::Kind::kUntil) {
    j["effective_draws"] = b.ess;
    j["cost"] = b.cost;
  }
  return j;
}

std::string describe(const BreakEven& b, const std::string& unit) {
  switch (b.kind) {
    case BreakEven::Kind::kAlways: return "always (cheaper at every run length)";
    case BreakEven::Kind::kNever: return "never";
    case BreakEven::Kind::kFrom: return fmt::format("from {:.3g} effective draws on ({:.3g} {})", b.ess, b.cost, unit);
    case BreakEven::Kind::kUntil: return fmt::format("only below {:.3g} effective draws ({:.3g} {})", b.ess, b.cost, unit);
  }
  return "never";
}

nlohmann::json against_best(const RunCost& learned, const std::map<std::string, RunCost>& nuts) {
  nlohmann::json out = nlohmann::json::object();
  if (nuts.empty()) return out;
  // the NUTS run with the lowest cost by `cost`, and the ratio (its cost over the learned one's)
  auto best = [&](const std::function<double(const RunCost&)>& cost) {
    std::string who;
    double v = std::numeric_limits<double>::infinity();
    for (const auto& [name, c] : nuts) {
      const double x = cost(c);
      if (x < v || who.empty()) {
        v = x;
        who = name;
      }
    }
    const double mine = cost(learned);
    return nlohmann::json{{"nuts", who}, {"nuts_value", v}, {"learned", mine}, {"ratio", v / mine}};
  };
  // sampling only: reported as ESS per gradient / per second (the inverse of the cost per ESS)
  for (const char* key : {"ess_per_grad", "ess_per_second"}) {
    const bool g = std::string(key) == "ess_per_grad";
    nlohmann::json b = best([g](const RunCost& c) { return g ? c.grads_per_ess() : c.seconds_per_ess(); });
    b["nuts_value"] = 1.0 / b["nuts_value"].get<double>();
    b["learned"] = 1.0 / b["learned"].get<double>();
    out[key] = b;
  }
  for (double goal : kAllInGoals) {
    out[fmt::format("grads_for_{:.0f}", goal)] = best([goal](const RunCost& c) { return c.grads_for(goal); });
    out[fmt::format("seconds_for_{:.0f}", goal)] = best([goal](const RunCost& c) { return c.seconds_for(goal); });
  }
  for (const bool g : {true, false}) {
    double from = 0, until = std::numeric_limits<double>::infinity();
    bool never = false;
    for (const auto& [name, c] : nuts) {
      const BreakEven b = g ? break_even(learned.fixed_grads, learned.grads_per_ess(), c.fixed_grads, c.grads_per_ess())
                            : break_even(learned.fixed_seconds, learned.seconds_per_ess(), c.fixed_seconds, c.seconds_per_ess());
      if (b.kind == BreakEven::Kind::kNever) never = true;
      if (b.kind == BreakEven::Kind::kFrom) from = std::max(from, b.ess);
      if (b.kind == BreakEven::Kind::kUntil) until = std::min(until, b.ess);
    }
    BreakEven all;  // never, unless it beats every one over some range
    if (!never && from < until) {
      all.kind = std::isfinite(until) ? BreakEven::Kind::kUntil : from > 0 ? BreakEven::Kind::kFrom : BreakEven::Kind::kAlways;
      all.ess = std::isfinite(until) ? until : from;
      all.cost = g ? learned.grads_for(all.ess) : learned.seconds_for(all.ess);
    }
    nlohmann::json j = to_json_value(all);
    j["text"] = describe(all, g ? "gradients" : "seconds");
    out[g ? "break_even_grads" : "break_even_seconds"] = j;
  }
  return out;
}

}  // namespace nmcmc
