// The `nmcmc` command line: parse, validate, call services, map errors to exit codes.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "nmcmc/core/blas_check.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/services/figures.hpp"
#include "nmcmc/services/reproduce.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/images/ebm.hpp"
#include "nmcmc/targets/targets.hpp"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string g_command_line;

/// Options shared by every command that builds a target.
struct TargetArgs {
  std::string name = "funnel";
  int64_t dim = 0;
  double sigma = 0;
  std::string dataset, file, spec_json;
  int label_column = -1;
  int64_t target_seed = -1;

  void add(CLI::App* cmd) {
    cmd->add_option("--target", name, "target name (see `nmcmc targets`)")->capture_default_str();
    cmd->add_option("--dim", dim, "dimension (targets that take one)");
    cmd->add_option("--sigma", sigma, "funnel: sd of x0");
    cmd->add_option("--dataset", dataset, "logistic: german | australian | heart");
    cmd->add_option("--data-file", file, "logistic: your own whitespace/comma-separated table");
    cmd->add_option("--label-column", label_column, "logistic: label column of --data-file (negative from the end)");
    cmd->add_option("--target-seed", target_seed, "rotated_icg: seed of its eigenvalues and rotation");
    cmd->add_option("--target-json", spec_json, "the whole target spec as JSON, e.g. '{\"name\":\"funnel\",\"dim\":100,\"sigma\":1}'");
  }

  json spec() const {
    if (!spec_json.empty()) {
      try {
        return json::parse(spec_json);
      } catch (const std::exception& e) {
        throw nmcmc::UsageError(std::string("--target-json is not valid JSON: ") + e.what());
      }
    }
    json s = {{"name", name}};
    if (dim > 0) s["dim"] = dim;
    if (sigma > 0) s["sigma"] = sigma;
    if (!dataset.empty()) s["dataset"] = dataset;
    if (!file.empty()) {
      s["file"] = file;
      s["label_column"] = label_column;
    }
    if (target_seed >= 0) s["seed"] = target_seed;
    return s;
  }
};

/// Options shared by every command that computes.
struct ComputeArgs {
  std::string device = "cpu", dtype = "float32";
  int threads = 1;
  void add(CLI::App* cmd) {
    cmd->add_option("--device", device, "cpu | cuda | cuda:N")->capture_default_str();
    cmd->add_option("--dtype", dtype, "float32 | float64")->capture_default_str();
    cmd->add_option("--threads", threads, "intra-op threads (0: LibTorch's default; 1 is fastest on 2 vCPUs, see BENCHMARKS.md)")->capture_default_str();
  }
  torch::TensorOptions options() const {
    torch::ScalarType st;
    if (dtype == "float32") st = torch::kFloat32;
    else if (dtype == "float64") st = torch::kFloat64;
    else throw nmcmc::UsageError("--dtype must be float32 or float64, got '" + dtype + "'");
    torch::Device dev(torch::kCPU);
    try {
      dev = torch::Device(device);
    } catch (const std::exception&) {
      throw nmcmc::UsageError("--device must be cpu, cuda or cuda:N, got '" + device + "'");
    }
    if (dev.is_cuda() && !torch::cuda::is_available()) {
      throw nmcmc::UsageError("--device " + device + ": this LibTorch build or machine has no CUDA device");
    }
    if (threads < 0) throw nmcmc::UsageError("--threads must be non-negative");
    if (threads > 0) torch::set_num_threads(threads);
    return torch::TensorOptions().dtype(st).device(dev);
  }
};

void warn_blas() {
  auto report = nmcmc::check_blas(false);
  if (!report.ok) std::cerr << "\n" << report.message << "\n\n";
}

std::string format_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

/// A progress line on stderr: rewritten in place on a terminal, every ~10 % otherwise.
nmcmc::ProgressFn progress_printer(bool quiet) {
  if (quiet) return nullptr;
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_decile = std::make_shared<int64_t>(-1);
  return [tty, last_decile](const nmcmc::Progress& p) {
    const double rate = p.elapsed > 0 ? p.iteration / p.elapsed : 0;
    const double eta = rate > 0 ? (p.total - p.iteration) / rate : NAN;
    std::string msg = fmt::format("[{:>8}] {:>6}/{:<6} {:3.0f}%  accept {:.3f}  eps {:.4g}  {:.0f} it/s  ETA {}", p.phase,
                                  p.iteration, p.total, 100.0 * p.iteration / std::max<int64_t>(1, p.total), p.accept,
                                  p.step_size, rate, format_seconds(eta));
    if (tty) {
      std::cerr << "\r" << msg << "\033[K" << (p.iteration == p.total ? "\n" : "") << std::flush;
    } else {
      int64_t decile = p.iteration * 10 / std::max<int64_t>(1, p.total);
      if (decile != *last_decile || p.iteration == p.total) {
        if (p.iteration == p.total && decile == *last_decile) return;
        *last_decile = decile;
        std::cerr << msg << "\n";
      }
    }
  };
}

