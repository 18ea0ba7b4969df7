#include "nmcmc/services/compare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/kernels/warm_start.hpp"
#include "nmcmc/services/figures.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

double num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN; }

RunCost cost_of(const json& r) { return run_cost_from_json(r.at("cost")); }

/// The NUTS runs' names in compare.json: "nuts" (Stan's diagonal metric), "nuts_dense", ...
std::string nuts_name(MetricAdapt m) {
  if (m == MetricAdapt::kDiag) return "nuts";
  std::string n = "nuts_" + enum_name(m);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

/// The learned sampler against the best of the NUTS runs that converged (Note [The best NUTS]).
json against_best_nuts(const json& samplers) {
  const json& l = samplers.at("learned");
  std::map<std::string, RunCost> nuts;
  std::vector<std::string> names;
  for (auto it = samplers.begin(); it != samplers.end(); ++it) {
    if (it.key().rfind("nuts", 0) == 0 && it.value().value("converged", false)) {
      nuts[it.key()] = cost_of(it.value());
      names.push_back(it.key());
    }
  }
  json out = l.value("converged", false) ? against_best(cost_of(l), nuts) : json::object();
  out["nuts_runs"] = names;
  return out;
}

/// Note [All-in accounting]: the learned sampler's preconditioner and training are paid before its
/// warm-up.
void add_training_cost(json& l, const json& training) {
  json& cost = l["cost"];
  cost["fixed_grads"] = cost["fixed_grads"].get<double>() + training["grads_total"].get<double>() +
                        training["preconditioner_grads"].get<double>();
  cost["fixed_seconds"] = cost["fixed_seconds"].get<double>() + training["seconds"].get<double>() +
                          training["preconditioner_seconds"].get<double>();
  l["all_in"] = all_in_json(cost_of(l));
}

/// One sampler's row: the figures every sampler is compared on.
/// Above this R-hat, or below this accept rate, a run is reported as not converged.
constexpr double kMaxRhat = 1.01, kMinAccept = 0.05;

json row(const SampleResult& r, Target& target) {
  json s = summarise(r, target);
  const double draws = s["draws"].get<double>() * s["chains"].get<double>();
  const double g = s["grads_per_step"].get<double>();
  json out;
  out["accept"] = s["accept_rate"];
  out["grads_per_draw"] = g;
  out["step_size"] = s["step_size"];
  for (const char* kind : {"bulk", "tail"}) {
    const double ess = s[fmt::format("min_ess_{}", kind)].get<double>();
    out[fmt::format("{}_ess_per_draw", kind)] = ess / draws;
    out[fmt::format("{}_ess_per_grad", kind)] = g > 0 ? ess / (draws * g) : NAN;
    out[fmt::format("{}_ess_per_second", kind)] = ess / s["seconds_sampling"].get<double>();
  }
  if (s.contains("paper_ess")) {
    out["paper_ess_per_draw"] = s["paper_ess"]["ess_per_step_min"];
    out["paper_ess_per_grad"] = g > 0 ? s["paper_ess"]["ess_per_step_min"].get<double>() / g : NAN;
  }
  out["max_rhat"] = s["max_rhat"];
  // A run whose chains disagree (R-hat above 1.01) or that barely moves has no efficiency to
  // compare: its ESS figures are not estimates of anything.
  const double rhat = s["max_rhat"].get<double>(), accept = s["accept_rate"].get<double>();
  out["converged"] = std::isfinite(rhat) && rhat <= kMaxRhat && accept >= kMinAccept;
  out["divergences"] = s["divergences"];
  out["seconds_warmup"] = s["seconds_warmup"];
  out["seconds_sampling"] = s["seconds_sampling"];
  out["metric"] = s["metric"];
  // Note [All-in accounting]: its warm-up is the fixed cost (the learned sampler adds training)
  RunCost cost;
  cost.fixed_grads = s["grads_warmup_per_chain"].get<double>() * s["chains"].get<double>();
  cost.fixed_seconds = s["seconds_warmup"].get<double>();
  cost.sampling_grads = draws * g;
  cost.sampling_seconds = s["seconds_sampling"].get<double>();
  cost.ess = s["min_ess_bulk"].get<double>();
  out["cost"] = to_json_value(cost);
  out["all_in"] = all_in_json(cost);
  if (s.contains("tree_depth_hits")) {
    out["tree_depth_hits"] = s["tree_depth_hits"];
    out["mean_tree_depth"] = s["mean_tree_depth"];
  }
  return out;
}

/// The parameter with the smallest bulk ESS in a run (for the trace figure).
int64_t worst_parameter(const SampleResult& r, Target& target) {
  json s = summarise(r, target);
  int64_t worst = 0;
  double lowest = INFINITY;
  for (size_t k = 0; k < s["parameters"].size(); ++k) {
    const double e = s["parameters"][k]["ess_bulk"].get<double>();
    if (std::isfinite(e) && e < lowest) {
      lowest = e;
      worst = static_cast<int64_t>(k);
    }
  }
  return worst;
}

/// The learned sampler compare runs: a given model, or one trained now from a config (resumable),
/// with what its training cost (Note [All-in accounting]).
struct LearnedInput {
  std::optional<std::string> model;
  std::optional<LearnedRun> run;
  json training;
  json target_spec;
};
LearnedInput learned_input(const CompareOptions& o, const torch::TensorOptions& options,
                           const std::function<void(const std::string&)>& tell, const TrainProgressFn& train_progress,
                           const std::function<bool()>& should_stop, const std::shared_ptr<parallel::Communicator>& comm) {
  LearnedInput li;
  li.model = o.model;
  li.target_spec = o.target;
  if (o.config) {
    json cfg = read_train_config_file(*o.config);
    if (!li.target_spec.is_null()) cfg["target"] = li.target_spec;
    TrainConfig config = parse_train_config(cfg);
    li.model = (fs::path(o.output) / "model.pt").string();
    tell(fmt::format("training the learned sampler ({} steps, batch {}) into {}", config.train.budget.steps, config.train.batch, *li.model));
    TrainResult t = train(config, torch::kCPU, *li.model, (fs::path(o.output) / "training_log.csv").string(), /*resume=*/true,
                          comm->is_root() ? train_progress : nullptr, should_stop, comm);
    if (t.interrupted) throw ExitError("interrupted while training; the training is saved (run the same command again to continue)", 130);
    li.target_spec = config.target;
  }
  if (!li.model) return li;
  li.run = load_learned_run(*li.model, li.target_spec.is_null() ? std::nullopt : std::optional<json>(li.target_spec), options,
                            /*dtype_given=*/true);
  li.target_spec = li.run->target_spec;
  const json& meta = li.run->meta;
  const int64_t batch = meta.at("train").at("batch");
  const int64_t per_row = meta.value("grads", int64_t{0});
  li.training = {{"model", *li.model},
                 {"steps", meta.value("step", int64_t{0})},
                 {"grads_per_row", per_row},
                 {"batch", batch},
                 {"grads_total", static_cast<double>(per_row) * static_cast<double>(batch)},
                 {"seconds", meta.value("elapsed", 0.0)},
                 {"preconditioner_grads", meta.contains("preconditioner") ? meta["preconditioner"].value("grads", 0.0) : 0.0},
                 {"preconditioner_seconds", meta.contains("preconditioner") ? meta["preconditioner"].value("seconds", 0.0) : 0.0}};
  return li;
}

/// NUTS's metrics for compare: those asked for, else all four (dense left out above kMaxDenseDim).
std::vector<MetricAdapt> nuts_metrics(const CompareOptions& o, int64_t dim, const std::function<void(const std::string&)>& tell) {
  if (!o.nuts_metrics.empty()) return o.nuts_metrics;
  std::vector<MetricAdapt> metrics = {MetricAdapt::kDiag, MetricAdapt::kDense, MetricAdapt::kFisherDiag,
                                      MetricAdapt::kFisherLowRank};
  if (dim > kMaxDenseDim) {
    metrics.erase(metrics.begin() + 1);
    tell(fmt::format("   (NUTS with a dense metric left out: D = {} > {})", dim, kMaxDenseDim));
  }
  return metrics;
}

}  // namespace

