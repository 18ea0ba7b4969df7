#pragma once
/// All-in accounting: what a run costs when everything paid before its first kept draw counts.
//
// Note [All-in accounting]
// A sampler's cost has a fixed part F, paid before the first kept draw (its warm-up; for the
// learned sampler also the preconditioner's warm-up and the training), and a sampling rate r per
// effective draw (the kept draws' gradients or seconds over their minimum bulk-ESS). E effective
// draws then cost F + E r; `compare`, `reproduce` and the posteriordb benchmark report that at
// E = 1,000 and 10,000, in gradients and in seconds, beside the sampling-only rates, and the
// all-in rate of the run itself (its ESS over everything it cost). Two samplers A (more fixed
// cost, a lower rate) and B cost the same at the break-even
//   E* = (F_A - F_B) / (r_B - r_A),
// from which A is cheaper; if A's rate is not lower it never is (unless its fixed cost is lower
// too: then it always is). In seconds the same with seconds for gradients: the break-even in
// gradients counts work, the one in seconds what the user waits (a learned sampler's batched
// gradients cost little more than single ones, a network evaluation may cost more than a cheap
// gradient).
//
// Note [The best NUTS]
// The learned sampler is compared with the best of the NUTS runs that converged (one per metric),
// figure by figure: sampling-only ESS per gradient and per second against the NUTS run with the
// most of each; the cost of 1,000 and 10,000 effective draws (all-in) against the cheapest; the
// break-even (in gradients, and in seconds) is the run length from which it is cheaper than every
// one of them: the latest of its break-evens against each ("never" if it never beats one of them;
// "only below" when it beats one only in short runs).
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace nmcmc {

/// One run's costs (gradients are target gradient evaluations, summed over chains).
struct RunCost {
  double fixed_grads = 0, fixed_seconds = 0;        // warm-up (+ preconditioner + training)
  double sampling_grads = 0, sampling_seconds = 0;  // the kept draws
  double ess = 0;                                   // their minimum bulk-ESS over parameters
  /// Gradients or seconds per effective draw of sampling (infinite without ESS).
  double grads_per_ess() const;
  double seconds_per_ess() const;
  /// The cost of `goal` effective draws: fixed + goal x rate.
  double grads_for(double goal) const { return fixed_grads + goal * grads_per_ess(); }
  double seconds_for(double goal) const { return fixed_seconds + goal * seconds_per_ess(); }
};

/// {"fixed_grads", "fixed_seconds", "sampling_grads", "sampling_seconds", "ess"} and back.
nlohmann::json to_json_value(const RunCost& cost);
RunCost run_cost_from_json(const nlohmann::json& cost);

/// The effective-draw goals reported (1,000 and 10,000).
inline constexpr double kAllInGoals[] = {1000.0, 10000.0};

/// {fixed_grads, fixed_seconds, all_in_ess_per_grad, all_in_ess_per_second, grads_for_1000,
///  seconds_for_1000, grads_for_10000, seconds_for_10000}
nlohmann::json all_in_json(const RunCost& cost);

/// Where A (typically the learned sampler) becomes cheaper than B, in one currency.
struct BreakEven {
  enum class Kind { kAlways, kFrom, kNever, kUntil } kind = Kind::kNever;
  double ess = 0;   // kFrom: from this many effective draws on; kUntil: up to this many
  double cost = 0;  // what either costs there (gradients or seconds)
};
/// Note [All-in accounting]: the break-even of (fixed_a, rate_a) against (fixed_b, rate_b).
BreakEven break_even(double fixed_a, double rate_a, double fixed_b, double rate_b);
/// {"kind": "always|from|never|until", "effective_draws", "cost"}
nlohmann::json to_json_value(const BreakEven& b);
/// "from 1.2e+04 effective draws (3.4e+06 gradients)", "never", ...; `unit` names the cost.
std::string describe(const BreakEven& b, const std::string& unit);

/// Note [The best NUTS]: `learned` against the best of `nuts` (name -> cost; only runs that
/// converged belong there), figure by figure. Returns
///   {"ess_per_grad" | "ess_per_second": {"nuts", "nuts_value", "learned", "ratio"}  (sampling only),
///    "grads_for_1000" | "seconds_for_1000" | ..._10000: {"nuts", "nuts_value", "learned", "ratio"},
///    "break_even_grads" | "break_even_seconds": to_json_value + {"text"}}
/// with every ratio NUTS's cost over the learned sampler's (above 1: the learned sampler wins);
/// an empty object when `nuts` is empty.
nlohmann::json against_best(const RunCost& learned, const std::map<std::string, RunCost>& nuts);

}  // namespace nmcmc
