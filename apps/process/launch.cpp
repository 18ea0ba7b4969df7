#include "nmcmc/process/launch.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/parallel/communicator.hpp"

namespace nmcmc {

namespace {
volatile std::sig_atomic_t g_signals = 0;
volatile std::sig_atomic_t g_last_signal = SIGINT;
void on_signal(int sig) {
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

/// While alive: SIGINT and SIGTERM are counted in g_signals (and the last one kept) instead of
/// ending the process; the previous handlers come back when it goes, also on an exception.
class SignalCatcher {
 public:
  SignalCatcher() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signals = 0;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalCatcher() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_{};
};

/// In a forked child: replaces it with `program args...`; on failure says why and exits 127.
[[noreturn]] void exec_program(const std::string& program, const std::vector<std::string>& args, const char* who) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  const std::string msg = fmt::format("{}: cannot run {}: {}\n", who, program, std::strerror(errno));
  (void)!::write(2, msg.data(), msg.size());
  ::_exit(127);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}
}  // namespace

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw IoError("cannot find the nmcmc executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

LaunchResult launch_local(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 256) throw UsageError(fmt::format("launch: --nproc must be in 1..256, got {}", o.nproc));
  if (o.args.empty()) throw UsageError("launch: give the command to run after --, e.g. nmcmc launch --nproc 2 -- train ...");
  if (o.args.front() == "launch") throw UsageError("launch: the command cannot be launch itself");
  if (o.port < 0 || o.port > 65535) throw UsageError(fmt::format("launch: --port must be in 0..65535, got {}", o.port));
  if (!(o.timeout > 0) || !std::isfinite(o.timeout)) throw UsageError("launch: --dist-timeout must be positive");
  const std::string program = o.program.empty() ? self_executable() : o.program;
  const int port = o.port > 0 ? o.port : parallel::free_local_port();
  const double grace = o.grace >= 0 ? o.grace : o.timeout + 30;

  const SignalCatcher catcher;  // counts SIGINT / SIGTERM in g_signals until this returns

  std::vector<pid_t> pids(o.nproc, -1);
  LaunchResult result;
  result.codes.assign(o.nproc, -1);
  for (int r = 0; r < o.nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (int k = 0; k < r; ++k) ::kill(pids[k], SIGTERM);
      throw IoError(std::string("launch: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // The rank: its own process group, so a terminal's Ctrl-C reaches the launcher only (which
      // forwards it once); default signal dispositions; the torchrun variables.
      ::setpgid(0, 0);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("NMCMC_DIST_TIMEOUT", fmt::format("{}", std::max(1L, std::lround(o.timeout))).c_str(), 1);
      exec_program(program, o.args, "nmcmc launch");
    }
    pids[r] = pid;
  }

  using clock = std::chrono::steady_clock;
  int alive = o.nproc, forwarded = 0;
  std::optional<clock::time_point> failed_at;
  bool terminated = false, killed = false;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < o.nproc; ++r) {
        if (pids[r] != pid) continue;
        result.codes[r] = exit_code(status);
        pids[r] = -1;
        --alive;
        if (WIFSIGNALED(status)) {
          result.notes.push_back(fmt::format("rank {} was killed by signal {} ({})", r, WTERMSIG(status),
                                             strsignal(WTERMSIG(status))));
        } else if (result.codes[r] != 0) {
          result.notes.push_back(fmt::format("rank {} exited with code {}", r, result.codes[r]));
        }
        if (result.codes[r] != 0 && !failed_at) failed_at = clock::now();
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    // Forward each Ctrl-C / SIGTERM once to every live rank.
    while (forwarded < g_signals) {
      ++forwarded;
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, g_last_signal);
      }
    }
    if (failed_at) {
      const double since = std::chrono::duration<double>(clock::now() - *failed_at).count();
      if (!terminated && since > grace) {
        terminated = true;
        for (int r = 0; r < o.nproc; ++r) {
          if (pids[r] > 0) {
            ::kill(pids[r], SIGTERM);
            ::kill(pids[r], SIGCONT);  // a stopped rank must run to see it
            result.notes.push_back(fmt::format("rank {} was still running {:.0f} s after another rank failed: terminated",
                                               r, since));
          }
        }
      } else if (terminated && !killed && since > grace + 10) {
        killed = true;
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGKILL);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int c : result.codes) result.code = std::max(result.code, c);
  return result;
}

JobsResult run_jobs(const std::vector<ChildJob>& jobs, int parallel, const std::function<void(size_t, int)>& on_start,
                    const std::function<void(size_t, const ChildOutcome&, int, int)>& on_done) {
  if (parallel < 1) throw UsageError(fmt::format("jobs: the number of parallel jobs must be at least 1, got {}", parallel));
  const std::string program = self_executable();
  JobsResult result;
  result.outcomes.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) result.outcomes[i].name = jobs[i].name;

  const SignalCatcher catcher;  // counts SIGINT / SIGTERM in g_signals until this returns
  const pid_t parent = ::getpid();

  using clock = std::chrono::steady_clock;
  struct Running {
    pid_t pid;
    size_t job;
    clock::time_point start;
  };
  std::vector<Running> running;
  size_t next = 0;
  int done = 0, forwarded = 0;
  bool failed = false;
  auto start = [&](size_t i) {
    const ChildJob& job = jobs[i];
    const pid_t pid = ::fork();
    if (pid < 0) throw IoError(std::string("cannot start a job: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(143);  // the parent died before prctl
      ::setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
      const int fd = ::open(job.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) {
        const std::string msg = fmt::format("nmcmc: cannot write the job log {}: {}\n", job.log, std::strerror(errno));
        (void)!::write(2, msg.data(), msg.size());
        ::_exit(kExitIo);
      }
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
      exec_program(program, job.args, "nmcmc");
    }
    running.push_back({pid, i, clock::now()});
    if (on_start) on_start(i, static_cast<int>(running.size()));
  };
  while (true) {
    while (!failed && g_signals == 0 && next < jobs.size() && static_cast<int>(running.size()) < parallel) start(next++);
    if (running.empty()) break;
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = std::find_if(running.begin(), running.end(), [&](const Running& r) { return r.pid == pid; });
      if (it == running.end()) continue;
      ChildOutcome& out = result.outcomes[it->job];
      out.code = exit_code(status);
      out.seconds = std::chrono::duration<double>(clock::now() - it->start).count();
      if (WIFSIGNALED(status)) {
        out.note = fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
      } else if (out.code != 0) {
        out.note = fmt::format("exited with code {}", out.code);
      }
      if (out.code != 0) failed = true;
      const size_t job = it->job;
      running.erase(it);
      ++done;
      if (on_done) on_done(job, out, done, static_cast<int>(running.size()));
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    while (forwarded < g_signals) {
      ++forwarded;
      for (const auto& r : running) ::kill(r.pid, g_last_signal);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  result.interrupted = g_signals > 0;
  return result;
}

}  // namespace nmcmc