CompareOptions compare_options_from_json(const json& j) { return options_from_json<CompareOptions>(j, "compare options"); }

json compare(const CompareOptions& o, const std::function<void(const std::string&)>& say,
             const TrainProgressFn& train_progress, const ProgressFn& sample_progress,
             const std::function<bool()>& should_stop, std::shared_ptr<parallel::Communicator> comm) {
  if (!comm) comm = parallel::single_process();
  const bool root = comm->is_root();
  auto tell = [&](const std::string& line) {
    if (root) say(line);
  };
  if (o.model && o.config) throw UsageError("compare: give --model or --config, not both");
  if (o.dtype != "float32" && o.dtype != "float64") throw UsageError("compare: dtype must be float32 or float64");
  check_transport_choice(o.transport, /*sampling=*/true, "compare");  // Note [The transport's options]
  if (root) ensure_directory(o.output);
  comm->barrier();
  const auto options = torch::TensorOptions().dtype(o.dtype == "float64" ? torch::kFloat64 : torch::kFloat32);
  json results = {{"chains", o.chains}, {"warmup", o.warmup}, {"draws", o.draws}, {"seed", o.seed}, {"samplers", json::object()}};

  // The learned sampler: a given model, or trained now from a config (resumable).
  LearnedInput li = learned_input(o, options, tell, train_progress, should_stop, comm);
  std::optional<std::string> model = li.model;
  std::optional<LearnedRun>& learned = li.run;
  json target_spec = li.target_spec;
  const json training = li.training;
  for (MetricAdapt m : o.nuts_metrics) {  // before anything runs
    if (m == MetricAdapt::kUnit) throw UsageError("compare: NUTS's metrics are diag, dense, fisher-diag or fisher-lowrank");
  }
  if (target_spec.is_null()) throw UsageError("compare: give a target (--target ...), a --model or a --config");
  auto target = make_target(target_spec, options);
  results["target"] = target->spec();
  tell(fmt::format("== compare on {} (D = {}): {} chains, {} warm-up, {} draws each", target->spec().dump(), target->dim(),
                  o.chains, o.warmup, o.draws));

  RunOptions base;
  base.set_chains(o.chains).set_warmup(o.warmup).set_draws(o.draws);
  base.should_stop = should_stop;
  // Ctrl-C: the sampler running stops within a few draws, no later one starts, and what finished is
  // written (compare.json, compare.md) before ExitError 130 says so.
  std::vector<std::string> finished;
  struct Stopped {};
  base.set_init(target->has_sampler() ? "exact" : "uniform");
  std::vector<std::pair<std::string, torch::Tensor>> traces;
  int64_t trace_dim = -1;
  torch::Tensor nuts_last;  // where NUTS's chains ended: draws from the target
  auto run = [&](const std::string& name, Kernel& kernel, RunOptions run_options, TransportedTarget* latent = nullptr) {
    tell(fmt::format("-- {}", name));
    if (should_stop && should_stop()) throw Stopped{};
    SampleResult r = latent ? run_mapped(*latent, kernel, run_options, o.seed, sample_progress)
                            : run_sampler(*target, kernel, run_options, o.seed, sample_progress, comm.get());
    if (!r.complete) throw Stopped{};  // a run cut short has no place in a comparison
    finished.push_back(name);
    results["samplers"][name] = row(r, *target);
    if (trace_dim < 0) trace_dim = worst_parameter(r, *target);
    if (name.rfind("nuts", 0) == 0 && !nuts_last.defined() && r.draws.size(0) > 0) {
      nuts_last = r.draws.select(0, r.draws.size(0) - 1).to(target->options());
    }
    traces.emplace_back(name + ": chain 1", r.draws);
  };
  // NUTS with every metric that applies (Stan's diagonal first: its default); HMC and MALA with
  // Stan's adaptation (step size by dual averaging, diagonal metric over Stan's windows).
  bool interrupted = false;
  try {
    for (MetricAdapt m : nuts_metrics(o, target->dim(), tell)) {
      Nuts nuts;
      run(nuts_name(m), nuts, RunOptions(base).set_metric(m).set_target_accept(0.8));
      results["samplers"][nuts_name(m)]["metric_adapt"] = m;
    }
    if (!o.warm_start.is_null()) {  // Note [Warm starts]: from the previous data set's run
      const WarmStart w = WarmStart::read(o.warm_start);
      w.check_model(*target, "compare: --warm-start");
      Nuts nuts;
      w.apply(nuts, target->options());
      run("nuts_warm", nuts, RunOptions(base).set_warmup(o.warm_warmup).set_target_accept(0.8).set_init_x(w.positions.to(target->options())));
      results["samplers"]["nuts_warm"]["warm_start"] = {{"sampler", w.sampler}, {"warmup", o.warm_warmup}};
    }
    if (o.transport.kind != TransportKind::kNone) {
      if (comm->world_size() > 1) throw UsageError("compare: --transport runs in one process");
      // NUTS through the flow (`nuts_flow`), or with auto (`nuts_auto`) where Note [Choosing the
      // transport] takes it (its transport record says which ran).
      const std::string name = o.transport.kind == TransportKind::kAuto ? "nuts_auto" : "nuts_flow";
      tell("-- " + name);
      Nuts nuts;
      const TransportOptions t = transport_options(o.transport, kDefaultTransportRounds);
      TransportRun tr = run_with_transport(*target, nuts, RunOptions(base).set_metric(MetricAdapt::kDiag).set_target_accept(0.8),
                                           t, o.seed, sample_progress);
      if (!tr.result.complete) throw Stopped{};
      results["samplers"][name] = row(tr.result, *target);
      results["samplers"][name]["transport"] = tr.report;
      traces.emplace_back(name + ": chain 1", tr.result.draws);
    }
    MetropolisHastings hmc(make_baseline_proposal(ProposalOptions().set_sampler(SamplerKind::kHmc).set_leapfrog(o.hmc_leapfrog).set_jitter(0.2)));
    run("hmc", hmc, RunOptions(base).set_adapt_mass(true).set_target_accept(0.8));
    MetropolisHastings mala(make_baseline_proposal(ProposalOptions().set_sampler(SamplerKind::kMala)));
    run("mala", mala, RunOptions(base).set_adapt_mass(true).set_target_accept(default_target_accept(SamplerKind::kMala)));
    if (learned) {
      MetropolisHastings kernel(learned->proposal);
      // As a user runs it: from its own chains (the buffer saved with the model) when it has them,
      // else from where NUTS's chains ended; never from a box its flow has not seen (a trained flow
      // may reject every proposal from there). Its step size is learned: warm-up is burn-in only.
      RunOptions lo(base);
      lo.set_thin(learned_default_thin(learned->meta.value("check", json())));  // Note [The learned sampler's thinning]
      torch::Tensor buffer = load_buffer(*model);
      // Note [Learned proposal in a flow's latent space]: a model trained in a flow's latent space
      // runs there (its buffer is in z) and its draws are mapped to x.
      std::unique_ptr<TransportedTarget> latent;
      if (learned->transport) {
        if (comm->world_size() > 1) throw UsageError("compare: a model trained with a flow transport runs in one process");
        latent = std::make_unique<TransportedTarget>(*target, learned->transport);
      }
      std::string start = "NUTS's last draws";
      if (buffer.defined() && buffer.size(0) > 0) {
        lo.set_init_x(buffer.to(target->options()));
        start = "its own chains (the buffer saved with the model)";
      } else if (nuts_last.defined()) {
        lo.set_init_x(latent ? latent->to_latent(nuts_last) : nuts_last);
      }
      tell(fmt::format("   (the learned sampler starts from {}{}; one draw kept in {} steps)", start,
                       latent ? ", in its flow's latent space" : "", lo.thin));
      run("learned", kernel, lo, latent.get());
      json& l = results["samplers"]["learned"];
      l["start"] = start;
      l["training"] = training;
      // Note [All-in accounting]: the preconditioner and the training are paid before its warm-up
      add_training_cost(l, training);
      l["vs_best_nuts"] = against_best_nuts(results["samplers"]);
    }
  } catch (const Stopped&) {
    interrupted = true;
    results["interrupted"] = true;
  }
  if (comm->world_size() > 1) results["world_size"] = comm->world_size();
  if (!root) {
    if (interrupted) throw ExitError("interrupted", 130);
    return results;
  }
  if (!traces.empty()) {
    const std::string trace_name = parameter_labels(*target)[trace_dim];
    plot_traces((fs::path(o.output) / "compare_traces.png").string(), traces, trace_dim, 1000, trace_name);
    results["trace_parameter"] = trace_name;
  }
  write_atomically((fs::path(o.output) / "compare.json").string(), [&](std::ostream& os) { os << results.dump(2) << "\n"; });
  const std::string table = compare_table(results);
  write_atomically((fs::path(o.output) / "compare.md").string(), [&](std::ostream& os) { os << table; });
  if (interrupted) {
    throw ExitError(finished.empty() ? "interrupted before any sampler finished"
                                     : fmt::format("interrupted; the {} sampler(s) that finished ({}) are in {}/compare.json",
                                                   finished.size(), fmt::join(finished, ", "), o.output),
                    130);
  }
  return results;
}