/// The training progress line (stderr): step, accept, beta, entropy, eps, lr, steps/s, ETA;
/// rewritten in place on a terminal, every 10 s otherwise.
nmcmc::TrainProgressFn train_progress_printer(bool quiet, std::string indent = "") {
  if (quiet) return nullptr;
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_print = std::make_shared<double>(-1e9);
  auto first_step = std::make_shared<int64_t>(-1);
  return [tty, last_print, first_step, indent](const nmcmc::TrainProgress& p) {
    const auto& s = p.stats;
    if (*first_step < 0) *first_step = s.step - 1;  // a resumed run starts mid-way
    const double rate = p.elapsed > 0 ? static_cast<double>(s.step - *first_step) / p.elapsed : 0;
    std::string msg = fmt::format("{}[train] step {:>6}/{:<6} accept {:.3f}  beta {:.3g}  entropy {:.4g}  eps {:.4g}  lr {:.2e}  {:.2f} steps/s  ETA {}",
                                  indent, s.step, p.total, s.accept, s.beta, s.entropy, s.eps, s.lr, rate,
                                  format_seconds(rate > 0 ? (p.total - s.step) / rate : NAN));
    if (tty) {
      std::cerr << "\r" << msg << "\033[K" << (s.step == p.total ? "\n" : "") << std::flush;
    } else if (p.elapsed - *last_print > 10 || s.step == p.total) {
      *last_print = p.elapsed;
      std::cerr << msg << "\n";
    }
  };
}

// ------------------------------------------------------------------ targets
int cmd_targets() {
  for (const auto& t : nmcmc::target_catalogue()) {
    std::cout << fmt::format("{:<12} {}\n", t.name, t.description);
    for (const auto& [opt, meaning] : t.options) std::cout << fmt::format("{:<14} {:<14} {}\n", "", opt, meaning);
  }
  std::cout << "\nExamples:\n"
               "  nmcmc sample --target funnel --dim 20 --sigma 3 --sampler hmc\n"
               "  nmcmc sample --target logistic --dataset german --sampler hmc --adapt-mass\n"
               "  nmcmc sample --target-json '{\"name\":\"gaussian\",\"scales\":[1,10]}'\n";
  return 0;
}

// ------------------------------------------------------------------ sample
struct SampleArgs {
  TargetArgs target;
  ComputeArgs compute;
  std::string sampler = "hmc", output, init = "uniform", model;
  double step_size = 0, target_accept = 0, jitter = 0;
  int64_t leapfrog = 10, chains = 4, warmup = 1000, draws = 1000;
  uint64_t seed = 1;
  bool adapt_mass = false, no_adapt = false, quiet = false;
  int64_t rows = 8;
};

json run_config(const SampleArgs& a, const nmcmc::Target& t) {
  return {{"command", g_command_line},
          {"target", t.spec()},
          {"sampler", a.sampler},
          {"leapfrog", a.leapfrog},
          {"chains", a.chains},
          {"warmup", a.warmup},
          {"draws", a.draws},
          {"seed", a.seed},
          {"init", a.init},
          {"adapt_step", !a.no_adapt},
          {"adapt_mass", a.adapt_mass},
          {"dtype", a.compute.dtype},
          {"device", a.compute.device},
          {"threads", torch::get_num_threads()},
          {"nmcmc_version", "0.1.0"}};
}

int cmd_sample(const SampleArgs& a, const std::vector<std::string>& given) {
  auto options = a.compute.options();
  std::shared_ptr<nmcmc::Proposal> proposal;
  json target_spec = a.target.spec();
  json model_meta;
  const bool learned = a.sampler == "learned";
  if (learned) {
    if (a.model.empty()) throw nmcmc::UsageError("--sampler learned needs --model FILE (from `nmcmc train`)");
    auto [sampler, meta] = nmcmc::load_model(a.model);
    model_meta = meta;
    const bool target_given = std::any_of(given.begin(), given.end(), [](const std::string& o) {
      return o == "target" || o == "dim" || o == "sigma" || o == "dataset" || o == "data-file" || o == "target-json" ||
             o == "target-seed";
    });
    json trained_on = meta.at("target");
    if (target_given) {
      auto probe = nmcmc::make_target(target_spec, options);
      if (probe->spec() != trained_on) {
        throw nmcmc::UsageError("model '" + a.model + "' was trained on target " + trained_on.dump() + ", not " +
                                probe->spec().dump());
      }
    }
    target_spec = trained_on;
    if (std::find(given.begin(), given.end(), "dtype") == given.end()) {
      options = options.dtype(meta.value("dtype", "float32") == "float64" ? torch::kFloat64 : torch::kFloat32);
    }
    sampler->to(options.device(), options.dtype().toScalarType());
    sampler->eval();
    proposal = std::make_shared<nmcmc::LearnedProposal>(sampler);
  } else {
    if (!a.model.empty()) throw nmcmc::UsageError("--model goes with --sampler learned");
    proposal = nmcmc::make_baseline_proposal(
        nmcmc::ProposalOptions().set_sampler(a.sampler).set_step_size(a.step_size > 0 ? std::optional<double>(a.step_size) : std::nullopt).set_leapfrog(a.leapfrog).set_jitter(a.jitter));
  }
  auto target = nmcmc::make_target(target_spec, options);
  if (!a.output.empty()) nmcmc::ensure_directory(a.output);  // fail before the run, not after
  nmcmc::MetropolisHastings kernel(proposal);
  nmcmc::RunOptions run;
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_init(a.init).set_adapt_mass(a.adapt_mass);
  // The learned sampler's step size is learned: warm-up is burn-in only.
  run.set_adapt_step(learned ? false : !a.no_adapt);
  run.set_target_accept(a.target_accept > 0 ? a.target_accept : nmcmc::default_target_accept(a.sampler));
  if (a.no_adapt && a.step_size == 0.0) throw nmcmc::UsageError("--no-adapt needs --step-size");
  warn_blas();
  auto result = nmcmc::run_sampler(*target, kernel, run, a.seed, progress_printer(a.quiet));
  json summary = nmcmc::summarise(result, *target);
  std::cout << nmcmc::format_summary(summary, a.rows);
  if (!a.output.empty()) {
    json config = run_config(a, *target);
    if (learned) config["model"] = {{"file", a.model}, {"options", model_meta["model"]}, {"trained_steps", model_meta["step"]}};
    nmcmc::write_run(a.output, config, result, summary);
    std::cout << "wrote " << a.chains << " Stan-CSV files and summary.json to " << a.output << "\n";
  }
  return 0;
}

