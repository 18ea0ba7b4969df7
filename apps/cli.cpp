#include "cli.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "nmcmc/process/environment.hpp"
#include "nmcmc/process/allocator.hpp"
#include "nmcmc/process/blas_kernels.hpp"
#include "nmcmc/process/blas_check.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/tensor_options.hpp"
#include "nmcmc/version.hpp"

namespace nmcmc::cli {

using json = nlohmann::json;

namespace {
std::string g_command_line;
std::atomic<bool> g_stop{false};
// The first Ctrl-C asks the running command to stop cleanly (at its next step, saving what it
// has); a second one, e.g. while a long summary is computed, ends the process at once.
void on_signal(int sig) {
  if (g_stop.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}
const char* const kTargetOptions[] = {"--target", "--dim", "--sigma", "--dataset", "--data-file", "--label-column",
                                      "--target-seed", "--target-json", "--module", "--module-output",
                                      "--module-engine", "--stan", "--data"};
}  // namespace

const std::string& command_line() { return g_command_line; }
void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + std::string(argv[i]);
}

bool stop_requested() { return g_stop.load(); }
void install_stop_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

void warn_blas() {
  auto report = check_blas(false);
  if (!report.ok) std::cerr << "\n" << report.message << "\n\n";
}

std::string version_text(bool measure_blas) {
  auto report = check_blas(measure_blas);
  std::string blas = report.library.empty() ? "unknown" : report.library;
  if (measure_blas) blas += fmt::format(" ({:.1f} GFLOP/s on a 512x512 sgemm, {} threads)", report.gflops, torch::get_num_threads());
  return fmt::format("nmcmc {}\nLibTorch {}\nBLAS: {}\nOpenBLAS kernels: {}\nmalloc: {}", NMCMC_VERSION, TORCH_VERSION, blas,
                     blas_kernels().describe(), tune_allocator().message);
}

void TargetArgs::add(CLI::App* cmd) {
  cmd->add_option("--target", name, "target name (see `nmcmc targets`; default funnel)");
  cmd->add_option("--dim", dim, "dimension (targets that take one)");
  cmd->add_option("--sigma", sigma, "funnel: sd of x0");
  cmd->add_option("--dataset", dataset, "logistic: german | australian | heart");
  cmd->add_option("--data-file", file, "logistic: your own whitespace/comma-separated table");
  cmd->add_option("--label-column", label_column, "logistic: label column of --data-file (negative from the end)");
  cmd->add_option("--target-seed", target_seed, "rotated_icg: seed of its eigenvalues and rotation");
  cmd->add_option("--module", module, "torchscript: your density, a module written by torch.jit.save (implies --target torchscript)");
  cmd->add_option("--module-output", module_output, "torchscript: what forward returns: energy (U(x), default) | log_prob");
  cmd->add_option("--module-engine", module_engine,
                  "torchscript: auto (default: nmcmc's own evaluator where the module's operations allow, else LibTorch) | "
                  "native (an error if they do not) | libtorch");
  cmd->add_option("--stan", stan, "your Stan program (a .stan file; implies --target stan): compiled once, then cached");
  cmd->add_option("--data", stan_data, "stan: the program's data, JSON as CmdStan reads it");
  cmd->add_option("--target-json", spec_json, "the whole target spec as JSON, e.g. '{\"name\":\"funnel\",\"dim\":100,\"sigma\":1}'");
}

json TargetArgs::spec() const {
  if (spec_json) {
    try {
      return json::parse(*spec_json);
    } catch (const std::exception& e) {
      throw UsageError(std::string("--target-json is not valid JSON: ") + e.what());
    }
  }
  json s = {{"name", name.value_or(module ? "torchscript" : stan ? "stan" : "funnel")}};
  if (stan) {
    if (s["name"] != "stan") throw UsageError("--stan goes with --target stan");
    if (module) throw UsageError("give --stan or --module, not both");
    s["program"] = *stan;
    if (stan_data) s["data"] = *stan_data;
  } else if (stan_data) {
    throw UsageError("--data goes with --stan (the program's data)");
  }
  if (module) {
    if (s["name"] != "torchscript") throw UsageError("--module goes with --target torchscript");
    s["module"] = *module;
    if (module_output) s["output"] = *module_output;
    if (module_engine) s["engine"] = *module_engine;
  } else if (module_output) {
    throw UsageError("--module-output goes with --module");
  } else if (module_engine) {
    throw UsageError("--module-engine goes with --module");
  }
  if (dim) s["dim"] = *dim;
  if (sigma) s["sigma"] = *sigma;  // non-finite values are refused by the target, never replaced
  if (dataset) s["dataset"] = *dataset;
  if (file) {
    s["file"] = *file;
    s["label_column"] = label_column.value_or(-1);
  } else if (label_column) {
    throw UsageError("--label-column goes with --data-file");
  }
  if (target_seed) s["seed"] = *target_seed;
  return s;
}

bool TargetArgs::given(const CLI::App* cmd) {
  for (const char* name : kTargetOptions) {
    if (cmd->count(name) > 0) return true;
  }
  return false;
}

void ComputeArgs::add(CLI::App* cmd, const char* dtype_help) {
  cmd->add_option("--device", device, "cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("--dtype", dtype, dtype_help);
  cmd->add_option("--threads", threads,
                  "intra-op threads (0: LibTorch's default; 1 is fastest on 2 vCPUs)")
      ->capture_default_str();
}

torch::TensorOptions ComputeArgs::options(const std::string& default_dtype) const {
  torch::TensorOptions options = parse_tensor_options(dtype.value_or(default_dtype), device);
  if (threads < 0) throw UsageError("--threads must be non-negative");
  if (threads > 0) torch::set_num_threads(threads);
  return options;
}

namespace {
std::string g_prefix = "nmcmc";
}
const std::string& message_prefix() { return g_prefix; }

void DistArgs::add(CLI::App* cmd) {
  auto* g = cmd->add_option_group("distributed", "a run over several processes (default: the torchrun variables "
                                                  "MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK; "
                                                  "`nmcmc launch --nproc N -- COMMAND` sets them)");
  g->add_option("--world-size", world_size, "number of processes (WORLD_SIZE)");
  g->add_option("--rank", rank, "this process's rank, 0..world-size-1 (RANK)");
  g->add_option("--local-rank", local_rank, "its rank on this machine; picks cuda:N (LOCAL_RANK)");
  g->add_option("--master-addr", master_addr, "address of rank 0 (MASTER_ADDR, default 127.0.0.1)");
  g->add_option("--master-port", master_port, "port of rank 0's store (MASTER_PORT, default 29500)");
  g->add_option("--dist-timeout", timeout, "seconds to wait for another process before giving up "
                                            "(NMCMC_DIST_TIMEOUT, default 300)");
  g->add_option("--backend", backend, "auto | gloo | nccl (auto: nccl on CUDA, else gloo)");
}

parallel::DistOptions DistArgs::resolve() const {
  parallel::DistOptions o = dist_options_from_environment();
  if (world_size) o.world_size = *world_size;
  if (rank) o.rank = *rank;
  if (local_rank) o.local_rank = *local_rank;
  else if (rank && !std::getenv("LOCAL_RANK")) o.local_rank = *rank;
  if (master_addr) o.master_addr = *master_addr;
  if (master_port) o.master_port = *master_port;
  if (timeout) {
    if (!(*timeout > 0) || !std::isfinite(*timeout)) throw UsageError("--dist-timeout must be a positive number of seconds");
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000));
  }
  if (backend) o.backend = *backend;
  o.validate();
  return o;
}

