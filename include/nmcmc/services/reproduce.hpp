#pragma once
/// `nmcmc reproduce`: the paper's experiments (section 4.1 and appendix) with one command,
/// our figures printed beside the paper's.
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "nmcmc/services/jobs.hpp"
#include "nmcmc/services/train.hpp"

namespace nmcmc {

struct ReproduceOptions {
  std::string profile = "cpu";          // smoke | cpu | paper
  std::vector<std::string> only;        // experiment names; empty = all
  std::string output = "results";
  std::string configs;                  // where the experiment configs live (empty: configs_directory())
  bool figures = true;
  /// Experiments run side by side, each in its own process (1: one after another in this one).
  /// Results do not depend on it; the times and per-second figures include the contention.
  int jobs = 1;
  /// Starts the child processes of jobs > 1 (the program's apps/process run_jobs); required then.
  JobRunner run_jobs;
  /// Internal (the child processes of jobs > 1): run only this unit, an experiment name, "moon"
  /// or "ablation:<variant>", and write <output>/<name>/entry.json instead of the results files.
  std::string part;
  /// Where training and the evaluation run: "cpu", "cuda" or "cuda:N" (the baselines too; the
  /// moon and ablation units train there as well). Recorded in results.json.
  std::string device = "cpu";
  /// Polled between training steps: a stop checkpoints the training in progress and ends the run
  /// with ExitError 130 (a rerun resumes it from that checkpoint).
  std::function<bool()> should_stop;
};

/// The experiments, in the paper's order.
const std::vector<std::string>& experiment_names();

/// What a profile changes, per experiment: train batch/steps, model width overrides, eval sizes.
nlohmann::json profile_settings(const std::string& profile, const std::string& experiment);

/// Runs the experiments; `say` receives human-readable progress lines, `progress` training
/// progress. Writes results.json, results.md and the figures into options.output and returns
/// the results.
nlohmann::json reproduce(const ReproduceOptions& options, const std::function<void(const std::string&)>& say,
                         const TrainProgressFn& progress);

/// The markdown table of results (ours beside the paper's).
std::string results_table(const nlohmann::json& results);

}  // namespace nmcmc