// ------------------------------------------------------------------ train
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct TrainArgs {
  std::string config, output, log;
  std::vector<std::string> sets;
  int64_t steps = -1, batch = -1;
  double lr = -1, min_lr = -1;
  int64_t seed = -1;
  bool resume = false, quiet = false;
  std::string device = "cpu", dtype;
  int threads = 1;
};

int cmd_train(const TrainArgs& a) {
  json cfg = nmcmc::read_config_file(a.config);
  if (a.steps >= 0) cfg["train"]["steps"] = a.steps;
  if (a.batch > 0) cfg["train"]["batch"] = a.batch;
  if (a.lr > 0) cfg["train"]["lr"] = a.lr;
  if (a.min_lr >= 0) cfg["train"]["min_lr"] = a.min_lr;
  if (a.seed >= 0) cfg["train"]["seed"] = a.seed;
  if (!a.dtype.empty()) cfg["dtype"] = a.dtype;
  for (const auto& s : a.sets) nmcmc::apply_override(cfg, s);
  nmcmc::TrainConfig config = nmcmc::parse_train_config(cfg);
  ComputeArgs compute;
  compute.device = a.device;
  compute.dtype = config.dtype;
  compute.threads = a.threads;
  auto options = compute.options();
  const std::string out_dir = fs::path(a.output).parent_path().string();
  if (!out_dir.empty()) nmcmc::ensure_directory(out_dir);
  std::string log_path = a.log;
  if (log_path.empty()) log_path = (fs::path(a.output).replace_extension("").string()) + ".log.csv";
  warn_blas();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto progress = train_progress_printer(a.quiet);
  auto result = nmcmc::train(config, options.device(), a.output, log_path, a.resume, progress, [] { return g_stop.load(); });
  if (result.interrupted) {
    std::cerr << "\nnmcmc: interrupted at step " << result.steps << "; checkpoint saved to " << a.output
              << " (continue with --resume)\n";
    return 130;
  }
  std::cout << fmt::format("trained {} steps in {:.1f} s ({} target gradient evaluations per batch row); model: {}; log: {}\n",
                           result.steps, result.seconds, result.grads, a.output, log_path);
  return 0;
}

// ------------------------------------------------------------------ ebm
struct EbmArgs {
  std::string data = "fashion-mnist", output = "ebm", profile = "cpu", sampler = "learned", config, compare, device = "cpu";
  std::vector<std::string> sets;
  int64_t iterations = -1, size = -1, channels = -1, limit = -1;
  bool resume = false, quiet = false;
  int threads = 1;
};

