#pragma once
/// `nmcmc compare`: NUTS, HMC, MALA and the learned sampler on the same target with the same
/// chains, warm-up and draws, on one footing: what a user would pick instead, measured.
//
// What it reports: per sampler the sampling-only figures (ESS per draw, gradient and second) and
// the all-in ones (Note [All-in accounting], services/accounting.hpp: warm-up, and for the learned
// sampler its preconditioner and training, counted; the cost of 1,000 and 10,000 effective
// draws). NUTS runs with every metric that applies (Stan's diagonal, dense up to kMaxDenseDim
// parameters, and the two adapted from draws and gradients), and the learned sampler is compared
// with the best of them on each figure (Note [The best NUTS], compare.cpp). A run with R-hat above
// 1.01 or an accept rate below 0.05 is "not converged": no ESS ratio or break-even for it.
#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nmcmc/services/accounting.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/services/transport.hpp"

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
  /// NUTS's metrics (empty: all that apply: diag, dense up to kMaxDenseDim, fisher-diag,
  /// fisher-lowrank). The first is the one whose last draws start the learned sampler when its
  /// checkpoint has no chains of its own.
  std::vector<MetricAdapt> nuts_metrics;
  /// flow: also NUTS on the target pulled back through a flow fitted in warm-up ("nuts_flow",
  /// services/transport.hpp; one process), with the flow's fitting counted in its warm-up; auto:
  /// "nuts_auto" (Note [Choosing the transport]). Its layers, rounds and global moves as
  /// `nmcmc sample`'s (Note [The transport's options]).
  TransportChoice transport;
  /// Note [Warm starts]: a previous run of the same model on other data (its output directory or
  /// summary.json, or its "adaptation" record): adds "nuts_warm", NUTS started where that run
  /// ended with its step size and metric after `warm_warmup` warm-up iterations (the metric kept),
  /// the fair yardstick for a learned model trained on the previous data set (null: none).
  nlohmann::json warm_start;
  int64_t warm_warmup = 150;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CompareOptions, target, model, config, output, chains, warmup, draws,
                                                seed, dtype, hmc_leapfrog, nuts_metrics, transport, warm_start,
                                                warm_warmup)
/// CompareOptions from JSON (what the Python package passes; unset keys keep the defaults above):
/// UsageError naming an unknown key or a value of the wrong type.
CompareOptions compare_options_from_json(const nlohmann::json& j);

/// compare runs NUTS with a dense metric only up to this many parameters (its [D, D] estimate
/// and O(D^2) steps).
inline constexpr int64_t kMaxDenseDim = 1000;

/// Runs the comparison; `say` receives report lines. Returns what compare.json holds. With a
/// communicator of N processes (all call it together) the training is data-parallel and every
/// sampler's chains are shared out (run_sampler over the communicator); rank 0 reports and writes the files.
nlohmann::json compare(const CompareOptions& options, const std::function<void(const std::string&)>& say,
                       const TrainProgressFn& train_progress = nullptr, const ProgressFn& sample_progress = nullptr,
                       const std::function<bool()>& should_stop = nullptr,
                       std::shared_ptr<parallel::Communicator> comm = nullptr);

/// The comparison as markdown: the sampling-only table, the all-in table, and the learned
/// sampler against the best NUTS.
std::string compare_table(const nlohmann::json& results);

}  // namespace nmcmc
