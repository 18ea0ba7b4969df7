#pragma once
// The parts of `nmcmc reproduce` that reproduce.cpp and reproduce_jobs.cpp share (private to src/).
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "nmcmc/services/reproduce.hpp"

namespace nmcmc {

/// What the profile changes in the paper's config of an experiment, as "train.batch 8192 -> 256".
std::vector<std::string> profile_changes(const nlohmann::json& paper, const nlohmann::json& settings);
/// The directory of the experiments' configs: ReproduceOptions::configs, else the shipped ones.
std::string configs_of(const ReproduceOptions& o);
/// The paper's config of an experiment, read from configs_of(o).
nlohmann::json paper_config(const ReproduceOptions& o, const std::string& name);
/// The paper's config of an experiment with the profile's train/model settings applied.
nlohmann::json with_profile(nlohmann::json cfg, const nlohmann::json& settings);

/// Writes results.json in the run's output directory (atomically).
void write_results(const ReproduceOptions& o, const nlohmann::json& results);

/// Runs each unit (an experiment, "moon" or "ablation:VARIANT") as a child `nmcmc reproduce --part
/// UNIT`, o.jobs at a time, the costliest first; each finished experiment's entry.json goes into
/// results["experiments"] and results.json as it lands. ExitError when a job fails (with its log's
/// last lines) or the run is interrupted (130).
void run_units_as_jobs(const ReproduceOptions& o, std::vector<std::string> units, nlohmann::json& results,
                       const std::function<void(const std::string&)>& say);

}  // namespace nmcmc