int cmd_ebm_train(const EbmArgs& a) {
  if (a.threads < 0) throw nmcmc::UsageError("--threads must be non-negative");
  if (a.threads > 0) torch::set_num_threads(a.threads);
  json cfg = a.config.empty() ? json::object() : nmcmc::read_config_file(a.config);
  cfg["data"] = a.data;
  cfg["sampler"] = a.sampler;
  cfg["device"] = a.device;
  if (a.iterations >= 0) cfg["iterations"] = a.iterations;
  if (a.size > 0) cfg["size"] = a.size;
  if (a.channels > 0) cfg["channels"] = a.channels;
  if (a.limit >= 0) cfg["limit"] = a.limit;
  for (const auto& s : a.sets) {
    // key=value or conv.key=value, the value parsed as JSON when it is JSON.
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw nmcmc::UsageError("--set expects key=value, got '" + s + "'");
    const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
    json value = json::parse(text, nullptr, false);
    if (value.is_discarded()) value = text;
    if (key.rfind("conv.", 0) == 0) cfg["conv"][key.substr(5)] = value;
    else cfg[key] = value;
  }
  nmcmc::EbmOptions options = nmcmc::EbmOptions::from_json(cfg, a.profile);
  warn_blas();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_print = std::make_shared<std::chrono::steady_clock::time_point>();
  auto progress = [&, tty, last_print](const nmcmc::EbmProgress& p) {
    if (a.quiet) return;
    const auto& s = p.stats;
    const auto now = std::chrono::steady_clock::now();
    if (!tty && now - *last_print < std::chrono::seconds(10) && s.iteration != p.total) return;
    *last_print = now;
    std::string msg = fmt::format(
        "[ebm] it {:>6}/{:<6} {:3.0f}%  accept {:.3f} (neg {:.3f})  entropy {:.5g}  jump {:.3g}  E(data)-E(neg) {:+.3g}  eps {:.3g}  "
        "updates {}  {:.2f} it/s  ETA {}",
        s.iteration, p.total, 100.0 * s.iteration / std::max<int64_t>(1, p.total), s.accept, s.mcmc_accept, s.entropy,
        s.jump, s.energy_diff, s.eps, s.updates, p.rate, format_seconds(p.rate > 0 ? (p.total - s.iteration) / p.rate : NAN));
    if (tty) std::cerr << "\r" << msg << "\033[K" << (s.iteration == p.total ? "\n" : "") << std::flush;
    else std::cerr << msg << "\n";
  };
  json summary = nmcmc::run_ebm_training(options, a.output, a.resume, progress, [] { return g_stop.load(); }, a.compare);
  if (summary.value("interrupted", false)) {
    std::cerr << "\ninterrupted: checkpoint saved in " << a.output << "/checkpoint.pt; continue with --resume\n";
    return 130;
  }
  if (options.longrun_steps > 0) {
    const std::string png = (fs::path(a.output) / "longrun.png").string();
    auto lr_progress = [&, tty](int64_t k, int64_t n) {
      if (a.quiet || !(tty || k == n || k % std::max<int64_t>(1, n / 10) == 0)) return;
      std::cerr << (tty ? "\r" : "") << fmt::format("[long run] step {}/{}", k, n) << (tty && k != n ? "" : "\n") << std::flush;
    };
    summary["longrun"] = nmcmc::run_ebm_longrun(a.output, options.longrun_steps, 8, png, lr_progress, options.device);
    nmcmc::write_atomically((fs::path(a.output) / "summary.json").string(), [&](std::ostream& os) { os << summary.dump(2) << "\n"; });
  }
  std::cout << summary.dump(2) << "\n";
  std::cout << "figures and checkpoint in " << a.output << "/\n";
  return 0;
}

struct EbmSampleArgs {
  std::string model = "ebm", output, device = "cpu";
  int64_t steps = 2000, chains = 8;
  int threads = 1;
  bool quiet = false;
};

int cmd_ebm_sample(const EbmSampleArgs& a) {
  if (a.threads > 0) torch::set_num_threads(a.threads);
  const std::string png = a.output.empty() ? (fs::path(a.model) / "longrun.png").string() : a.output;
  const bool tty = ::isatty(STDERR_FILENO);
  auto progress = [&](int64_t k, int64_t n) {
    if (a.quiet || !(tty || k == n || k % std::max<int64_t>(1, n / 10) == 0)) return;
    std::cerr << (tty ? "\r" : "") << fmt::format("[long run] step {}/{}", k, n) << (tty && k != n ? "" : "\n") << std::flush;
  };
  json r = nmcmc::run_ebm_longrun(a.model, a.steps, a.chains, png, progress, a.device);
  std::cout << r.dump(2) << "\n";
  return 0;
}

// ------------------------------------------------------------------ reference
struct ReferenceArgs {
  std::string dataset, output;
  int64_t chains = 64, warmup = 2000, draws = 10000, leapfrog = 16;
  double jitter = 0.5;
  uint64_t seed = 20261122;
  int threads = 1;
};

int cmd_reference(const ReferenceArgs& a) {
  if (a.threads > 0) torch::set_num_threads(a.threads);
  auto options = torch::TensorOptions().dtype(torch::kFloat64);
  auto target = nmcmc::make_target({{"name", "logistic"}, {"dataset", a.dataset}}, options);
  auto proposal = nmcmc::make_baseline_proposal(
      nmcmc::ProposalOptions().set_sampler("hmc").set_leapfrog(a.leapfrog).set_jitter(a.jitter));
  nmcmc::MetropolisHastings kernel(proposal);
  nmcmc::RunOptions run;
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_adapt_mass(true).set_target_accept(0.8);
  auto result = nmcmc::run_sampler(*target, kernel, run, a.seed, progress_printer(false));
  json summary = nmcmc::summarise(result, *target);
  std::cout << nmcmc::format_summary(summary, 6);
  const double max_rhat = summary["max_rhat"].get<double>();
  if (!(max_rhat < 1.01)) {
    std::cerr << "nmcmc: reference run did not converge (max R-hat " << max_rhat << " >= 1.01); nothing written\n";
    return nmcmc::kExitSoftware;
  }
  json out;
  std::vector<double> mean, sd, mcse, ess;
  for (const auto& p : summary["parameters"]) {
    mean.push_back(p["mean"]);
    sd.push_back(p["sd"]);
    mcse.push_back(p["mcse_mean"]);
    ess.push_back(p["ess_bulk"]);
  }
  out["dataset"] = a.dataset;
  out["model"] = "logistic regression, N(0, 10^2) prior, standardised features (sample sd), intercept first";
  out["mean"] = mean;
  out["sd"] = sd;
  out["mcse_mean"] = mcse;
  out["ess_bulk"] = ess;
  out["max_rhat"] = max_rhat;
  out["min_ess_bulk"] = summary["min_ess_bulk"];
  out["method"] = fmt::format("HMC, {} leapfrog steps, step-size jitter " + fmt::format("{}", a.jitter) + ", dual-averaged step size (target 0.8), windowed diagonal mass matrix; "
                              "{} chains x {} draws after {} warm-up, float64",
                              a.leapfrog, a.chains, a.draws, a.warmup);
  out["command"] = g_command_line;
  out["seed"] = a.seed;
  std::string path = a.output.empty() ? (fs::path(nmcmc::data_directory()) / "reference" / (a.dataset + ".json")).string() : a.output;
  nmcmc::ensure_directory(fs::path(path).parent_path().string().empty() ? "." : fs::path(path).parent_path().string());
  nmcmc::write_atomically(path, [&](std::ostream& os) { os << out.dump(2) << "\n"; });
  std::cout << "wrote " << path << "\n";
  return 0;
}

