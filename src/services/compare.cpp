#include "nmcmc/services/compare.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/services/figures.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::optional<double> break_even_draws(double training_grads, double g_learned, double e_learned, double g_nuts,
                                       double e_nuts) {
  if (!(e_learned > 0) || !(e_nuts > 0) || !(g_nuts > 0)) return std::nullopt;
  const double saving = g_nuts * e_learned / e_nuts - g_learned;  // gradients saved per draw
  if (!(saving > 0)) return std::nullopt;
  return training_grads / saving;
}

namespace {

double num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN; }

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

}  // namespace

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
  if (root) ensure_directory(o.output);
  comm->barrier();
  const auto options = torch::TensorOptions().dtype(o.dtype == "float64" ? torch::kFloat64 : torch::kFloat32);
  json results = {{"chains", o.chains}, {"warmup", o.warmup}, {"draws", o.draws}, {"seed", o.seed}, {"samplers", json::object()}};

  // The learned sampler: a given model, or trained now from a config (resumable).
  std::optional<std::string> model = o.model;
  json target_spec = o.target;
  json training;
  if (o.config) {
    json cfg = read_train_config_file(*o.config);
    if (!target_spec.is_null()) cfg["target"] = target_spec;
    TrainConfig config = parse_train_config(cfg);
    model = (fs::path(o.output) / "model.pt").string();
    tell(fmt::format("training the learned sampler ({} steps, batch {}) into {}", config.train.steps, config.train.batch, *model));
    TrainResult t = train(config, torch::kCPU, *model, (fs::path(o.output) / "training_log.csv").string(), /*resume=*/true,
                          root ? train_progress : nullptr, should_stop, comm);
    if (t.interrupted) throw UsageError("compare: interrupted while training (run again to continue)");
    target_spec = config.target;
  }
  std::optional<LearnedRun> learned;
  if (model) {
    learned = load_learned_run(*model, target_spec.is_null() ? std::nullopt : std::optional<json>(target_spec), options,
                               /*dtype_given=*/true);
    target_spec = learned->target_spec;
    const json& meta = learned->meta;
    const int64_t batch = meta.at("train").at("batch");
    const int64_t per_row = meta.value("grads", int64_t{0});
    training = {{"model", *model},
                {"steps", meta.value("step", int64_t{0})},
                {"grads_per_row", per_row},
                {"batch", batch},
                {"grads_total", static_cast<double>(per_row) * static_cast<double>(batch)},
                {"seconds", meta.value("elapsed", 0.0)}};
  }
  if (target_spec.is_null()) throw UsageError("compare: give a target (--target ...), a --model or a --config");
  auto target = make_target(target_spec, options);
  results["target"] = target->spec();
  tell(fmt::format("== compare on {} (D = {}): {} chains, {} warm-up, {} draws each", target->spec().dump(), target->dim(),
                  o.chains, o.warmup, o.draws));

  RunOptions base;
  base.set_chains(o.chains).set_warmup(o.warmup).set_draws(o.draws);
  base.set_init(target->has_sampler() ? "exact" : "uniform");
  std::vector<std::pair<std::string, torch::Tensor>> traces;
  int64_t trace_dim = -1;
  torch::Tensor nuts_last;  // where NUTS's chains ended: draws from the target
  auto run = [&](const std::string& name, Kernel& kernel, RunOptions run_options) {
    tell(fmt::format("-- {}", name));
    SampleResult r = run_sampler(*target, kernel, run_options, o.seed, sample_progress, comm.get());
    results["samplers"][name] = row(r, *target);
    if (trace_dim < 0) trace_dim = worst_parameter(r, *target);
    if (name == "nuts" && r.draws.size(0) > 0) nuts_last = r.draws.select(0, r.draws.size(0) - 1).to(target->options());
    traces.emplace_back(name + ": chain 1", r.draws);
  };
  // NUTS as Stan runs it by default (diagonal metric, target accept 0.8); HMC and MALA with the
  // same adaptation (step size by dual averaging, diagonal metric over Stan's windows).
  Nuts nuts;
  run("nuts", nuts, RunOptions(base).set_adapt_mass(true).set_target_accept(0.8));
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
    torch::Tensor buffer = load_buffer(*model);
    std::string start = "NUTS's last draws";
    if (buffer.defined() && buffer.size(0) > 0) {
      lo.set_init_x(buffer.to(target->options()));
      start = "its own chains (the buffer saved with the model)";
    } else if (nuts_last.defined()) {
      lo.set_init_x(nuts_last);
    }
    tell(fmt::format("   (the learned sampler starts from {})", start));
    run("learned", kernel, lo);
    json& l = results["samplers"]["learned"];
    l["start"] = start;
    l["training"] = training;
    const json& n = results["samplers"]["nuts"];
    auto be = break_even_draws(training["grads_total"].get<double>(), num(l, "grads_per_draw"), num(l, "bulk_ess_per_draw"),
                               num(n, "grads_per_draw"), num(n, "bulk_ess_per_draw"));
    const bool both = l.value("converged", false) && n.value("converged", false);
    l["break_even_draws_vs_nuts"] = be && both ? json(*be) : json(nullptr);
  }
  if (comm->world_size() > 1) results["world_size"] = comm->world_size();
  if (!root) return results;
  const std::string trace_name = parameter_labels(*target)[trace_dim];
  plot_traces((fs::path(o.output) / "compare_traces.png").string(), traces, trace_dim, 1000, trace_name);
  results["trace_parameter"] = trace_name;
  write_atomically((fs::path(o.output) / "compare.json").string(), [&](std::ostream& os) { os << results.dump(2) << "\n"; });
  const std::string table = compare_table(results);
  write_atomically((fs::path(o.output) / "compare.md").string(), [&](std::ostream& os) { os << table; });
  return results;
}

