// `nmcmc reproduce`: the experiments themselves: training (or resuming), the evaluation of the learned
// sampler and every baseline, the figures, and which units a --jobs run starts; the jobs themselves are reproduce_jobs.cpp,
// the tables reproduce_table.cpp, the profiles reproduce_profiles.cpp.
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/services/reproduce.hpp"
#include "reproduce_parts.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "nmcmc/core/clock.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/core/tensor_options.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/plot.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/services/accounting.hpp"
#include "nmcmc/services/figures.hpp"
#include "nmcmc/services/jobs.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// The paper's measures from a sampling run: ESS with the true moments on the kept draws.
json measures(const SampleResult& r, Target& target, double seconds_training, int64_t grads_training) {
  json s = summarise(r, target);
  const double g = s["grads_per_step"].get<double>();
  json m;
  const auto& p = s["paper_ess"];
  m["accept"] = s["accept_rate"];
  m["grads_per_step"] = g;
  m["ess_per_step_min"] = p["ess_per_step_min"];
  m["ess_per_step_mean"] = p["ess_per_step_mean"];
  m["ess_per_step_x1"] = p["ess_per_step_x1"];
  m["ess_per_step_rest_min"] = p.value("ess_per_step_rest_min", NAN);
  m["ess_per_grad_min"] = g > 0 ? p["ess_per_step_min"].get<double>() / g : NAN;
  m["ess_per_grad_x1"] = g > 0 ? p["ess_per_step_x1"].get<double>() / g : NAN;
  m["ess_per_grad_rest_min"] = g > 0 ? m["ess_per_step_rest_min"].get<double>() / g : NAN;
  m["ess_5k_min"] = 5000.0 * p["ess_per_step_min"].get<double>();
  m["ess_5k_mean"] = 5000.0 * p["ess_per_step_mean"].get<double>();
  m["bulk_ess_per_step_min"] = s["ess_bulk_per_step"];
  m["max_rhat"] = s["max_rhat"];
  // Mean squared jump of x1 per MH step (rejections count as 0): on the funnels it shows how far
  // the neck coordinate travels, which the ESS of x1 is bounded by.
  m["msjd_x1"] = mean_squared_jump(r.draws.narrow(2, 0, 1));
  m["ess_per_second_min"] = p["ess_per_second_min"];
  m["seconds_sampling"] = s["seconds_sampling"];
  m["seconds_training"] = seconds_training;
  m["grads_training_per_row"] = grads_training;
  // Note [All-in accounting]: the warm-up is the fixed cost (the learned sampler's training is
  // added by with_training)
  m["cost"] = {{"fixed_grads", s["grads_warmup_per_chain"].get<double>() * s["chains"].get<double>()},
               {"fixed_seconds", s["seconds_warmup"]},
               {"sampling_grads", g * s["draws"].get<double>() * s["chains"].get<double>()},
               {"sampling_seconds", s["seconds_sampling"]},
               {"ess", s["min_ess_bulk"]},
               {"chains", s["chains"]}};  // the table charges warm-ups for a user's 4 (reproduce_table.cpp)
  m["all_in"] = all_in_json(run_cost_from_json(m["cost"]));
  return m;
}

/// `measures` with training's gradients and seconds added to the fixed cost.
void with_training(json& m, double grads, double seconds) {
  m["cost"]["fixed_grads"] = m["cost"]["fixed_grads"].get<double>() + grads;
  m["cost"]["fixed_seconds"] = m["cost"]["fixed_seconds"].get<double>() + seconds;
  m["all_in"] = all_in_json(run_cost_from_json(m["cost"]));
}

/// Moments from a data/reference file ({"mean": [...], "sd": [...]}), e.g. the constants the
/// authors' code normalised with (named in a config's "paper" section).
Moments reference_file_moments(const std::string& file) {
  const std::string path = (fs::path(data_directory()) / "reference" / file).string();
  const json j = read_config_file(path);
  try {
    return {torch::tensor(j.at("mean").get<std::vector<double>>(), torch::kFloat64),
            torch::tensor(j.at("sd").get<std::vector<double>>(), torch::kFloat64)};
  } catch (const json::exception& e) {
    throw DataError("reference file '" + path + "' is malformed: " + e.what());
  }
}