// ------------------------------------------------------------------ reproduce
int cmd_reproduce(nmcmc::ReproduceOptions o, bool quiet) {
  torch::set_num_threads(1);
  if (!fs::exists(fs::path(o.configs) / "icg.json")) {
    const fs::path installed = fs::path(nmcmc::data_directory()).parent_path() / "configs";
    if (fs::exists(installed / "icg.json")) o.configs = installed.string();
  }
  warn_blas();
  std::signal(SIGINT, on_signal);
  auto say = [](const std::string& line) { std::cout << line << std::endl; };
  auto progress = train_progress_printer(quiet, "  ");
  json results = nmcmc::reproduce(o, say, progress);
  std::cout << "\n" << nmcmc::results_table(results) << "\nWrote " << o.output << "/results.json, results.md and the figures.\n";
  return 0;
}

// ------------------------------------------------------------------ info
int cmd_info() {
  auto report = nmcmc::check_blas(true);
  std::cout << fmt::format("nmcmc 0.1.0\nLibTorch {}\nBLAS: {} ({:.1f} GFLOP/s on a 512x512 sgemm, {} threads)\n",
                           TORCH_VERSION, report.library.empty() ? "unknown" : report.library, report.gflops,
                           torch::get_num_threads());
  std::cout << "CUDA available: " << (torch::cuda::is_available() ? "yes" : "no") << "\n";
  std::cout << "data directory: " << nmcmc::data_directory() << "\n";
  if (!report.ok) std::cerr << report.message << "\n";
  return 0;
}

// ------------------------------------------------------------------ demo
double paper_value(const json& summary, const char* key) {
  return summary.contains("paper_ess") && summary["paper_ess"].contains(key) ? summary["paper_ess"][key].get<double>() : NAN;
}

