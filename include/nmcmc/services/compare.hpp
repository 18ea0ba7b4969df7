#pragma once
/// `nmcmc compare`: NUTS, HMC, MALA and the learned sampler on the same target with the same
/// chains, warm-up and draws, on one footing: what a user would pick instead, measured.
//
// Note [Break-even]
// With ESS per draw e and gradients per draw g for each sampler, and G the learned sampler's
// training gradients (per batch row times batch rows), N total draws cost G + N g_L gradients
// for N e_L effective draws with the learned sampler and N g_N for N e_N with NUTS. The learned
// sampler's total cost per unit of ESS falls below NUTS's once
//   N > G / (g_N e_L / e_N - g_L),
// and never when g_N e_L / e_N <= g_L (it is not cheaper per gradient even without training).
// e is the minimum bulk-ESS per draw over the parameters (Stan's convention).
#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>

#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"

namespace nmcmc {

struct CompareOptions {
  nlohmann::json target;                 // the target spec (with a model or config: must agree with it, or null)
  std::optional<std::string> model;      // a trained learned sampler (checkpoint)
  std::optional<std::string> config;     // a training config: trains the learned sampler first (resumable)
  std::string output = "compare";        // compare.json, compare.md, compare_traces.png (and the model)
  int64_t chains = 4, warmup = 1000, draws = 1000;
  uint64_t seed = 1;
  std::string dtype = "float32";
  int64_t hmc_leapfrog = 10;
};

/// Runs the comparison; `say` receives report lines. Returns what compare.json holds. With a
/// communicator of N processes (all call it together) the training is data-parallel and every
/// sampler's chains are shared out (run_sampler over the communicator); rank 0 reports and writes the files.
nlohmann::json compare(const CompareOptions& options, const std::function<void(const std::string&)>& say,
                       const TrainProgressFn& train_progress = nullptr, const ProgressFn& sample_progress = nullptr,
                       const std::function<bool()>& should_stop = nullptr,
                       std::shared_ptr<parallel::Communicator> comm = nullptr);

/// The comparison as a markdown table (with the break-even line when there is a learned sampler).
std::string compare_table(const nlohmann::json& results);

/// Note [Break-even]: total draws from which the learned sampler's gradients (training +
/// sampling) per unit of ESS fall below NUTS's; nullopt if never.
std::optional<double> break_even_draws(double training_grads, double g_learned, double e_learned, double g_nuts,
                                       double e_nuts);

}  // namespace nmcmc
