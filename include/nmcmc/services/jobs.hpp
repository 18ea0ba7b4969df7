#pragma once
/// Child jobs that a service (reproduce --jobs) asks the program to run. The library only
/// describes them; starting and supervising processes is the program's business
/// (apps/process/launch.hpp: run_jobs), handed to the service as a JobRunner.
#include <functional>
#include <string>
#include <vector>

namespace nmcmc {

/// One child nmcmc command of run_jobs.
struct ChildJob {
  std::string name;               // for messages
  std::vector<std::string> args;  // the nmcmc command and its arguments (without the program name)
  std::string log;                // the child's stdout and stderr (the file is truncated first)
};

struct ChildOutcome {
  std::string name;
  int code = -1;  // exit code; a signal counts as 128 + its number; -1: never started
  double seconds = 0;
  std::string note;  // e.g. "killed by signal 9"; empty on success
};

struct JobsResult {
  std::vector<ChildOutcome> outcomes;  // one per job, in the jobs' order
  bool interrupted = false;            // a Ctrl-C / SIGTERM reached this process
};

/// Runs `jobs`, at most `parallel` at a time; `on_start(i, running)` and
/// `on_done(i, outcome, done, running)` are called as they start and end (see run_jobs).
using JobRunner = std::function<JobsResult(const std::vector<ChildJob>& jobs, int parallel,
                                           const std::function<void(size_t, int)>& on_start,
                                           const std::function<void(size_t, const ChildOutcome&, int, int)>& on_done)>;

}  // namespace nmcmc
