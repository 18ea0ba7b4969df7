#include "nmcmc/services/demo.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/services/figures.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
double paper_value(const json& summary, const char* key) {
  return summary.contains("paper_ess") && summary["paper_ess"].contains(key) ? summary["paper_ess"][key].get<double>() : NAN;
}
}  // namespace

bool run_demo(const std::string& output, const std::function<void(const std::string&)>& say,
              const TrainProgressFn& train_progress, const ProgressFn& sample_progress,
              const std::function<bool()>& should_stop) {
  ensure_directory(output);
  json cfg = read_config_file((fs::path(configs_directory()) / "demo_funnel3.json").string());
  TrainConfig config = parse_train_config(cfg);
  say("== nmcmc demo: Funnel-3 (d = 20, sigma = 3), the learned sampler against HMC and NUTS ==\n");
  say(fmt::format("1. Train the learned sampler ({} steps, batch {}, width {}, N = {}); resumable.", config.train.budget.steps,
                  config.train.batch, config.model.hidden, config.model.steps));
  const std::string model = output + "/model.pt", log = output + "/training_log.csv";
  TrainResult trained;
  try {
    trained = train(config, torch::kCPU, model, log, /*resume=*/true, train_progress, should_stop);
  } catch (const DataError& e) {
    // A model left by an older nmcmc (or a damaged one): start the demo's training afresh.
    say(std::string("nmcmc: ") + e.what() + "; training a new one");
    fs::remove(model);
    trained = train(config, torch::kCPU, model, log, /*resume=*/true, train_progress, should_stop);
  }
  if (trained.interrupted) return false;
  plot_training_curves(output + "/training_curves.png", trained.log, "Funnel-3");

  say("2. Sample 64 chains x 2000 steps with each sampler.");
  auto target = make_target(config.target, torch::kFloat32);
  auto [sampler, meta] = load_model(model);
  sampler->eval();
  MetropolisHastings learned_kernel(std::make_shared<LearnedProposal>(sampler));
  RunOptions run;
  run.set_chains(64).set_warmup(500).set_draws(2000).set_init("exact");
  auto learned = run_sampler(*target, learned_kernel, run, 1, sample_progress);
  // HMC with as many gradients per MH step as the learned sampler (4N), adapted step size.
  const int64_t grads = sampler->grads_per_step();
  MetropolisHastings hmc_kernel(make_baseline_proposal(ProposalOptions().set_sampler(SamplerKind::kHmc).set_leapfrog(grads).set_jitter(0.2)));
  RunOptions hrun = run;
  hrun.set_warmup(1000).set_adapt_step(true).set_target_accept(0.8);
  auto hmc = run_sampler(*target, hmc_kernel, hrun, 1, sample_progress);
  // NUTS as Stan runs it (diagonal metric, target accept 0.8, max depth 10): what users compare
  // every sampler with. 500 warm-up + 1000 draws: in the funnel's neck some of the 64 chains build
  // 1023-leaf trees and the batch waits for them (~6 transitions/s here), so the full 1000 + 2000
  // would make the demo 8 minutes longer. ESS is per draw and per gradient, so it compares.
  say("   (NUTS: 64 chains x 1000 draws after 500 warm-up; see the comment in src/services/demo.cpp)");
  Nuts nuts_kernel;
  auto nuts = run_sampler(*target, nuts_kernel, RunOptions(hrun).set_warmup(500).set_draws(1000).set_adapt_mass(true), 1,
                          sample_progress);
  json sl = summarise(learned, *target), sh = summarise(hmc, *target), sn = summarise(nuts, *target);
  write_run(output + "/learned", {{"sampler", "learned"}, {"model", model}, {"seed", 1}}, learned, sl, false, {},
            meta.value("log", json()));
  write_run(output + "/hmc", {{"sampler", "hmc"}, {"leapfrog", grads}, {"seed", 1}}, hmc, sh);
  write_run(output + "/nuts", {{"sampler", "nuts"}, {"metric", "diag"}, {"seed", 1}}, nuts, sn);

  say("\n3. Results (ESS with the true moments, paper convention; bulk-ESS and R-hat: Stan's)\n");
  say(fmt::format("{:<10} {:>7} {:>10} {:>12} {:>12} {:>13} {:>10} {:>8} {:>9}", "sampler", "accept", "grads/step",
                  "ESS/step x1", "ESS/grad x1", "ESS/step rest", "bulk-ESS x1", "max Rhat", "sample s"));
  for (auto [name, s] : {std::pair<std::string, json*>{"learned", &sl}, std::pair<std::string, json*>{"HMC", &sh},
                         std::pair<std::string, json*>{"NUTS", &sn}}) {
    say(fmt::format("{:<10} {:>7.3f} {:>10.0f} {:>12.4f} {:>12.5f} {:>13.4f} {:>10.0f} {:>8.3f} {:>9.1f}", name,
                    (*s)["accept_rate"].get<double>(), (*s)["grads_per_step"].get<double>(),
                    paper_value(*s, "ess_per_step_x1"), paper_value(*s, "ess_per_grad_x1"),
                    paper_value(*s, "ess_per_step_rest_min"), (*s)["parameters"][0]["ess_bulk"].get<double>(),
                    (*s)["max_rhat"].get<double>(), (*s)["seconds_sampling"].get<double>()));
  }
  const double gain = paper_value(sl, "ess_per_grad_x1") / paper_value(sh, "ess_per_grad_x1");
  const double gain_nuts = paper_value(sl, "ess_per_grad_x1") / paper_value(sn, "ess_per_grad_x1");
  say(fmt::format("\nThe learned sampler gets {:.1f}x the ESS of x1 (the funnel's neck coordinate) per gradient of HMC with\n"
                  "{} leapfrog steps, and {:.2g}x that of NUTS ({:.1f} gradients per draw, {} divergences).\n"
                  "Training cost {} gradient evaluations per batch row ({:.0f} s{}).",
                  gain, grads, gain_nuts, sn["grads_per_step"].get<double>(), sn["divergences"].get<int64_t>(), trained.grads, trained.log.empty() ? trained.seconds : trained.log.back().elapsed,
                  trained.seconds < 1 ? "; this run reused the trained model in " + output : std::string()));
  at::Generator gen = make_generator(7);
  plot_traces(output + "/traces_x1.png",
              {{"HMC", hmc.draws}, {"NUTS", nuts.draws}, {"learned", learned.draws}}, 0, 2000, "x.1");
  plot_pairs(output + "/samples.png", {{"HMC", hmc.draws}, {"learned", learned.draws}}, 0, 1, target->sample(4000, gen),
             parameter_labels(*target));
  say("\nWrote " + output + "/{training_curves,traces_x1,samples}.{png,svg} (drawn when the demo ends), the draws of the "
      "three runs (Stan CSV and inference_data.nc; `nmcmc report " + output + "/learned` for a report) and the model.");
  return true;
}

}  // namespace nmcmc