SampleResult evaluate(Target& target, Kernel& kernel, int64_t chains, int64_t warmup, int64_t draws, bool adapt,
                      uint64_t seed, const torch::Tensor& init_x = {}, MetricAdapt metric = MetricAdapt::kDiag) {
  RunOptions run;
  run.set_chains(chains).set_warmup(warmup).set_draws(draws).set_adapt_step(adapt).set_metric(adapt ? metric : MetricAdapt::kUnit);
  run.set_init(target.has_sampler() ? "exact" : "uniform");
  if (init_x.defined()) run.set_init_x(init_x);
  return run_sampler(target, kernel, run, seed);
}

SampleResult evaluate(Target& target, std::shared_ptr<Proposal> proposal, int64_t chains, int64_t warmup, int64_t draws,
                      bool adapt, uint64_t seed, const torch::Tensor& init_x = {}) {
  MetropolisHastings kernel(std::move(proposal));
  return evaluate(target, kernel, chains, warmup, draws, adapt, seed, init_x);
}

/// Funnel-3 HMC as in the paper: the largest step size whose chains still reach the neck.
json funnel3_hmc(Target& target, int64_t leapfrog, int64_t long_steps, const std::string& dir,
                 const std::function<void(const std::string&)>& say, SampleResult* long_run) {
  // Reaching the neck: the 99th percentile of x0 over all chains and steps must be at least 90 %
  // of the exact one (3 * 2.326 = 6.98).
  const double exact_q99 = 3.0 * 2.3263478740408408;
  json scan = json::array();
  double chosen = 0;
  for (double eps : {0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5}) {
    auto hmc = std::make_shared<Hmc>(eps, leapfrog);
    SampleResult r = evaluate(target, hmc, 64, 0, std::max<int64_t>(200, long_steps / 50), false, 11);
    const double q99 = torch::quantile(r.draws.select(2, 0).reshape({-1}), 0.99).item<double>();
    const double accept = r.accept_stat.mean().item<double>();
    const bool reaches = q99 >= 0.9 * exact_q99;
    scan.push_back({{"eps", eps}, {"x0_q99", q99}, {"accept", accept}, {"reaches_neck", reaches}});
    say(fmt::format("    HMC step-size scan: eps {:<5} accept {:.3f}  99th pct of x0 {:.2f} (exact {:.2f}) {}", eps, accept,
                    q99, exact_q99, reaches ? "reaches the neck" : "does not"));
    if (reaches) chosen = eps;
  }
  if (chosen == 0) chosen = 0.02;
  say(fmt::format("    chosen: eps = {} (largest that reaches the neck); {} steps of {} leapfrog steps", chosen,
                  long_steps, leapfrog));
  auto hmc = std::make_shared<Hmc>(chosen, leapfrog);
  *long_run = evaluate(target, hmc, 64, 0, long_steps, false, 12);
  json m = measures(*long_run, target, 0, 0);
  m["step_size"] = chosen;
  m["scan"] = scan;
  m["steps"] = long_steps;
  (void)dir;
  return m;
}

void proposal_cloud(const std::string& path, Target& target, LearnedSampler& sampler,
                    const std::vector<std::pair<std::string, std::vector<double>>>& starts, int64_t dx, int64_t dy,
                    std::function<double(double, double)> density, std::pair<double, double> xr,
                    std::pair<double, double> yr) {
  torch::NoGradGuard no_grad;
  std::vector<Plot> panels;
  at::Generator gen = make_generator(3);
  for (const auto& [title, start] : starts) {
    const int64_t n = 400;
    torch::Tensor x = torch::tensor(start, torch::kFloat64).to(target.options()).unsqueeze(0).expand({n, target.dim()}).contiguous();
    // One MH step from the start: the proposals and the kernel's own accept decisions.
    auto proposal = std::make_shared<LearnedProposal>(sampler);
    ChainState state = MetropolisHastings(proposal).init(target, x);
    ProposalResult r = proposal->propose(target, state, gen);
    torch::Tensor acc = mh_accept(state, r, gen).second.accepted;
    torch::Tensor xn = r.proposed.x.to(torch::kFloat64);
    std::vector<double> ax, ay, rx, ry;
    for (int64_t i = 0; i < n; ++i) {
      (acc[i].item<bool>() ? ax : rx).push_back(xn[i][dx].item<double>());
      (acc[i].item<bool>() ? ay : ry).push_back(xn[i][dy].item<double>());
    }
    Plot plot(title);
    plot.xlabel("x." + std::to_string(dx + 1)).ylabel("x." + std::to_string(dy + 1));
    plot.xlim(xr.first, xr.second).ylim(yr.first, yr.second).shade(density);
    plot.scatter(rx, ry, palette(1), 2.0, "rejected proposal", 0.6).scatter(ax, ay, palette(2), 2.0, "accepted proposal", 0.7);
    plot.scatter({start[dx]}, {start[dy]}, {0, 0, 0}, 5.0, "current state x", 1.0);
    panels.push_back(plot);
  }
  save_figure(path, panels, 0, "One step of the learned proposal: 400 proposals from one state");
}