std::string compare_table(const json& results) {
  if (!results.is_object() || !results.contains("samplers")) throw DataError("not a compare.json (no \"samplers\")");
  const json& samplers = results["samplers"];
  std::string out = fmt::format("Target {}; {} chains x {} draws after {} warm-up; seed {}. ESS: minimum over parameters "
                                "(bulk-ESS uncapped; the paper's needs true moments).\n\n",
                                results.value("target", json()).dump(), results.value("chains", 0), results.value("draws", 0),
                                results.value("warmup", 0), results.value("seed", 0));
  std::vector<std::string> order;
  for (auto it = samplers.begin(); it != samplers.end(); ++it) {
    if (it.key().rfind("nuts", 0) == 0) order.push_back(it.key());
  }
  std::sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return (a == "nuts") != (b == "nuts") ? a == "nuts" : a < b;  // Stan's default first
  });
  for (const char* name : {"hmc", "mala", "learned"}) {
    if (samplers.contains(name)) order.push_back(name);
  }
  auto label = [&](const std::string& name) {
    const json& r = samplers[name];
    std::string l = name;
    if (r.contains("metric_adapt")) l = "nuts " + r["metric_adapt"].get<std::string>();
    return r.value("converged", true) ? l : l + " (not converged)";
  };
  out += "Sampling only:\n\n";
  out += "| sampler | accept | grads/draw | bulk-ESS/draw | /grad | /s | tail-ESS/draw | /grad | /s | paper ESS/draw | /grad | max R-hat | divergences |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : order) {
    const json& r = samplers[name];
    // The paper's ESS needs the target's true or reference moments: "n/a" without them.
    auto paper = [&](const char* key) {
      const double v = num(r, key);
      return std::isfinite(v) ? fmt::format("{:.4g}", v) : std::string("n/a");
    };
    out += fmt::format("| {} | {:.3f} | {:.1f} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {} | {} | {:.3f} | {} |\n",
                       label(name), num(r, "accept"), num(r, "grads_per_draw"), num(r, "bulk_ess_per_draw"),
                       num(r, "bulk_ess_per_grad"), num(r, "bulk_ess_per_second"), num(r, "tail_ess_per_draw"),
                       num(r, "tail_ess_per_grad"), num(r, "tail_ess_per_second"), paper("paper_ess_per_draw"),
                       paper("paper_ess_per_grad"), num(r, "max_rhat"), r.value("divergences", int64_t{0}));
  }
  out += "\nAll-in (Note [All-in accounting]: warm-up, and for the learned sampler its preconditioner and training, "
         "counted; the cost of 1,000 and 10,000 effective draws at this run's rates):\n\n";
  out += "| sampler | fixed gradients | fixed s | all-in bulk-ESS/grad | /s | 1,000 ESS: gradients | s | 10,000 ESS: gradients | s |\n";
  out += "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : order) {
    const json& r = samplers[name];
    if (!r.contains("all_in")) continue;
    const json& a = r["all_in"];
    if (!r.value("converged", true)) {
      out += fmt::format("| {} | {:.4g} | {:.1f} | n/a | n/a | n/a | n/a | n/a | n/a |\n", label(name), num(a, "fixed_grads"),
                         num(a, "fixed_seconds"));
      continue;
    }
    out += fmt::format("| {} | {:.4g} | {:.1f} | {:.4g} | {:.4g} | {:.4g} | {:.1f} | {:.4g} | {:.1f} |\n", label(name),
                       num(a, "fixed_grads"), num(a, "fixed_seconds"), num(a, "all_in_ess_per_grad"),
                       num(a, "all_in_ess_per_second"), num(a, "grads_for_1000"), num(a, "seconds_for_1000"),
                       num(a, "grads_for_10000"), num(a, "seconds_for_10000"));
  }
  if (samplers.contains("learned")) {
    const json& l = samplers["learned"];
    const json& t = l["training"];
    out += fmt::format("\nLearned sampler: trained {} steps, {:.4g} gradient evaluations ({} per batch row x batch {}) in "
                       "{:.0f} s, after a preconditioner warm-up of {:.4g} gradients in {:.0f} s.\n",
                       t.value("steps", 0), num(t, "grads_total"), t.value("grads_per_row", 0), t.value("batch", 0),
                       num(t, "seconds"), num(t, "preconditioner_grads"), num(t, "preconditioner_seconds"));
    const json& v = l.value("vs_best_nuts", json::object());
    if (!l.value("converged", true)) {
      out += fmt::format("Not converged (the learned sampler: max R-hat above {} or accept rate below {}): no ESS ratio or "
                         "break-even for it; run longer, or train the learned sampler longer.\n",
                         kMaxRhat, kMinAccept);
    } else if (!v.contains("ess_per_grad")) {
      out += "Not converged (no NUTS run converged: max R-hat above 1.01 or accept rate below 0.05): no ESS ratio or "
             "break-even; run longer.\n";
    } else {
      auto name_of = [&](const json& x) { return label(x["nuts"].get<std::string>()); };
      out += fmt::format("Against the best NUTS (Note [The best NUTS]; above 1: the learned sampler is better):\n");
      out += fmt::format("- sampling only: {:.3g}x the bulk-ESS per gradient of {}; {:.3g}x the bulk-ESS per second of {}\n",
                         num(v["ess_per_grad"], "ratio"), name_of(v["ess_per_grad"]),
                         num(v["ess_per_second"], "ratio"), name_of(v["ess_per_second"]));
      for (double goal : kAllInGoals) {
        const json& g = v[fmt::format("grads_for_{:.0f}", goal)];
        const json& sec = v[fmt::format("seconds_for_{:.0f}", goal)];
        out += fmt::format("- all-in, {:.0f} effective draws: {:.3g} gradients against {:.3g} ({}): {:.3g}x; {:.1f} s against "
                           "{:.1f} s ({}): {:.3g}x\n",
                           goal, num(g, "learned"), num(g, "nuts_value"), name_of(g), num(g, "ratio"), num(sec, "learned"),
                           num(sec, "nuts_value"), name_of(sec), num(sec, "ratio"));
      }
      out += fmt::format("- break-even in gradients: {}; in seconds: {}\n",
                         v["break_even_grads"].value("text", std::string("n/a")),
                         v["break_even_seconds"].value("text", std::string("n/a")));
    }
  }
  return out;
}

}  // namespace nmcmc