std::string compare_table(const json& results) {
  if (!results.is_object() || !results.contains("samplers")) throw DataError("not a compare.json (no \"samplers\")");
  std::string out = fmt::format("Target {}; {} chains x {} draws after {} warm-up; seed {}. ESS: minimum over parameters.\n\n",
                                results.value("target", json()).dump(), results.value("chains", 0), results.value("draws", 0),
                                results.value("warmup", 0), results.value("seed", 0));
  out += "| sampler | accept | grads/draw | bulk-ESS/draw | /grad | /s | tail-ESS/draw | /grad | /s | paper ESS/draw | /grad | max R-hat | divergences |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const char* name : {"nuts", "hmc", "mala", "learned"}) {
    if (!results["samplers"].contains(name)) continue;
    const json& r = results["samplers"][name];
    // The paper's ESS needs the target's true or reference moments: "n/a" without them.
    auto paper = [&](const char* key) {
      const double v = num(r, key);
      return std::isfinite(v) ? fmt::format("{:.4g}", v) : std::string("n/a");
    };
    out += fmt::format("| {} | {:.3f} | {:.1f} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {:.4g} | {} | {} | {:.3f} | {} |\n",
                       r.value("converged", true) ? std::string(name) : std::string(name) + " (not converged)",
                       num(r, "accept"), num(r, "grads_per_draw"), num(r, "bulk_ess_per_draw"),
                       num(r, "bulk_ess_per_grad"), num(r, "bulk_ess_per_second"), num(r, "tail_ess_per_draw"),
                       num(r, "tail_ess_per_grad"), num(r, "tail_ess_per_second"), paper("paper_ess_per_draw"),
                       paper("paper_ess_per_grad"), num(r, "max_rhat"), r.value("divergences", int64_t{0}));
  }
  if (results["samplers"].contains("learned")) {
    const json& l = results["samplers"]["learned"];
    const json& t = l["training"];
    out += fmt::format("\nLearned sampler: trained {} steps, {:.4g} gradient evaluations ({} per batch row x batch {}), {:.0f} s.\n",
                       t.value("steps", 0), num(t, "grads_total"), t.value("grads_per_row", 0), t.value("batch", 0),
                       num(t, "seconds"));
    const json& nuts = results["samplers"]["nuts"];
    const bool converged = l.value("converged", true) && nuts.value("converged", true);
    const double ratio = num(l, "bulk_ess_per_grad") / num(nuts, "bulk_ess_per_grad");
    if (!converged) {
      out += fmt::format("Not converged ({}: max R-hat above {} or accept rate below {}): no ESS ratio or break-even for "
                         "it; run longer, or train the learned sampler longer.\n",
                         !l.value("converged", true) ? "the learned sampler" : "NUTS", kMaxRhat, kMinAccept);
    } else {
      out += fmt::format("Sampling alone, it gets {:.3g}x NUTS's bulk-ESS per gradient. ", ratio);
    }
    if (!converged) {
      // no break-even for a run that is not converged
    } else if (l["break_even_draws_vs_nuts"].is_number()) {
      out += fmt::format("Break-even (training + sampling gradients per unit of ESS below NUTS's): from {:.3g} draws on.\n",
                         l["break_even_draws_vs_nuts"].get<double>());
    } else {
      out += "It never breaks even with NUTS: it needs more gradients per unit of ESS even without its training.\n";
    }
  }
  return out;
}

}  // namespace nmcmc