std::shared_ptr<parallel::Communicator> DistArgs::connect(torch::TensorOptions& options) const {
  parallel::DistOptions o = resolve();
  if (o.world_size > 1) {
    g_prefix = fmt::format("nmcmc [rank {}/{}]", o.rank, o.world_size);
    // A peer that dies cuts this rank's sockets; a write into one must fail as an error (the
    // collective's "another process of the run died", exit 69), not end the rank by SIGPIPE with
    // nothing said. Only ranks of a multi-process run: `nmcmc ... | head` keeps the default.
    std::signal(SIGPIPE, SIG_IGN);
  }
  if (options.device().is_cuda() && !options.device().has_index() && o.world_size > 1) {
    options = options.device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.local_rank)));
  }
  return parallel::connect(o, options.device());
}

std::string format_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

ProgressLine::ProgressLine(bool quiet, std::string indent)
    : quiet_(quiet), tty_(::isatty(STDERR_FILENO)), indent_(std::move(indent)), last_print_(std::make_shared<double>(-1e9)) {}

void ProgressLine::update(const std::string& label, int64_t done, int64_t total, double rate, const std::string& stats,
                          const char* unit) {
  if (quiet_) return;
  const bool last = done >= total;
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (!tty_ && !last && now - *last_print_ < 10.0) return;
  *last_print_ = now;
  const std::string msg =
      fmt::format("{}[{}] {:>6}/{:<6} {:3.0f}%  {}  {:.2f} {}/s  ETA {}", indent_, label, done, total,
                  100.0 * static_cast<double>(done) / static_cast<double>(std::max<int64_t>(1, total)), stats, rate, unit,
                  format_seconds(rate > 0 ? static_cast<double>(total - done) / rate : NAN));
  if (tty_) std::cerr << "\r" << msg << "\033[K" << (last ? "\n" : "") << std::flush;
  else std::cerr << msg << "\n";
}