int cmd_demo(const std::string& output, bool quiet) {
  nmcmc::ensure_directory(output);
  const std::string config_path = (fs::path(nmcmc::data_directory()).parent_path() / "configs" / "demo_funnel3.json").string();
  json cfg = nmcmc::read_config_file(fs::exists(config_path) ? config_path : "configs/demo_funnel3.json");
  nmcmc::TrainConfig config = nmcmc::parse_train_config(cfg);
  std::cout << "== nmcmc demo: Funnel-3 (d = 20, sigma = 3), the learned sampler against HMC ==\n\n"
            << "1. Train the learned sampler (" << config.train.steps << " steps, batch " << config.train.batch
            << ", width " << config.model.hidden << ", N = " << config.model.steps << "); resumable.\n";
  torch::set_num_threads(1);
  const std::string model = output + "/model.pt", log = output + "/training_log.csv";
  auto progress = train_progress_printer(quiet);
  std::signal(SIGINT, on_signal);
  nmcmc::TrainResult trained;
  try {
    trained = nmcmc::train(config, torch::kCPU, model, log, /*resume=*/true, progress, [] { return g_stop.load(); });
  } catch (const nmcmc::DataError& e) {
    // A model left by an older nmcmc (or a damaged one): start the demo's training afresh.
    std::cerr << "nmcmc: " << e.what() << "; training a new one\n";
    fs::remove(model);
    trained = nmcmc::train(config, torch::kCPU, model, log, /*resume=*/true, progress, [] { return g_stop.load(); });
  }
  if (trained.interrupted) {
    std::cerr << "\nnmcmc: interrupted; run `make demo` again to continue training\n";
    return 130;
  }
  nmcmc::plot_training_curves(output + "/training_curves.png", trained.log, "Funnel-3");

  std::cout << "2. Sample 64 chains x 2000 steps with each sampler.\n";
  auto target = nmcmc::make_target(config.target, torch::kFloat32);
  auto [sampler, meta] = nmcmc::load_model(model);
  sampler->eval();
  nmcmc::MetropolisHastings learned_kernel(std::make_shared<nmcmc::LearnedProposal>(sampler));
  nmcmc::RunOptions run;
  run.set_chains(64).set_warmup(500).set_draws(2000).set_adapt_step(false).set_init("exact");
  auto learned = nmcmc::run_sampler(*target, learned_kernel, run, 1, progress_printer(quiet));
  // HMC with as many gradients per MH step as the learned sampler (4N), adapted step size.
  const int64_t grads = sampler->grads_per_step();
  nmcmc::MetropolisHastings hmc_kernel(nmcmc::make_baseline_proposal(
      nmcmc::ProposalOptions().set_sampler("hmc").set_leapfrog(grads).set_jitter(0.2)));
  nmcmc::RunOptions hrun = run;
  hrun.set_warmup(1000).set_adapt_step(true).set_target_accept(0.8);
  auto hmc = nmcmc::run_sampler(*target, hmc_kernel, hrun, 1, progress_printer(quiet));
  json sl = nmcmc::summarise(learned, *target), sh = nmcmc::summarise(hmc, *target);
  nmcmc::write_run(output + "/learned", {{"sampler", "learned"}, {"model", model}, {"seed", 1}}, learned, sl);
  nmcmc::write_run(output + "/hmc", {{"sampler", "hmc"}, {"leapfrog", grads}, {"seed", 1}}, hmc, sh);

  std::cout << "\n3. Results (ESS with the true moments, paper convention; bulk-ESS and R-hat: Stan's)\n\n";
  std::cout << fmt::format("{:<10} {:>7} {:>10} {:>12} {:>12} {:>13} {:>10} {:>8} {:>9}\n", "sampler", "accept",
                           "grads/step", "ESS/step x1", "ESS/grad x1", "ESS/step rest", "bulk-ESS x1", "max Rhat", "sample s");
  for (auto [name, s] : {std::pair<std::string, json*>{"learned", &sl}, std::pair<std::string, json*>{"HMC", &sh}}) {
    std::cout << fmt::format("{:<10} {:>7.3f} {:>10.0f} {:>12.4f} {:>12.5f} {:>13.4f} {:>10.0f} {:>8.3f} {:>9.1f}\n", name,
                             (*s)["accept_rate"].get<double>(), (*s)["grads_per_step"].get<double>(),
                             paper_value(*s, "ess_per_step_x1"), paper_value(*s, "ess_per_grad_x1"),
                             paper_value(*s, "ess_per_step_rest_min"), (*s)["parameters"][0]["ess_bulk"].get<double>(),
                             (*s)["max_rhat"].get<double>(), (*s)["seconds_sampling"].get<double>());
  }
  const double gain = paper_value(sl, "ess_per_grad_x1") / paper_value(sh, "ess_per_grad_x1");
  std::cout << fmt::format("\nThe learned sampler gets {:.1f}x the ESS of x1 (the funnel's neck coordinate) per gradient of HMC.\n"
                           "Training cost {} gradient evaluations per batch row ({:.0f} s{}).\n", gain, trained.grads,
                           trained.log.empty() ? trained.seconds : trained.log.back().elapsed,
                           trained.seconds < 1 ? "; this run reused the trained model in " + output : std::string());
  at::Generator gen = nmcmc::make_generator(7);
  nmcmc::plot_traces(output + "/traces_x1.png", {{"HMC: x1 trace (chain 1)", hmc.draws}, {"learned: x1 trace (chain 1)", learned.draws}}, 0, 2000, "x1");
  nmcmc::plot_pairs(output + "/samples.png", {{"HMC", hmc.draws}, {"learned", learned.draws}}, 0, 1, target->sample(4000, gen));
  std::cout << "\nWrote " << output << "/{training_curves,traces_x1,samples}.png, the Stan-CSV draws of both runs, and the model.\n";
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + std::string(argv[i]);
  CLI::App app{"nmcmc: neural-network MCMC that maximises proposal entropy (Li, Chen & Sommer 2021)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");

  auto* targets = app.add_subcommand("targets", "list the built-in targets and their options");

  SampleArgs sample;
  auto* sample_cmd = app.add_subcommand("sample", "sample a target with a baseline sampler; write Stan-CSV and a summary");
  sample.target.add(sample_cmd);
  sample.compute.add(sample_cmd);
  sample_cmd->add_option("--sampler", sample.sampler, "rwm | mala | hmc | learned")->capture_default_str();
  sample_cmd->add_option("--model", sample.model, "checkpoint of a trained sampler (with --sampler learned)");
  sample_cmd->add_option("--step-size", sample.step_size, "initial step size (0: found automatically)");
  sample_cmd->add_option("--leapfrog", sample.leapfrog, "HMC leapfrog steps")->capture_default_str();
  sample_cmd->add_option("--jitter", sample.jitter, "HMC: per-chain step-size jitter j, eps * (1 + j U(-1,1))")->capture_default_str();
  sample_cmd->add_option("--chains", sample.chains, "number of chains")->capture_default_str();
  sample_cmd->add_option("--warmup", sample.warmup, "warm-up (adaptation) steps")->capture_default_str();
  sample_cmd->add_option("--draws", sample.draws, "draws kept per chain")->capture_default_str();
  sample_cmd->add_option("--seed", sample.seed, "random seed")->capture_default_str();
  sample_cmd->add_option("--target-accept", sample.target_accept, "accept-rate target of step-size adaptation (default: per sampler)");
  sample_cmd->add_flag("--adapt-mass", sample.adapt_mass, "adapt a diagonal mass matrix over Stan's warm-up windows");
  sample_cmd->add_flag("--no-adapt", sample.no_adapt, "keep --step-size fixed during warm-up");
  sample_cmd->add_option("--init", sample.init, "uniform (U(-2,2)) | exact | zero")->capture_default_str();
  sample_cmd->add_option("--output,-o", sample.output, "directory for chain_N.csv and summary.json");
  sample_cmd->add_option("--rows", sample.rows, "summary rows to show (first and worst)")->capture_default_str();
  sample_cmd->add_flag("--quiet,-q", sample.quiet, "no progress line");

  TrainArgs train;
  auto* train_cmd = app.add_subcommand("train", "train the learned sampler (resumable; checkpoints written atomically)");
  train_cmd->add_option("--config,-c", train.config, "configuration JSON (see configs/)")->required();
  train_cmd->add_option("--output,-o", train.output, "checkpoint file to write")->required();
  train_cmd->add_option("--log", train.log, "training log CSV (default: OUTPUT without extension + .log.csv)");
  train_cmd->add_option("--steps", train.steps, "override train.steps");
  train_cmd->add_option("--batch", train.batch, "override train.batch");
  train_cmd->add_option("--lr", train.lr, "override train.lr");
  train_cmd->add_option("--min-lr", train.min_lr, "override train.min_lr");
  train_cmd->add_option("--seed", train.seed, "override train.seed");
  train_cmd->add_option("--set", train.sets, "override any value: section.key=value (e.g. model.hidden=64)");
  train_cmd->add_flag("--resume", train.resume, "continue from OUTPUT if it exists");
  train_cmd->add_option("--device", train.device, "cpu | cuda | cuda:N")->capture_default_str();
  train_cmd->add_option("--dtype", train.dtype, "float32 | float64 (default: the config's)");
  train_cmd->add_option("--threads", train.threads, "intra-op threads (0: LibTorch's default)")->capture_default_str();
  train_cmd->add_flag("--quiet,-q", train.quiet, "no progress line");

  ReferenceArgs ref;
  auto* ref_cmd = app.add_subcommand("reference", "compute reference posterior moments of a logistic-regression data set");
  ref_cmd->add_option("--dataset", ref.dataset, "german | australian | heart")->required();
  ref_cmd->add_option("--output,-o", ref.output, "output JSON (default: data/reference/DATASET.json)");
  ref_cmd->add_option("--chains", ref.chains)->capture_default_str();
  ref_cmd->add_option("--warmup", ref.warmup)->capture_default_str();
  ref_cmd->add_option("--draws", ref.draws)->capture_default_str();
  ref_cmd->add_option("--leapfrog", ref.leapfrog)->capture_default_str();
  ref_cmd->add_option("--seed", ref.seed)->capture_default_str();
  ref_cmd->add_option("--jitter", ref.jitter, "HMC step-size jitter")->capture_default_str();
  ref_cmd->add_option("--threads", ref.threads)->capture_default_str();

  auto* info_cmd = app.add_subcommand("info", "versions, BLAS check, devices");

  nmcmc::ReproduceOptions repro;
  std::string repro_only;
  bool repro_quiet = false, repro_no_figures = false;
  std::string repro_table;
  auto* repro_cmd = app.add_subcommand("reproduce", "the paper's experiments with one command, beside the paper's numbers");
  repro_cmd->add_option("--profile", repro.profile, "smoke (~1-2 min) | cpu (reduced, see BENCHMARKS.md) | paper")->capture_default_str();
  repro_cmd->add_option("--only", repro_only, "comma-separated: icg,scg,funnel1,funnel3,german,australian,heart,moon,ablation");
  repro_cmd->add_option("--output,-o", repro.output, "output directory")->capture_default_str();
  repro_cmd->add_option("--configs", repro.configs, "directory of the experiment configs")->capture_default_str();
  repro_cmd->add_flag("--no-figures", repro_no_figures, "skip the figures");
  repro_cmd->add_flag("--quiet,-q", repro_quiet, "no training progress line");
  repro_cmd->add_option("--table", repro_table, "only print the table of an existing results.json (e.g. of an unfinished run)");

  EbmArgs ebm;
  EbmSampleArgs ebm_sample;
  auto* ebm_cmd = app.add_subcommand("ebm", "deep energy-based image models trained with the learned sampler (paper 4.2)");
  ebm_cmd->require_subcommand(1);
  auto* ebm_train_cmd = ebm_cmd->add_subcommand("train", "train an EBM by PCD with the learned sampler (or MALA); resumable");
  ebm_train_cmd->add_option("--data", ebm.data, "fashion-mnist | an IDX file | a folder of PNG/JPEG images")->capture_default_str();
  ebm_train_cmd->add_option("--output,-o", ebm.output, "output directory (checkpoint, log, figures)")->capture_default_str();
  ebm_train_cmd->add_option("--profile", ebm.profile, "cpu (small, ~1 h on 2 vCPUs) | paper | smoke")->capture_default_str();
  ebm_train_cmd->add_option("--sampler", ebm.sampler, "learned | mala (the baseline)")->capture_default_str();
  ebm_train_cmd->add_option("--config,-c", ebm.config, "JSON of EBM options over the profile's");
  ebm_train_cmd->add_option("--iterations", ebm.iterations, "override the number of iterations");
  ebm_train_cmd->add_option("--size", ebm.size, "image folders: resize to SIZE x SIZE");
  ebm_train_cmd->add_option("--channels", ebm.channels, "image folders: 1 (grayscale) or 3 (colour)");
  ebm_train_cmd->add_option("--limit", ebm.limit, "use only the first N images");
  ebm_train_cmd->add_option("--set", ebm.sets, "override an option: key=value or conv.key=value");
  ebm_train_cmd->add_option("--compare", ebm.compare, "another run's directory, drawn in the curves (learned vs MALA)");
  ebm_train_cmd->add_flag("--resume", ebm.resume, "continue OUTPUT/checkpoint.pt");
  ebm_train_cmd->add_option("--device", ebm.device, "cpu | cuda | cuda:N")->capture_default_str();
  ebm_train_cmd->add_option("--threads", ebm.threads, "intra-op threads")->capture_default_str();
  ebm_train_cmd->add_flag("--quiet,-q", ebm.quiet, "no progress line");
  auto* ebm_sample_cmd = ebm_cmd->add_subcommand("sample", "a long sampling run from buffer samples of a trained EBM, as a grid");
  ebm_sample_cmd->add_option("--model,-m", ebm_sample.model, "the training output directory")->capture_default_str();
  ebm_sample_cmd->add_option("--steps", ebm_sample.steps, "MH steps")->capture_default_str();
  ebm_sample_cmd->add_option("--chains", ebm_sample.chains, "chains (grid columns)")->capture_default_str();
  ebm_sample_cmd->add_option("--output,-o", ebm_sample.output, "PNG (default: MODEL/longrun.png)");
  ebm_sample_cmd->add_option("--threads", ebm_sample.threads, "intra-op threads")->capture_default_str();
  ebm_sample_cmd->add_option("--device", ebm_sample.device, "cpu | cuda | cuda:N")->capture_default_str();
  ebm_sample_cmd->add_flag("--quiet,-q", ebm_sample.quiet, "no progress line");

  std::string demo_output = "demo_out";
  bool demo_quiet = false;
  auto* demo_cmd = app.add_subcommand("demo", "the README's main job");
  demo_cmd->add_option("--output,-o", demo_output, "output directory")->capture_default_str();
  demo_cmd->add_flag("--quiet,-q", demo_quiet, "no progress line");

  if (argc > 1 && argv[1][0] != '-') {
    const std::string command = argv[1];
    auto subs = app.get_subcommands([](CLI::App*) { return true; });
    if (std::none_of(subs.begin(), subs.end(), [&](CLI::App* s) { return s->get_name() == command; })) {
      std::cerr << "nmcmc: unknown command '" << command << "' (run `nmcmc --help`)\n";
      return nmcmc::kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "nmcmc: " << e.what() << "\n(run `nmcmc --help` or `nmcmc COMMAND --help`)\n";
    return nmcmc::kExitUsage;
  }

  try {
    if (*targets) return cmd_targets();
    if (*sample_cmd) {
      std::vector<std::string> given;
      for (auto* opt : sample_cmd->get_options()) {
        if (opt->count() > 0) given.push_back(opt->get_name(false, true));
      }
      for (auto& g : given) g.erase(0, g.find_first_not_of('-'));
      return cmd_sample(sample, given);
    }
    if (*train_cmd) return cmd_train(train);
    if (*ref_cmd) return cmd_reference(ref);
    if (*info_cmd) return cmd_info();
    if (*repro_cmd && !repro_table.empty()) {
      std::cout << nmcmc::results_table(nmcmc::read_config_file(repro_table));
      return 0;
    }
    if (*repro_cmd) {
      std::stringstream ss(repro_only);
      for (std::string item; std::getline(ss, item, ',');) {
        if (!item.empty()) repro.only.push_back(item);
      }
      repro.figures = !repro_no_figures;
      return cmd_reproduce(repro, repro_quiet);
    }
    if (*demo_cmd) return cmd_demo(demo_output, demo_quiet);
    if (*ebm_train_cmd) return cmd_ebm_train(ebm);
    if (*ebm_sample_cmd) return cmd_ebm_sample(ebm_sample);
  } catch (const nmcmc::UsageError& e) {
    std::cerr << "nmcmc: " << e.what() << "\n";
    return nmcmc::kExitUsage;
  } catch (const nmcmc::DataError& e) {
    std::cerr << "nmcmc: " << e.what() << "\n";
    return nmcmc::kExitData;
  } catch (const nmcmc::IoError& e) {
    std::cerr << "nmcmc: " << e.what() << "\n";
    return nmcmc::kExitIo;
  } catch (const c10::Error& e) {
    std::cerr << "nmcmc: internal error: " << e.what_without_backtrace() << "\n";
    return nmcmc::kExitSoftware;
  } catch (const std::exception& e) {
    std::cerr << "nmcmc: internal error: " << e.what() << "\n";
    return nmcmc::kExitSoftware;
  }
  return nmcmc::kExitUsage;
}