/// One `reproduce` invocation's shared state.
struct Run {
  const ReproduceOptions& o;
  const std::function<void(const std::string&)>& say;
  const TrainProgressFn& progress;
  // Each experiment's training config (less the logging cadence) and log: the ablation's "full"
  // variant is Funnel-1's own training when the settings agree, and is then not trained twice.
  std::map<std::string, std::pair<json, decltype(TrainResult::log)>> trained_runs;
};

json training_identity(const TrainConfig& c) {
  json j = c.to_json();
  j["train"].erase("log_every");
  return j;
}

/// The experiments and extras a run does, validated, in the paper's order.
std::vector<std::string> selected_units(const ReproduceOptions& o) {
  std::vector<std::string> selected = o.only.empty() ? experiment_names() : o.only;
  const std::vector<std::string> extras = {"moon", "ablation"};
  for (const auto& name : selected) {
    const auto& all = experiment_names();
    if (std::find(all.begin(), all.end(), name) == all.end() && std::find(extras.begin(), extras.end(), name) == extras.end()) {
      throw UsageError("unknown experiment '" + name +
                       "' (icg, scg, rotated_icg, funnel1, funnel3, german, australian, heart, moon, ablation)");
    }
  }
  if (o.only.empty()) selected.insert(selected.end(), extras.begin(), extras.end());
  return selected;
}

/// The device of ReproduceOptions::device (UsageError for a bad name or a missing CUDA).
torch::Device run_device(const ReproduceOptions& o) { return parse_tensor_options("float32", o.device).device(); }

/// A training of the run, stopped by ReproduceOptions::should_stop: its checkpoint is written;
/// the run ends there with exit code 130 and a rerun resumes it.
TrainResult train_unit(const ReproduceOptions& o, const TrainConfig& config, const std::string& dir,
                       const TrainProgressFn& progress) {
  TrainResult r = train(config, run_device(o), dir + "/model.pt", dir + "/training_log.csv", /*resume=*/true, progress,
                        o.should_stop);
  if (r.interrupted) {
    throw ExitError(r.saved ? fmt::format("interrupted at training step {}; checkpoint saved to {}/model.pt (run the same "
                                          "command again to resume)", r.steps, dir)
                            : std::string("interrupted before the first training step; nothing written (run again)"),
                    130);
  }
  return r;
}

/// Between the evaluations of a unit: a stop asked for ends the run there (its trainings are saved).
void stop_point(const ReproduceOptions& o) {
  if (o.should_stop && o.should_stop()) {
    throw ExitError("interrupted between evaluations; the trainings are saved (run the same command again to resume)", 130);
  }
}

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

TrainConfig experiment_config(const ReproduceOptions& o, const std::string& name) {
  return parse_train_config(with_profile(paper_config(o, name), profile_settings(o.profile, name)));
}

