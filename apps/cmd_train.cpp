// `nmcmc train`: trains the learned sampler from a config (resumable; Ctrl-C saves).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include <filesystem>
#include <iostream>

#include "cli.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/services/train.hpp"

namespace nmcmc::cli {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct TrainArgs {
  std::optional<std::string> config;
  std::string output;
  TargetArgs target;
  std::optional<std::string> log;
  std::vector<std::string> sets;
  std::optional<int64_t> steps, batch;
  std::optional<double> ess;
  std::optional<double> lr, min_lr;
  std::optional<uint64_t> seed;
  std::optional<std::string> from;
  TransportChoice transport;  // its kind replaces the config's where --transport is given
  std::optional<Engine> engine;
  bool resume = false, quiet = false;
  ComputeArgs compute;
  DistArgs dist;
};

/// The training config a command line asks for: a config file, or (your own target) the defaults
/// of Note [Training budget]; target options replace its target, flags and --set its values.
TrainConfig train_config(const TrainArgs& a, const CLI::App* cmd) {
  const bool target_given = TargetArgs::given(cmd);
  if (!a.config && !target_given) throw UsageError("give --config FILE, or a target (--target ..., --module FILE)");
  json cfg = a.config ? read_train_config_file(*a.config) : default_train_config();
  if (target_given) cfg["target"] = a.target.spec();
  if (!cfg.contains("name") && cfg.contains("target") && cfg["target"].is_object()) cfg["name"] = cfg["target"].value("name", "model");
  if (a.steps) cfg["train"]["steps"] = *a.steps;
  if (a.batch) cfg["train"]["batch"] = *a.batch;
  if (a.ess) cfg["train"]["ess_goal"] = *a.ess;
  if (a.lr) cfg["train"]["lr"] = *a.lr;
  if (a.min_lr) cfg["train"]["min_lr"] = *a.min_lr;
  if (a.seed) cfg["train"]["seed"] = *a.seed;
  if (a.compute.dtype) cfg["dtype"] = *a.compute.dtype;
  if (cmd->count("--transport")) cfg["transport"] = json{{"kind", a.transport.kind}};
  if (a.from) {
    if (a.resume) throw UsageError("--from starts a new model from another data set's; --resume continues this one");
    cfg["from"] = *a.from;
  }
  // (without --transport, parse_train_config refuses them unless the config's transport takes them)
  if (cfg.contains("transport") && cfg["transport"].is_string()) cfg["transport"] = json{{"kind", cfg["transport"]}};
  if (a.transport.layers) cfg["transport"]["layers"] = *a.transport.layers;
  if (a.transport.rounds) cfg["transport"]["rounds"] = *a.transport.rounds;
  if (a.engine) cfg["engine"] = *a.engine;  // Note [Native copies] (parse_train_config)
  for (const auto& s : a.sets) apply_override(cfg, s);
  return parse_train_config(cfg);
}

/// What the warm-up did: transport auto's choice, the flow's fits, the preconditioner's warm-up
/// and, from a previous model, how its networks fit the new data.
void report_warmup(const TrainResult& result) {
  if (!result.preconditioner.is_null()) {
    const json& p = result.preconditioner;
    if (p.contains("auto") && p["auto"].is_object()) {
      const json& au = p["auto"];
      const json& f = au.value("fisher_per_dim", json(nullptr));
      std::cout << fmt::format("transport auto: the affine map leaves a Fisher divergence of {} per dimension "
                               "(threshold {:.3g}): {}\n",
                               f.is_number() ? fmt::format("{:.3g}", f.get<double>()) : std::string("n/a"),
                               au.value("threshold", 0.0),
                               au.value("chose", "") == "flow" ? "the proposal trains in a flow transport's latent space"
                                                                : au.contains("why") ? au["why"].get<std::string>()
                                                                                     : "the affine map is kept");
    }
    if (p.contains("transport") && p["transport"].is_object()) {
      const json& t = p["transport"];
      const json& rounds = t.value("rounds", json::array());
      std::cout << fmt::format("flow transport: {} coupling layers fitted in {} rounds of the warm-up ({:.1f} s of fitting; "
                               "held-out Fisher loss {:.4g})\n",
                               t.value("layers", 0), rounds.size(), t.value("fit_seconds", 0.0),
                               rounds.empty() ? 0.0 : rounds.back()["fit"].value("loss_end", 0.0));
    }
    std::cout << fmt::format("preconditioner ({}): {} warm-up of {} chains x {} iterations, {} target gradient evaluations, "
                             "{:.1f} s; step size {:.3g}\n",
                             p.value("kind", ""), p.value("sampler", ""), p.value("chains", 0), p.value("warmup", 0) + p.value("draws", 0),
                             p.value("grads", 0), p.value("seconds", 0.0), p.value("step_size", 0.0));
    if (p.contains("refit") && p["refit"].is_object()) {
      std::cout << fmt::format("  (of which the second stage, with the first fit as the metric and the factors refitted from "
                               "its draws: {} iterations, {} gradient evaluations, {:.1f} s)\n",
                               p["refit"].value("warmup", 0) + p["refit"].value("draws", 0), p["refit"].value("grads", 0),
                               p["refit"].value("seconds", 0.0));
    }
  }
  if (result.from.is_object()) {  // Note [Training from a previous model]
    const json& f = result.from;
    std::cout << fmt::format("started from {} ({} steps on {}); beta {:.3g}{}\n", f.value("model", ""), f.value("steps", 0),
                             f.value("target", json()).is_object() ? f["target"].dump() : std::string("?"),
                             f.value("beta", 0.0),
                             f.value("flow_kept", false) ? "; its flow transport kept as it is, the affine map on top moved" : "");
    if (f.contains("fits")) {
      const json& r = f["ess_of_previous"];
      std::cout << fmt::format("after the affine map moved, the previous networks' mixing check {} with {} of the previous "
                               "model's min bulk-ESS: {}\n",
                               f.value("check_passed", false) ? "passes" : "fails",
                               r.is_number() ? fmt::format("{:.0f} %", 100 * r.get<double>()) : std::string("n/a"),
                               f.value("fits", false) ? "they fit these data, no training step was taken"
                               : result.steps > 0 ? "trained on" : "not trained (--steps 0)");
    }
    if (f.contains("first_check") && !f["first_check"].value("passes", true)) {
      std::cout << fmt::format("the mixing check at the first plateau failed ({}): training went on under train.patience\n",
                               f["first_check"].value("why", ""));
    }
  }
}

/// Why training stopped where it did, and the checks that let it go on past a stop.
void report_stop(const TrainResult& result, const TrainConfig& config) {
  if (result.stopped == "plateau") {
    std::cout << fmt::format("stopped at step {} of {}: the proposal entropy gained less than {} nats per dimension in "
                             "the last {} steps (train.patience)\n",
                             result.steps, config.train.budget.steps, config.train.budget.min_gain,
                             config.from.empty() ? config.train.budget.patience.value_or(0) : config.train.budget.from_patience);
  }
  if (result.stopped == "cost" && !result.probes.empty()) {
    const json& last = result.probes.back();
    double best = INFINITY;
    int64_t best_step = 0;
    for (const json& p : result.probes) {
      if (p["projected_grads"].is_number() && p["projected_grads"].get<double>() < best) {
        best = p["projected_grads"].get<double>();
        best_step = p.value("step", int64_t{0});
      }
    }
    std::cout << fmt::format("stopped at step {} of {}: training no longer pays for {:.0f} effective draws (train.ess_goal): "
                             "the projected all-in cost was lowest at step {} ({:.3g} gradients) and has not fallen in "
                             "the two probes since ({:.3g} at step {})\n",
                             result.steps, config.train.budget.steps, config.train.budget.ess_goal.value_or(0), best_step, best,
                             last["projected_grads"].is_number() ? last["projected_grads"].get<double>() : NAN,
                             last.value("step", int64_t{0}));
  }
  // Note [A long warm-up shortens training], Note [A plateau that does not mix]: the checks that
  // failed at a stop and let training go on, by the rule that would have stopped it (records
  // written before Note [An extension that does not pay]: every failed one extended)
  auto extended_at = [&](const char* stop) {
    return static_cast<int64_t>(std::count_if(result.time_extensions.begin(), result.time_extensions.end(), [&](const auto& c) {
      return c.value("extends", !c.value("passes", true)) && c.value("stop", std::string("time")) == stop;
    }));
  };
  const int64_t extended = extended_at("time"), plateaus = extended_at("plateau");
  if (plateaus > 0) {
    std::cout << fmt::format("training went on past {} plateau(s) of the proposal entropy: the sampler did not mix there "
                             "yet (Note [A plateau that does not mix])\n",
                             plateaus);
  }
  if (extended > 0) {
    std::cout << fmt::format("the time budget was extended {} time(s): at its end the sampler did not mix yet (Note [A "
                             "long warm-up shortens training])\n",
                             extended);
  }
  // Note [An extension that does not pay]: the check failed at the stop and had not improved
  const nlohmann::json& check = result.check;
  if (check.is_object() && check.value("extends", true) == false && !check.value("passes", true) &&
      !result.time_extensions.empty()) {
    const nlohmann::json& before = result.time_extensions.back();
    std::cout << fmt::format("training was not extended again: its mixing check did not improve on the previous one "
                             "(min bulk-ESS {:.0f} -> {:.0f}, max R-hat {:.3g} -> {:.3g}; Note [An extension that does "
                             "not pay])\n",
                             before.value("min_ess_bulk", 0.0), check.value("min_ess_bulk", 0.0),
                             before.value("max_rhat", 0.0), check.value("max_rhat", 0.0));
  }
  if (result.stopped == "time") {
    const bool shortened = result.preconditioner.is_object() && result.preconditioner.contains("train_time_limit");
    const double base = shortened ? result.preconditioner["train_time_limit"].get<double>() : config.train.budget.max_seconds.value_or(0);
    std::cout << fmt::format("stopped at step {} of {}: the time budget of {:.4g} s of training steps was spent "
                             "(train.max_seconds{})\n",
                             result.steps, config.train.budget.steps, base + static_cast<double>(extended) * config.train.budget.max_seconds.value_or(0),
                             std::string(shortened ? ", shortened by the long warm-up" : "") +
                                 (extended > 0 ? fmt::format(", extended {} time(s)", extended) : ""));
  }
}

int run(const TrainArgs& a, const CLI::App* cmd) {
  TrainConfig config = train_config(a, cmd);
  auto options = a.compute.options(config.dtype);
  auto comm = a.dist.connect(options);
  const bool root = comm->is_root();
  const std::string out_dir = fs::path(a.output).parent_path().string();
  if (!out_dir.empty() && root) ensure_directory(out_dir);
  const std::string log_path = a.log.value_or(fs::path(a.output).replace_extension("").string() + ".log.csv");
  if (root) warn_blas();
  install_stop_handler();
  auto result = train(config, options.device(), a.output, log_path, a.resume, train_progress(a.quiet || !root, ""),
                      stop_requested, comm);
  if (!root) return result.interrupted ? 130 : 0;
  if (result.interrupted && !result.saved) {
    std::cerr << "\nnmcmc: interrupted in the preconditioner warm-up; nothing written (run again)\n";
    return 130;
  }
  if (result.interrupted) {
    std::cerr << "\nnmcmc: interrupted at step " << result.steps << "; checkpoint saved to " << a.output
              << " (continue with --resume)\n";
    return 130;
  }
  report_warmup(result);
  report_stop(result, config);
  std::cout << fmt::format("trained {} steps in {:.1f} s ({} target gradient evaluations per batch row; GEMMs in {}); "
                           "model: {}; log: {}\n",
                           result.steps, result.seconds, result.grads,
                           matmul_summary(config.model.matmul, options.dtype().toScalarType(), options.device()), a.output,
                           log_path);
  if (result.check.is_object()) {  // Note [The mixing check]
    const auto& c = result.check;
    const std::string what = fmt::format("{} chains x {} draws from the training's chains: max R-hat {:.3f}, accept {:.2f}, "
                                         "{:.0f} % of the chains moved, min bulk-ESS {:.0f} ({} target gradient evaluations, "
                                         "{:.1f} s)",
                                         c.value("chains", 0), c.value("draws", 0), c.value("max_rhat", 0.0),
                                         c.value("accept", 0.0), 100 * c.value("moved", 0.0), c.value("min_ess_bulk", 0.0),
                                         c.value("grads", 0), c.value("seconds", 0.0));
    if (c.value("passes", false)) {
      std::cout << "mixing check: " << what << "\n";
    } else {
      std::cerr << fmt::format("nmcmc: WARNING: the trained sampler does not mix ({}{}): {}. Its draws would not be "
                               "trustworthy: train longer (--steps, train.max_seconds) or use NUTS (a scale that "
                               "moves only with what it scales: NUTS, or NUTS with --transport flow)\n",
                               c.value("why", ""), slowest_parameter_phrase(c), what);
    }
  }
  if (result.skipped > 0) {
    std::cerr << fmt::format("nmcmc: WARNING: {} of {} training steps were skipped because the gradient was not finite; "
                             "see the 'skipped' column of {}\n",
                             result.skipped, result.steps, log_path);
  }
  if (result.bad_rows > 0) {
    std::cout << fmt::format("{} proposals met a non-finite energy or gradient and were rejected (not trained on)\n",
                             result.bad_rows);
  }
  if (comm->world_size() > 1) {
    std::cout << fmt::format("data-parallel over {} processes ({} shards per batch): rank 0 spent {:.1f} s ({:.1f} %) in "
                             "{} collectives moving {:.1f} MB\n",
                             comm->world_size(), result.shards,
                             result.comm.seconds, 100.0 * result.comm.seconds / std::max(1e-9, result.seconds),
                             result.comm.calls, result.comm.bytes / 1e6);
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "train the learned sampler (resumable; checkpoints written atomically)");
  cmd->add_option("--config,-c", a->config, "configuration JSON (see configs/); or give a target and train with the defaults");
  a->target.add(cmd);
  cmd->add_option("--output,-o", a->output, "checkpoint file to write")->required();
  cmd->add_option("--log", a->log, "training log CSV (default: OUTPUT without extension + .log.csv)");
  cmd->add_option("--steps", a->steps, "override train.steps");
  cmd->add_option("--batch", a->batch, "override train.batch");
  cmd->add_option("--ess", a->ess,
                  "the effective draws you want (train.ess_goal; default 10000 without --config; 0: off): training "
                  "stops once the projected all-in cost to reach them stops falling (Note [Training stops when it no "
                  "longer pays])");
  cmd->add_option("--lr", a->lr, "override train.lr");
  cmd->add_option("--min-lr", a->min_lr, "override train.min_lr");
  cmd->add_option("--seed", a->seed, "override train.seed (a non-negative integer)")->check(cli::seed_validator());
  cmd->add_option("--set", a->sets, "override any value: section.key=value (e.g. model.hidden=64)");
  cmd->add_flag("--resume", a->resume, "continue from OUTPUT if it exists");
  add_enum_option(cmd, "--engine", a->engine,
                  "nmcmc's own copies of LibTorch paths in training and in the model (a TorchScript module's "
                  "evaluator, the learned step, the flow's passes and fit): auto takes each where it pays, native "
                  "wherever it applies, libtorch never (model.engine, transport.engine)");
  cmd->add_option("--from", a->from,
                  "start from a model trained on another data set of the same model (its checkpoint): its networks, "
                  "step size and beta; a short warm-up moves the affine map to the new data, then training goes on "
                  "until its entropy stops improving (train.from_warmup, train.from_patience); --steps 0: re-adapt "
                  "the map only and check that the sampler still mixes");
  add_transport_options(cmd, a->transport,
                        "flow: fit a normalizing flow in the warm-up and train the proposal in its latent space "
                        "(docs/transport.md); none: the affine preconditioner only; auto (the default without a "
                        "config): the flow where the affine map does not fit the posterior",
                        /*sampling=*/false, kTrainTransportRounds);
  a->compute.add(cmd, "float32 | float64 (default: the config's)");
  a->dist.add(cmd);
  cmd->add_flag("--quiet,-q", a->quiet, "no progress line");
  return {cmd, [a, cmd] { return run(*a, cmd); }};
}

}  // namespace nmcmc::cli
