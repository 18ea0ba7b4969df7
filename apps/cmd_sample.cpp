// `nmcmc sample`: any sampler on any target; Stan-CSV and a summary.
#include <fmt/format.h>

#include <iostream>

#include "cli.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/version.hpp"

namespace nmcmc::cli {

using json = nlohmann::json;

namespace {

struct SampleArgs {
  TargetArgs target;
  ComputeArgs compute;
  std::string sampler = "hmc", init = "uniform";
  std::optional<std::string> output, model, metric;
  std::optional<double> step_size, target_accept;
  double jitter = 0;
  int64_t leapfrog = 10, max_depth = 10, chains = 4, warmup = 1000, draws = 1000, rows = 8;
  uint64_t seed = 1;
  bool adapt_mass = false, no_adapt = false, quiet = false;
};

json run_config(const SampleArgs& a, const Target& t) {
  return {{"command", command_line()},
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
          {"dtype", a.compute.dtype.value_or("float32")},
          {"device", a.compute.device},
          {"threads", torch::get_num_threads()},
          {"nmcmc_version", NMCMC_VERSION}};
}

int run(const SampleArgs& a, const CLI::App* cmd) {
  auto options = a.compute.options();
  std::unique_ptr<Kernel> kernel;
  // The metric: --metric, or --adapt-mass (= diag); NUTS adapts a diagonal one by default, as Stan.
  const bool nuts = a.sampler == "nuts";
  if (a.metric && a.adapt_mass && *a.metric != "diag") throw UsageError("--adapt-mass means --metric diag");
  const MetricKind metric = parse_metric(a.metric.value_or(a.adapt_mass || nuts ? "diag" : "unit"));
  json target_spec = a.target.spec();
  json model_meta;
  const bool learned = a.sampler == "learned";
  if (learned && metric != MetricKind::kUnit) throw UsageError("--metric and --adapt-mass do not apply to the learned sampler");
  if (learned) {
    if (!a.model) throw UsageError("--sampler learned needs --model FILE (from `nmcmc train`)");
    const bool target_given = TargetArgs::given(cmd);
    LearnedRun lr = load_learned_run(*a.model, target_given ? std::optional<json>(target_spec) : std::nullopt, options,
                                     a.compute.dtype.has_value());
    kernel = std::make_unique<MetropolisHastings>(lr.proposal);
    target_spec = lr.target_spec;
    model_meta = lr.meta;
    options = lr.options;
  } else {
    if (a.model) throw UsageError("--model goes with --sampler learned");
    kernel = make_baseline_kernel(ProposalOptions()
                                      .set_sampler(a.sampler)
                                      .set_step_size(a.step_size)
                                      .set_leapfrog(a.leapfrog)
                                      .set_jitter(a.jitter)
                                      .set_max_depth(a.max_depth));
  }
  if (a.no_adapt && !a.step_size) throw UsageError("--no-adapt needs --step-size");
  if (learned && a.step_size) throw UsageError("--step-size does not apply to the learned sampler (its step size is learned)");
  auto target = make_target(target_spec, options);
  if (a.output) ensure_directory(*a.output);  // fail before the run, not after
  RunOptions run;
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_init(a.init);
  run.set_adapt_mass(metric != MetricKind::kUnit).set_dense_mass(metric == MetricKind::kDense);
  // Unset for the learned sampler: its step size is learned, so warm-up is burn-in only.
  if (!learned) run.set_adapt_step(!a.no_adapt);
  run.set_target_accept(a.target_accept.value_or(default_target_accept(a.sampler)));
  warn_blas();
  auto result = run_sampler(*target, *kernel, run, a.seed, sample_progress(a.quiet));
  json summary = summarise(result, *target);
  std::cout << format_summary(summary, a.rows);
  if (a.output) {
    json config = run_config(a, *target);
    config["adapt_mass"] = run.adapt_mass;
    if (nuts) config["max_depth"] = a.max_depth;
    if (metric == MetricKind::kDense || nuts) config["metric"] = metric_name(metric);
    if (learned) config["model"] = {{"file", *a.model}, {"options", model_meta["model"]}, {"trained_steps", model_meta["step"]}};
    write_run(*a.output, config, result, summary);
    std::cout << "wrote " << a.chains << " Stan-CSV files and summary.json to " << *a.output << "\n";
  }
  return 0;
}

}  // namespace

Command add_sample_command(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "sample a target with a baseline or learned sampler; write Stan-CSV and a summary");
  a->target.add(cmd);
  a->compute.add(cmd, "float32 | float64 (default float32; the learned sampler: the model's)");
  cmd->add_option("--sampler", a->sampler, "rwm | mala | hmc | nuts | learned")->capture_default_str();
  cmd->add_option("--model", a->model, "checkpoint of a trained sampler (with --sampler learned)");
  cmd->add_option("--step-size", a->step_size, "initial step size (default: found automatically)");
  cmd->add_option("--leapfrog", a->leapfrog, "HMC leapfrog steps")->capture_default_str();
  cmd->add_option("--max-depth", a->max_depth, "NUTS: maximum tree depth")->capture_default_str();
  cmd->add_option("--metric", a->metric,
                  "unit | diag | dense: the metric adapted over Stan's warm-up windows (default: diag for nuts, "
                  "unit for the others)");
  cmd->add_option("--jitter", a->jitter, "HMC: per-chain step-size jitter j, eps * (1 + j U(-1,1))")->capture_default_str();
  cmd->add_option("--chains", a->chains, "number of chains")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "warm-up (adaptation) steps")->capture_default_str();
  cmd->add_option("--draws", a->draws, "draws kept per chain")->capture_default_str();
  cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
  cmd->add_option("--target-accept", a->target_accept, "accept-rate target of step-size adaptation (default: per sampler)");
  cmd->add_flag("--adapt-mass", a->adapt_mass, "adapt a diagonal mass matrix over Stan's warm-up windows (= --metric diag)");
  cmd->add_flag("--no-adapt", a->no_adapt, "keep --step-size fixed during warm-up");
  cmd->add_option("--init", a->init, "uniform (U(-2,2)) | exact | zero")->capture_default_str();
  cmd->add_option("--output,-o", a->output, "directory for chain_N.csv and summary.json");
  cmd->add_option("--rows", a->rows, "summary rows to show (first and worst)")->capture_default_str();
  cmd->add_flag("--quiet,-q", a->quiet, "no progress line");
  return {cmd, [a, cmd] { return run(*a, cmd); }};
}

}  // namespace nmcmc::cli