ProgressFn sample_progress(bool quiet) {
  if (quiet) return nullptr;
  auto line = std::make_shared<ProgressLine>(false);
  return [line](const Progress& p) {
    const double rate = p.elapsed > 0 ? p.iteration / p.elapsed : 0;
    if (p.phase == "summary") {  // the diagnostics of a long run, a block of parameters at a time
      line->update(fmt::format("{:>8}", p.phase), p.iteration, p.total, rate, "bulk/tail ESS, R-hat, quantiles",
                   "parameters");
      return;
    }
    if (p.phase == "fit") {  // a flow transport's fit (services/transport.hpp): accept holds its loss
      line->update(fmt::format("{:>8}", p.phase), p.iteration, p.total, rate,
                   fmt::format("held-out Fisher loss {:.4g}", p.accept), "steps");
      return;
    }
    line->update(fmt::format("{:>8}", p.phase), p.iteration, p.total, rate,
                 fmt::format("accept {:.3f}  eps {:.4g}", p.accept, p.step_size));
  };
}

TrainProgressFn train_progress(bool quiet, const std::string& indent) {
  if (quiet) return nullptr;
  auto line = std::make_shared<ProgressLine>(false, indent);
  auto first_step = std::make_shared<int64_t>(-1);
  return [line, first_step](const TrainProgress& p) {
    const auto& s = p.stats;
    if (p.phase == "precondition") {
      const double rate = p.elapsed > 0 ? static_cast<double>(s.step) / p.elapsed : 0;
      line->update("precondition", s.step, p.total, rate, fmt::format("accept {:.3f}  step size {:.3g}", s.accept, s.eps),
                   "it");
      return;
    }
    if (p.phase == "fit") {  // a flow transport's fit in the warm-up (services/train.hpp)
      const double rate = p.elapsed > 0 ? static_cast<double>(s.step) / p.elapsed : 0;
      line->update("fit", s.step, p.total, rate, fmt::format("held-out Fisher loss {:.4g}", s.loss), "steps");
      return;
    }
    if (*first_step < 0) *first_step = s.step - 1;  // a resumed run starts mid-way
    const double rate = p.elapsed > 0 ? static_cast<double>(s.step - *first_step) / p.elapsed : 0;
    line->update("train", s.step, p.total, rate,
                 fmt::format("accept {:.3f}  beta {:.3g}  entropy {:.4g}  eps {:.4g}  lr {:.2e}", s.accept, s.beta,
                             s.entropy, s.eps, s.lr),
                 "steps");
  };
}

void add_transport_options(CLI::App* cmd, TransportChoice& choice, const std::string& kind_help, bool sampling,
                           int64_t default_rounds) {
  CLI::Option* kind = add_enum_option(cmd, "--transport", choice.kind, kind_help);
  if (!sampling) kind->default_str("");  // training's default is its config's (auto without one)
  cmd->add_option("--transport-layers", choice.layers,
                  fmt::format("the flow's coupling layers (default {})", kDefaultTransportLayers));
  cmd->add_option("--transport-rounds", choice.rounds,
                  fmt::format("the flow's fits during the warm-up (default {})", default_rounds));
  if (sampling) {
    cmd->add_flag("--global-moves", choice.global_moves,
                  "with --transport flow (or auto where it fits one): an independence move from the flow after "
                  "every step (exact; jumps between modes)");
  }
}

std::string slowest_parameter_phrase(const nlohmann::json& check) {
  const nlohmann::json worst = check.value("worst", nlohmann::json());
  if (!worst.is_object()) return "";
  return fmt::format("; slowest: {} (R-hat {:.3g})", worst.value("name", "?"), worst.value("rhat", NAN));
}

}  // namespace nmcmc::cli