/// NUTS on one experiment, as `reproduce` compares it: Stan's diagonal metric (not on rotated_icg),
/// the dense metric (not on the funnels) and the two metrics from draws and gradients; each row
/// saved as it comes (Note [The best NUTS]).
void run_nuts_baselines(Run& run, const std::string& name, const json& settings, Target& target_ref, int64_t chains,
                        json& entry, const std::function<void()>& save_so_far) {
  const ReproduceOptions& o = run.o;
  const auto& say = run.say;
  const json bl = settings["baseline"];
  Target* target = &target_ref;
  if (name == "rotated_icg") {
    // A diagonal metric cannot undo a rotation: NUTS runs at its tree-depth limit (1023
    // gradients per draw) and took over 15 minutes of the cpu profile; only the dense metric runs.
    say("  nuts (diagonal metric): skipped on rotated_icg (tree-depth limit; see the dense metric below)");
  } else {
    // NUTS as Stan runs it (diagonal metric, target accept 0.8), on the same evaluation.
    Nuts nuts(NutsOptions().set_max_depth(settings.value("nuts_max_depth", int64_t{10})));
    const int64_t nuts_chains = settings.value("nuts_chains", chains);
    stop_point(o);
    SampleResult r = evaluate(*target, nuts, nuts_chains, bl["warmup"], bl["draws"], true, 2);
    entry["nuts"] = measures(r, *target, 0, 0);
    entry["nuts"]["chains"] = nuts_chains;
    save_so_far();
    say(fmt::format("  nuts{}: ESS/MH min {:.4f}, ESS/grad min {:.4g}, {:.1f} gradients per draw",
                    nuts_chains == chains ? std::string() : fmt::format(" ({} chains)", nuts_chains),
                    entry["nuts"]["ess_per_step_min"].get<double>(), entry["nuts"]["ess_per_grad_min"].get<double>(),
                    entry["nuts"]["grads_per_step"].get<double>()));
  }
  if (name.rfind("funnel", 0) != 0) {
    // NUTS with a dense metric (Stan's metric=dense_e): the yardstick for a preconditioned
    // learned sampler, whose L comes from the same kind of estimate.
    Nuts nuts(NutsOptions().set_max_depth(settings.value("nuts_max_depth", int64_t{10})));
    stop_point(o);
    SampleResult r = evaluate(*target, nuts, chains, bl["warmup"], bl["draws"], true, 2, {}, MetricAdapt::kDense);
    entry["nuts_dense"] = measures(r, *target, 0, 0);
    save_so_far();
    say(fmt::format("  nuts (dense metric): ESS/MH min {:.4f}, ESS/grad min {:.4g}, {:.1f} gradients per draw",
                    entry["nuts_dense"]["ess_per_step_min"].get<double>(),
                    entry["nuts_dense"]["ess_per_grad_min"].get<double>(),
                    entry["nuts_dense"]["grads_per_step"].get<double>()));
  }
  // NUTS with the metrics adapted from draws and gradients (nutpie's; issue #34): with the two
  // above, the best NUTS is the yardstick (Note [The best NUTS]).
  for (const MetricAdapt m : {MetricAdapt::kFisherDiag, MetricAdapt::kFisherLowRank}) {
    const std::string key = m == MetricAdapt::kFisherDiag ? "nuts_fisher_diag" : "nuts_fisher_lowrank";
    Nuts nuts(NutsOptions().set_max_depth(settings.value("nuts_max_depth", int64_t{10})));
    stop_point(o);
    SampleResult r = evaluate(*target, nuts, settings.value("nuts_chains", chains), bl["warmup"], bl["draws"], true, 2, {}, m);
    entry[key] = measures(r, *target, 0, 0);
    save_so_far();
    say(fmt::format("  nuts ({}): ESS/MH min {:.4f}, ESS/grad min {:.4g}, {:.1f} gradients per draw, max R-hat {:.3f}",
                    enum_name(m), entry[key]["ess_per_step_min"].get<double>(), entry[key]["ess_per_grad_min"].get<double>(),
                    entry[key]["grads_per_step"].get<double>(), entry[key]["max_rhat"].get<double>()));
  }
}

