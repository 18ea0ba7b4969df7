// `nmcmc reproduce --jobs N`: the units of a run as child processes, N at a time, with their
// progress, an ETA and each failure's log.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "nmcmc/core/clock.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/services/jobs.hpp"
#include "nmcmc/targets/targets.hpp"
#include "reproduce_parts.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
bool is_experiment(const std::string& unit) {
  const auto& all = experiment_names();
  return std::find(all.begin(), all.end(), unit) != all.end();
}

/// What a unit of `reproduce --jobs` costs, in minutes of the cpu profile on one core (measured): the longest start first, so that the last to finish is a short one.
double unit_cost(const std::string& unit) {
  static const std::map<std::string, double> cost = {
      {"funnel3", 18.2}, {"funnel1", 13.4}, {"ablation:full", 9.6}, {"ablation:langevin", 5.7}, {"ablation:no-grad", 4.4},
      {"rotated_icg", 2.6}, {"icg", 2.5},  {"scg", 2.5},           {"german", 2.5},          {"australian", 2.0},
      {"heart", 1.5},     {"moon", 0.5}};
  auto it = cost.find(unit);
  return it == cost.end() ? 1.0 : it->second;
}

/// The last lines of a job's log, for an error message.
std::string log_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n    " + all[i];
  return out;
}

}  // namespace

void run_units_as_jobs(const ReproduceOptions& o, std::vector<std::string> units, json& results,
                       const std::function<void(const std::string&)>& say) {
  std::stable_sort(units.begin(), units.end(), [](const std::string& a, const std::string& b) { return unit_cost(a) > unit_cost(b); });
  const std::string logs = (fs::path(o.output) / "logs").string();
  ensure_directory(logs);
  std::vector<ChildJob> jobs;
  for (const auto& unit : units) {
    ChildJob job;
    job.name = unit;
    job.args = {"reproduce", "--part", unit, "--profile", o.profile, "--output", o.output, "--quiet"};
    if (!o.configs.empty()) job.args.insert(job.args.end(), {"--configs", o.configs});
    if (!o.figures) job.args.push_back("--no-figures");
    if (o.device != "cpu") job.args.insert(job.args.end(), {"--device", o.device});
    const bool variant = unit.rfind("ablation:", 0) == 0;  // the log's name without the colon
    job.log = (fs::path(logs) / ((variant ? "ablation_" + unit.substr(9) : unit) + ".log")).string();
    jobs.push_back(job);
  }
  const auto t0 = Clock::now();
  const int total = static_cast<int>(jobs.size());
  double cost_total = 0, cost_done = 0;
  for (const auto& unit : units) cost_total += unit_cost(unit);
  say(fmt::format("running {} jobs, {} at a time (each one process; its output in {}/)", total, o.jobs, logs));
  auto on_start = [&](size_t i, int running) {
    say(fmt::format("  started {} [{} running, {:.1f} min]", jobs[i].name, running, seconds_since(t0) / 60));
  };
  auto on_done = [&](size_t i, const ChildOutcome& out, int done, int running) {
    const std::string& unit = jobs[i].name;
    std::string what;
    if (out.code == 0 && is_experiment(unit)) {
      const std::string path = (fs::path(o.output) / unit / "entry.json").string();
      json entry = read_config_file(path);
      results["experiments"][unit] = entry;
      write_results(o, results);
      const json& l = entry["learned"];
      what = fmt::format(": learned ESS/grad min {:.4g}, accept {:.3f}, max R-hat {:.3f}", l.value("ess_per_grad_min", NAN),
                         l.value("accept", NAN), l.value("max_rhat", NAN));
    }
    cost_done += unit_cost(unit);
    const double elapsed = seconds_since(t0) / 60;
    // ETA: the remaining units' cost (the cpu profile's minutes per unit) at the rate so far.
    const std::string eta = done < total && cost_done > 0
                                ? fmt::format(", ~{:.0f} min to go", (cost_total - cost_done) * elapsed / cost_done)
                                : std::string();
    say(fmt::format("  {} {} in {:.1f} min{} [{} of {} done, {} running, {:.1f} min{}]", unit,
                        out.code == 0 ? "done" : "FAILED (" + out.note + ")", out.seconds / 60, what, done, total, running,
                        elapsed, eta));
  };
  if (!o.run_jobs) throw UsageError("reproduce --jobs: this caller gives no way to start child processes (ReproduceOptions::run_jobs)");
  JobsResult r = o.run_jobs(jobs, o.jobs, on_start, on_done);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ChildOutcome& out = r.outcomes[i];
    if (out.code == 0) continue;
    if (r.interrupted) {
      const size_t finished = results["experiments"].size();
      throw ExitError(finished > 0 ? fmt::format("interrupted; the {} finished experiment(s) are in {}/results.json, and a "
                                                 "rerun resumes the finished trainings", finished, o.output)
                                   : std::string("interrupted before any experiment finished; a rerun resumes the "
                                                 "finished trainings"),
                      130);
    }
    if (out.code < 0) continue;  // never started (after the failure reported here)
    throw ExitError(fmt::format("job {} {}; its log, {}, ends:{}", out.name, out.note, jobs[i].log, log_tail(jobs[i].log, 12)),
                    out.code >= 64 && out.code <= 78 ? out.code : kExitSoftware);
  }
  if (r.interrupted) throw ExitError("interrupted", 130);
}

}  // namespace nmcmc
