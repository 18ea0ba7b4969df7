// `nmcmc sample`: any sampler on any target; Stan CSV, ArviZ InferenceData and a summary.
#include <fmt/format.h>

#include <iostream>

#include "cli.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/services/sample.hpp"

namespace nmcmc::cli {

using json = nlohmann::json;

namespace {

struct SampleArgs {
  TargetArgs target;
  ComputeArgs compute;  // --dtype, --device (into options) and --threads
  SampleOptions options;
  int64_t rows = 8;
  std::optional<std::string> warm_start;
  bool quiet = false;
  DistArgs dist;
};

int run(SampleArgs a, const CLI::App* cmd) {
  SampleRequest r;
  // A learned sampler runs on its model's own target unless one is given (then it must agree).
  r.target = a.options.sampler == SamplerKind::kLearned && !TargetArgs::given(cmd) ? json() : a.target.spec();
  a.options.dtype = a.compute.dtype;
  if (a.warm_start) a.options.warm_start = *a.warm_start;
  a.options.device = a.compute.device;
  torch::TensorOptions device = a.compute.options();  // validates, applies --threads
  const OutputFormats formats = parse_formats(a.options.formats);
  r.command = command_line();
  auto comm = a.dist.connect(device);
  a.options.device = device.device().str();  // cuda without an index became cuda:LOCAL_RANK
  r.options = a.options;
  const bool root = comm->is_root();
  if (root) warn_blas();
  install_stop_handler();
  r.should_stop = stop_requested;
  SampleOutcome out = sample(r, sample_progress(a.quiet || !root), comm);
  if (!root) return out.result.complete ? 0 : 130;
  if (out.summary.is_null()) {
    std::cerr << "\nnmcmc: interrupted during warm-up; nothing was drawn or written\n";
    return 130;
  }
  std::cout << format_summary(out.summary, a.rows);
  if (out.summary.contains("model_fit")) {  // Note [Training from a previous model]
    const json& f = out.summary["model_fit"];
    const bool other = f.value("other_data", false);
    const std::string line = fmt::format("{}accept rate {:.2f} here, {:.2f} in its training's check",
                                         other ? "the model was trained on other data (" + f["trained_on"].value("data", "?") + "): " : "",
                                         f.value("accept", 0.0), f.value("trained_accept", 0.0));
    if (!f.value("fits", true)) std::cerr << "nmcmc: WARNING: " << line << ": " << f.value("note", "") << "\n";
    else if (other) std::cout << line << "\n";
    const json check = f.value("training_check", json());
    if (check.is_object() && !check.value("passes", true)) {  // Note [The mixing check]
      std::cerr << "nmcmc: WARNING: this model did not mix in its training's check (" << check.value("why", "")
                << slowest_parameter_phrase(check)
                << "): do not trust these draws without the R-hat and ESS above; train on (nmcmc train --from MODEL) "
                   "or use NUTS\n";
    }
  }
  const SampleOptions& o = a.options;
  if (o.output) {
    std::string what;
    if (formats.csv) what += fmt::format("{} Stan-CSV files (chain_N.csv), ", o.chains);
    if (formats.netcdf) what += "ArviZ InferenceData (inference_data.nc), ";
    std::cout << "wrote " << what << "summary.json to " << *o.output << "\n";
  }
  if (comm->world_size() > 1) {
    std::cout << fmt::format("sharded over {} processes: rank r ran its block of chains with seed {} + r\n",
                             comm->world_size(), o.seed);
  }
  if (!out.result.complete) {
    std::cerr << "\nnmcmc: interrupted after " << out.result.draws.size(0) << " of " << o.draws
              << " draws; the summary above and the files" << (o.output ? " (marked complete = false)" : "")
              << " hold what was drawn\n";
    return 130;
  }
  return 0;
}

}  // namespace

Command add_sample_command(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "sample a target with a baseline or learned sampler; write Stan-CSV and a summary");
  a->target.add(cmd);
  a->compute.add(cmd, "float32 | float64 (default float32; the learned sampler: the model's)");
  add_enum_option(cmd, "--sampler", a->options.sampler, "the sampler");
  cmd->add_option("--model", a->options.model, "checkpoint of a trained sampler (with --sampler learned)");
  add_enum_option(cmd, "--matmul", a->options.matmul,
                  "the learned sampler's GEMMs' precision (default: the model's model.matmul; auto: bfloat16 on a "
                  "CPU with AMX-BF16); exact in either");
  add_enum_option(cmd, "--gemm", a->options.gemm,
                  "where the learned sampler's float32 GEMMs run (default: the model's model.gemm; auto: oneDNN "
                  "with one thread, LibTorch's BLAS otherwise)");
  cmd->add_option("--persistence", a->options.persistence,
                  "the learned sampler's base draw carried from step to step, z0 <- rho z0 + sqrt(1 - rho^2) xi, as "
                  "generalised HMC carries its momentum (default 0.6; 0: a fresh draw each step, the paper's "
                  "sampler; docs/commands.md)");
  cmd->add_option("--thin", a->options.thin,
                  "keep every N-th step as a draw; the draw's figures count every step behind it (default 1; the "
                  "learned sampler: about half the steps per effective draw its training's mixing check measured, "
                  "at most 50; docs/commands.md)");
  add_enum_option(cmd, "--engine", a->options.engine,
                  "nmcmc's own copies of LibTorch paths (a TorchScript module's evaluator, the learned step, the "
                  "flow's passes): auto takes each where it pays, native wherever it applies, libtorch never "
                  "(docs/commands.md)");
  cmd->add_option("--step-size", a->options.step_size, "initial step size (default: found automatically)");
  cmd->add_option("--leapfrog", a->options.leapfrog, "HMC leapfrog steps")->capture_default_str();
  cmd->add_option("--max-depth", a->options.max_depth, "NUTS: maximum tree depth")->capture_default_str();
  cmd->add_option("--metric", a->options.metric,
                  "unit | diag | dense | fisher-diag | fisher-lowrank: the metric adapted over Stan's warm-up "
                  "windows, from the draws (diag, dense: Stan's) or from draws and gradients (fisher-*: nutpie's; "
                  "docs/metrics.md); default: diag for nuts, unit for the others");
  add_transport_options(cmd, a->options.transport,
                        "none | flow | auto: sample the target pulled back through a normalizing flow fitted during "
                        "warm-up from the chains' draws and gradients; auto: only where the warm-up's draws are far "
                        "from any Gaussian, else as none (docs/transport.md)",
                        /*sampling=*/true, kDefaultTransportRounds);
  cmd->add_option("--jitter", a->options.jitter, "HMC: per-chain step-size jitter j, eps * (1 + j U(-1,1))")->capture_default_str();
  cmd->add_option("--chains", a->options.chains, "number of chains")->capture_default_str();
  cmd->add_option("--warmup", a->options.warmup, "warm-up (adaptation) steps")->capture_default_str();
  cmd->add_option("--draws", a->options.draws, "draws kept per chain")->capture_default_str();
  cmd->add_option("--seed", a->options.seed, "random seed (a non-negative integer)")->check(cli::seed_validator())->capture_default_str();
  cmd->add_option("--target-accept", a->options.target_accept, "accept-rate target of step-size adaptation (default: per sampler)");
  cmd->add_flag("--adapt-mass", a->options.adapt_mass, "adapt a diagonal mass matrix over Stan's warm-up windows (= --metric diag)");
  cmd->add_flag("--no-adapt", a->options.no_adapt, "keep --step-size fixed during warm-up");
  cmd->add_flag("--step-size-per-chain", a->options.step_size_per_chain,
                "NUTS: each chain adapts its own step size, as Stan (default: one for all chains, on their mean accept rate)");
  cmd->add_option("--init", a->options.init,
                  "auto | uniform (U(-2,2)) | exact | zero | buffer (the learned sampler's own chains, saved with its "
                  "checkpoint); auto: buffer for a learned sampler that has one, else uniform")
      ->capture_default_str();
  cmd->add_option("--warm-start", a->warm_start,
                  "a previous run of the same model on other data (its --output directory or summary.json): start "
                  "the chains where it ended, with its step size and metric, and warm up briefly (give --warmup, "
                  "e.g. 150); the metric is kept unless --metric is given (docs/commands.md, Warm starts)");
  cmd->add_option("--output,-o", a->options.output, "directory for the draws and summary.json");
  cmd->add_option("--format", a->options.formats,
                  "draw files with --output: csv (Stan CSV per chain), netcdf (ArviZ InferenceData, "
                  "inference_data.nc) or csv,netcdf")
      ->capture_default_str();
  cmd->add_option("--rows", a->rows, "summary rows to show (first and worst)")->capture_default_str();
  cmd->add_flag("--quiet,-q", a->quiet, "no progress line");
  a->dist.add(cmd);
  return {cmd, [a, cmd] { return run(*a, cmd); }};
}

}  // namespace nmcmc::cli