/// Trains (or resumes) one experiment, evaluates the learned sampler and the baselines, draws its
/// figures; returns its results entry (also written to <output>/<name>/entry.json).
json run_experiment(Run& run, const std::string& name) {
  const ReproduceOptions& o = run.o;
  const auto& say = run.say;
  const auto& progress = run.progress;
  const json settings = profile_settings(o.profile, name);
  const std::string dir = (fs::path(o.output) / name).string();
  ensure_directory(dir);
  say(fmt::format("== {} ({} profile)", name, o.profile));
  const json paper = paper_config(o, name);
  json cfg = with_profile(paper, settings);
  TrainConfig config = parse_train_config(cfg);
  say(fmt::format("  training: batch {}, {} steps, width {}, N = {}, GEMMs in {}", config.train.batch, config.train.budget.steps,
                  config.model.hidden, config.model.steps,
                  matmul_summary(config.model.matmul, torch::kFloat32, run_device(o))));
  const std::vector<std::string> changes = profile_changes(paper, settings);
  if (!changes.empty()) say(fmt::format("  changed from the paper's config: {}", fmt::join(changes, ", ")));
  TrainResult trained = train_unit(o, config, dir, progress);
  if (o.figures) plot_training_curves(dir + "/training_curves.png", trained.log, name);
  run.trained_runs[name] = {training_identity(config), trained.log};
  const double train_seconds = trained.log.empty() ? 0.0 : trained.log.back().elapsed;
  const torch::Device device = run_device(o);
  auto target = make_target(config.target, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto [sampler, meta] = load_model(dir + "/model.pt");
  sampler->to(device);
  sampler->eval();
  const json ev = settings["eval"];
  const int64_t chains = ev["chains"], burn = ev["burn"], keep = ev["keep"];
  say(fmt::format("  evaluating: {} chains, {} steps, ESS on the last {}", chains, burn + keep, keep));
  // Without an exact sampler the learned chains start from the training buffer (the sampler's
  // own persistent chains), as the paper's bootstrap does; burn-in steps follow either way.
  torch::Tensor init_x = target->has_sampler() ? torch::Tensor() : load_buffer(dir + "/model.pt").to(device);
  stop_point(o);
  SampleResult learned = evaluate(*target, std::make_shared<LearnedProposal>(sampler), chains, burn, keep, false, 1, init_x);
  json entry;
  entry["config"] = config.to_json();
  entry["paper"] = cfg.value("paper", json::object());
  entry["profile_changes"] = changes;
  entry["learned"] = measures(learned, *target, train_seconds, trained.grads);
  // All the gradients training spent: every batch row's, plus the preconditioner's warm-up.
  const json& pre = trained.preconditioner;
  const double warmup_grads = pre.is_object() ? pre.value("grads", 0.0) : 0.0;
  entry["learned"]["grads_training_total"] = static_cast<double>(trained.grads) * config.train.batch + warmup_grads;
  entry["learned"]["seconds_training"] = train_seconds + (pre.is_object() ? pre.value("seconds", 0.0) : 0.0);
  with_training(entry["learned"], entry["learned"]["grads_training_total"].get<double>(),
                entry["learned"]["seconds_training"].get<double>());
  if (pre.is_object()) entry["preconditioner"] = pre;
  // What is measured so far, after each evaluation: a run stopped during the baselines (a GPU
  // lease's end, Ctrl-C) keeps the learned sampler's figures. entry.json replaces it at the end.
  const std::string partial = dir + "/entry.partial.json";
  auto save_so_far = [&] { write_atomically(partial, [&](std::ostream& os) { os << entry.dump(2) << "\n"; }); };
  const json& paper_data = entry["paper"];
  if (paper_data.contains("authors_sd_rest")) {
    // The funnels: the authors' normalising constant for x2.., for comparison (README).
    auto m = target->reference_moments();
    torch::Tensor sd = m->sd.clone();
    sd.narrow(0, 1, sd.size(0) - 1).fill_(paper_data["authors_sd_rest"].get<double>());
    torch::Tensor ratio = paper_ess_ratio(learned.draws, m->mean, sd);
    entry["learned"]["authors_constants_ess_per_step_rest_min"] = ratio.narrow(0, 1, ratio.size(0) - 1).min().item<double>();
  }
  if (paper_data.contains("authors_moments")) {
    // German: the authors' constants are off by up to ~0.1 sd from our reference run (README).
    Moments a = reference_file_moments(paper_data["authors_moments"].get<std::string>());
    torch::Tensor ratio = paper_ess_ratio(learned.draws, a.mean, a.sd);
    entry["learned"]["authors_constants_ess_5k_min"] = 5000.0 * ratio.min().item<double>();
    entry["learned"]["authors_constants_ess_5k_mean"] = 5000.0 * ratio.mean().item<double>();
  }
  save_so_far();
  say(fmt::format("  learned: accept {:.3f}, ESS/MH min {:.4f}, ESS/grad min {:.4g}, max R-hat {:.3f} (so far in {})",
                  entry["learned"]["accept"].get<double>(), entry["learned"]["ess_per_step_min"].get<double>(),
                  entry["learned"]["ess_per_grad_min"].get<double>(), entry["learned"]["max_rhat"].get<double>(),
                  partial));
  const json bl = settings["baseline"];
  for (const SamplerKind kind : {SamplerKind::kMala, SamplerKind::kHmc}) {
    const std::string b = enum_name(kind);
    ProposalOptions po;
    po.set_sampler(kind).set_leapfrog(10).set_jitter(kind == SamplerKind::kHmc ? 0.2 : 0.0);
    stop_point(o);
    SampleResult r = evaluate(*target, make_baseline_proposal(po), chains, bl["warmup"], bl["draws"], true, 2);
    entry[b] = measures(r, *target, 0, 0);
    save_so_far();
    say(fmt::format("  {}: ESS/MH min {:.4f}, ESS/grad min {:.4g}", b, entry[b]["ess_per_step_min"].get<double>(),
                    entry[b]["ess_per_grad_min"].get<double>()));
  }
  run_nuts_baselines(run, name, settings, *target, chains, entry, save_so_far);
  say(fmt::format("  learned: accept {:.3f}, ESS/MH min {:.4f} (x1 {:.4f}), ESS/grad min {:.4g}, max R-hat {:.3f}, "
                  "x1 mean squared jump {:.3g} (MALA {:.3g}, HMC {:.3g})",
                  entry["learned"]["accept"].get<double>(), entry["learned"]["ess_per_step_min"].get<double>(),
                  entry["learned"]["ess_per_step_x1"].get<double>(), entry["learned"]["ess_per_grad_min"].get<double>(),
                  entry["learned"]["max_rhat"].get<double>(), entry["learned"]["msjd_x1"].get<double>(),
                  entry["mala"]["msjd_x1"].get<double>(), entry["hmc"]["msjd_x1"].get<double>()));
  if (name == "funnel3") {
    SampleResult long_hmc;
    entry["hmc_paper"] = funnel3_hmc(*target, sampler->grads_per_step(), settings["hmc_long_steps"], dir, say, &long_hmc);
    save_so_far();
    if (o.figures) {
      plot_traces(dir + "/fig2_x1_traces.png",
                  {{"HMC (paper protocol)", long_hmc.draws}, {"learned", learned.draws}}, 0, 1000, "x.1");
      const double sigma = 3.0;
      auto density = [sigma](double x0, double x1) {
        return std::exp(-x0 * x0 / (2 * sigma * sigma) - 0.5 * std::exp(x0) * x1 * x1 + 0.5 * x0);
      };
      std::vector<double> neck(20, 0.0), base(20, 0.0);
      neck[0] = 5.0;
      base[0] = -5.0;
      base[1] = 8.0;
      proposal_cloud(dir + "/figA2_proposal_clouds.png", *target, sampler,
                     {{"from the neck (x1 = 5)", neck}, {"from the base (x1 = -5)", base}}, 0, 1, density, {-9, 9},
                     {-30, 30});
    }
  }
  write_atomically(dir + "/entry.json", [&](std::ostream& os) { os << entry.dump(2) << "\n"; });
  fs::remove(partial);
  return entry;
}

/// Figure 1: the proposal cloud on the 2-d moon target.
void run_moon(Run& run) {
  const ReproduceOptions& o = run.o;
  const auto& say = run.say;
  const auto& progress = run.progress;
  const int64_t aux = profile_settings(o.profile, "moon")["aux_steps"];
  say("== figure 1: proposal cloud on the 2-d moon target");
  json cfg = read_train_config_file((fs::path(configs_of(o)) / "moon.json").string());
  cfg["train"]["steps"] = std::max<int64_t>(aux * 3, 30);
  TrainConfig config = parse_train_config(cfg);
  const std::string dir = (fs::path(o.output) / "moon").string();
  ensure_directory(dir);
  train_unit(o, config, dir, progress);
  auto target = make_target(config.target, torch::kFloat32);
  auto [sampler, meta] = load_model(dir + "/model.pt");
  auto density = [](double x0, double x1) { return std::exp(-0.5 * x0 * x0 - 0.5 * std::pow(x1 - x0 * x0 + 4, 2)); };
  proposal_cloud((fs::path(o.output) / "fig1_proposal_cloud.png").string(), *target, sampler,
                 {{"learned proposals from one point", {1.0, -3.0}}}, 0, 1, density, {-3.5, 3.5}, {-6, 8});
}

const char* const kAblationVariants[] = {"full", "no-grad", "langevin"};

TrainConfig ablation_config(const ReproduceOptions& o, const std::string& variant) {
  const int64_t ablation_steps = profile_settings(o.profile, "funnel1")["ablation_steps"];
  json cfg = with_profile(paper_config(o, "funnel1"), profile_settings(o.profile, "funnel1"));
  cfg["model"]["variant"] = variant;
  cfg["train"]["steps"] = ablation_steps;
  cfg["train"]["log_every"] = std::max<int64_t>(1, ablation_steps / 100);
  return parse_train_config(cfg);
}

/// Whether the ablation's variant is the funnel1 experiment's training (same settings): then it
/// is not trained again.
bool ablation_reuses_funnel1(const ReproduceOptions& o, const std::string& variant, const std::vector<std::string>& selected) {
  return has(selected, "funnel1") && training_identity(ablation_config(o, variant)) == training_identity(experiment_config(o, "funnel1"));
}

/// Trains (or resumes: a finished checkpoint only loads) one variant of the ablation.
decltype(TrainResult::log) train_ablation_variant(Run& run, const std::string& variant) {
  const std::string dir = (fs::path(run.o.output) / "ablation" / variant).string();
  ensure_directory(dir);
  return train_unit(run.o, ablation_config(run.o, variant), dir, run.progress).log;
}

/// The appendix ablation: proposal entropy during training of the three variants on Funnel-1.
json run_ablation(Run& run) {
  const ReproduceOptions& o = run.o;
  const int64_t ablation_steps = profile_settings(o.profile, "funnel1")["ablation_steps"];
  run.say(fmt::format("== appendix ablation: proposal entropy on Funnel-1 for full, no-grad and langevin ({} steps)",
                      ablation_steps));
  Plot plot("Funnel-1: proposal entropy during training (appendix ablation)");
  plot.xlabel("training step").ylabel("proposal entropy (nats, + const)");
  int k = 0;
  json ablation = json::object();
  for (const std::string variant : kAblationVariants) {
    TrainConfig config = ablation_config(o, variant);
    decltype(TrainResult::log) log;
    auto same = run.trained_runs.find("funnel1");
    if (same != run.trained_runs.end() && same->second.first == training_identity(config)) {
      log = same->second.second;  // bit for bit the run the funnel1 experiment just trained
      run.say(fmt::format("  {}: the funnel1 experiment's training above (the same config)", variant));
    } else {
      log = train_ablation_variant(run, variant);
    }
    std::vector<double> step, entropy;
    for (const auto& row : log) {
      step.push_back(static_cast<double>(row.step));
      entropy.push_back(row.entropy);
    }
    ablation[variant] = {{"final_entropy", entropy.empty() ? NAN : entropy.back()}, {"steps", ablation_steps},
                         {"seconds_training", log.empty() ? 0.0 : log.back().elapsed}};
    plot.line(step, entropy, palette(k++), variant);
    run.say(fmt::format("  {}: proposal entropy {:.1f} after {} steps", variant,
                        ablation[variant]["final_entropy"].get<double>(), ablation_steps));
  }
  save_figure((fs::path(o.output) / "ablation_entropy.png").string(), {plot}, 1, "",
              "Proposal entropy (log-determinant + D log eps, up to a constant) of the three model variants "
              "on Funnel-1 during training.",
              {6.4, 4.0});
  return ablation;
}

/// --jobs N: every experiment, the moon figure and each ablation variant that needs training as a
/// child `nmcmc reproduce --part UNIT` (services/reproduce_jobs.cpp); then the ablation's figure and
/// the tables here.
void run_in_parallel(Run& run, const std::vector<std::string>& selected, json& results) {
  const ReproduceOptions& o = run.o;
  std::vector<std::string> units;
  for (const auto& name : selected) {
    if (name == "ablation") {
      if (!o.figures) continue;  // the ablation is a figure
      for (const std::string variant : kAblationVariants) {
        if (!ablation_reuses_funnel1(o, variant, selected)) units.push_back("ablation:" + variant);
      }
    } else if (name != "moon" || o.figures) {
      units.push_back(name);
    }
  }
  run_units_as_jobs(o, units, results, run.say);
  // The funnel1 training's log, for the ablation's "full" variant (its finished checkpoint only loads).
  if (has(selected, "ablation") && has(selected, "funnel1")) {
    TrainConfig config = experiment_config(o, "funnel1");
    const std::string dir = (fs::path(o.output) / "funnel1").string();
    run.trained_runs["funnel1"] = {training_identity(config),
                                   train_unit(o, config, dir, {}).log};
  }
}

}  // namespace

