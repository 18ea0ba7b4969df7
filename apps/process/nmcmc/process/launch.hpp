#pragma once
/// Process supervision for the `nmcmc` program (apps/, not the library): `nmcmc launch`, N local
/// ranks of one nmcmc command on loopback, as torchrun starts PyTorch's.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "nmcmc/services/jobs.hpp"

namespace nmcmc {

struct LaunchOptions {
  int nproc = 2;
  std::vector<std::string> args;  // the nmcmc command and its arguments (without the program name)
  std::string program;            // the nmcmc executable (empty: this process's own)
  int port = 0;                   // MASTER_PORT (0: a free one)
  double timeout = 300;           // NMCMC_DIST_TIMEOUT for the ranks, seconds
  /// After a rank fails, how long the others get to notice and stop by themselves before they are
  /// terminated (they stop at once when the failed rank's connections close; a hung one needs
  /// the timeout). Negative: the timeout plus 30 s.
  double grace = -1;
};

/// What became of the ranks.
struct LaunchResult {
  int code = 0;                    // the worst exit code (a signal counts as 128 + its number)
  std::vector<int> codes;          // per rank
  std::vector<std::string> notes;  // e.g. "rank 1 was killed by signal 9"
};

/// Starts the ranks with MASTER_ADDR=127.0.0.1, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK set, each
/// in its own process group; forwards SIGINT and SIGTERM to them (once per signal received), so
/// one Ctrl-C makes every rank save once and stop; waits for all. UsageError for bad options.
LaunchResult launch_local(const LaunchOptions& options);

/// The nmcmc executable this process runs (/proc/self/exe); IoError when it cannot be found.
std::string self_executable();

/// Runs the jobs as child processes of this executable, at most `parallel` at a time, started in
/// the order given. Each child gets OPENBLAS_NUM_THREADS=1 unless the environment sets it (two
/// BLAS pools per core slow every job), its own process group, and SIGTERM when this process
/// dies. `on_start(i, running)` and `on_done(i, outcome, done, running)` run in this process.
/// After a job fails no other starts; those running finish. A Ctrl-C or SIGTERM is forwarded once
/// to the running jobs, none starts after it, and the result says `interrupted`.
/// UsageError when parallel < 1.
JobsResult run_jobs(const std::vector<ChildJob>& jobs, int parallel,
                    const std::function<void(size_t, int)>& on_start,
                    const std::function<void(size_t, const ChildOutcome&, int, int)>& on_done);

}  // namespace nmcmc