void write_results(const ReproduceOptions& o, const json& results) {
  write_atomically((fs::path(o.output) / "results.json").string(), [&](std::ostream& os) { os << results.dump(2) << "\n"; });
}

json reproduce(const ReproduceOptions& o, const std::function<void(const std::string&)>& say,
               const TrainProgressFn& progress) {
  const std::vector<std::string> selected = selected_units(o);
  profile_settings(o.profile, "icg");  // validates the profile before any work
  run_device(o);                       // and the device
  if (o.jobs < 1 || o.jobs > 256) throw UsageError(fmt::format("--jobs must be in 1..256, got {}", o.jobs));
  ensure_directory(o.output);
  Run run{o, say, progress, {}};
  if (o.part.empty()) {
    // Every config and target up front: a malformed file or a missing data set fails in a second,
    // not an hour into the run.
    for (const auto& name : selected) {
      if (name == "ablation") {
        for (const std::string variant : kAblationVariants) ablation_config(o, variant);
      } else if (name == "moon") {
        parse_train_config(read_train_config_file((fs::path(configs_of(o)) / "moon.json").string()));
      } else {
        // The paper's ESS needs the target's true moments (a Stan program or a module has none).
        auto target = make_target(experiment_config(o, name).target, torch::kFloat32);
        if (!target->reference_moments()) {
          throw UsageError(fmt::format("reproduce: experiment '{}' has a target without true moments ('{}'), which the "
                                       "paper's ESS needs: run it with `nmcmc compare` or `nmcmc train` and `sample`",
                                       name, target->name()));
        }
      }
    }
  }
  if (!o.part.empty()) {
    // One unit of a `--jobs` run (a child process): its entry.json, figures, checkpoints.
    const std::string& unit = o.part;
    if (unit.rfind("ablation:", 0) == 0) {
      const std::string variant = unit.substr(9);
      if (!has({"full", "no-grad", "langevin"}, variant)) throw UsageError("--part: unknown ablation variant '" + variant + "'");
      train_ablation_variant(run, variant);
      return json::object();
    }
    if (unit == "moon") {
      run_moon(run);
      return json::object();
    }
    if (!has(experiment_names(), unit)) throw UsageError("--part: unknown experiment '" + unit + "'");
    return run_experiment(run, unit);
  }
  json results = {{"profile", o.profile}, {"device", run_device(o).str()}, {"experiments", json::object()}};
  if (o.jobs > 1) results["jobs"] = o.jobs;
  const auto t_all = Clock::now();
  if (o.jobs > 1) {
    run_in_parallel(run, selected, results);
  } else {
    for (const auto& name : selected) {
      if (name == "moon" || name == "ablation") continue;  // figures, below
      results["experiments"][name] = run_experiment(run, name);
      write_results(o, results);
    }
    if (o.figures && has(selected, "moon")) run_moon(run);
  }
  if (o.figures && has(selected, "ablation")) results["ablation"] = run_ablation(run);
  results["seconds_total"] = seconds_since(t_all);
  write_results(o, results);
  const std::string table = results_table(results);
  write_atomically((fs::path(o.output) / "results.md").string(), [&](std::ostream& os) { os << table; });
  return results;
}

}  // namespace nmcmc
