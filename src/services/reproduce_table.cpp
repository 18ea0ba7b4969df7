// `nmcmc reproduce`'s tables: ours beside the paper's.
#include "nmcmc/services/reproduce.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/services/accounting.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {

/// A member object of a results.json entry; a clear error for a file that is not one.
const json& section(const json& j, const std::string& key) {
  static const json empty = json::object();
  if (!j.is_object()) throw DataError("results file: expected an object where '" + key + "' should be");
  auto it = j.find(key);
  if (it == j.end()) return empty;
  if (!it->is_object()) throw DataError("results file: '" + key + "' is not an object");
  return *it;
}

/// A number in a results entry; NaN where it is missing (a sampler that was not run).
double num(const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; }

/// The chains a user runs for the all-in figures (Stan's default).
constexpr double kUserChains = 4;

/// A sampler's cost in a run of kUserChains chains: the profile evaluates every sampler on many
/// chains (256) for precise ESS, and each chain pays its own warm-up (or burn-in), which a user
/// after 1,000 or 10,000 effective draws would not run 256 times. The warm-up's gradients are
/// scaled to kUserChains chains exactly (per chain they are the same); its seconds pro rata, a
/// lower bound (a batched warm-up of 4 chains takes more than 4/256 of one of 256), which favours
/// the samplers that warm up every chain (NUTS) over the learned sampler, whose training is not
/// scaled. The sampling rates per effective draw do not depend on the chains.
RunCost at_user_chains(const json& entry, double chains) {
  RunCost c = run_cost_from_json(entry["cost"]);
  if (!(chains > kUserChains)) return c;
  const bool trained = entry.contains("grads_training_total");
  const double train_g = trained ? num(entry, "grads_training_total") : 0.0;
  const double train_s = trained ? num(entry, "seconds_training") : 0.0;
  const double f = kUserChains / chains;
  c.fixed_grads = train_g + (c.fixed_grads - train_g) * f;
  c.fixed_seconds = train_s + (c.fixed_seconds - train_s) * f;
  return c;
}

/// The learned sampler against the best NUTS, sampling only and all-in (Note [The best NUTS],
/// services/accounting.hpp), on uncapped bulk-ESS, per experiment.
std::string all_in_table(const json& experiments) {
  std::string out =
      "\nThe learned sampler against the best NUTS (of Stan's diagonal, dense, fisher-diag and fisher-lowrank metrics; "
      "runs with R-hat above 1.01 left out), on uncapped bulk-ESS (minimum over dimensions). Sampling only: its "
      "bulk-ESS per gradient and per second over the best NUTS's. All-in (Note [All-in accounting]: warm-up, "
      "preconditioner and training counted): the best NUTS's cost of 1,000 and 10,000 effective draws over the learned "
      "sampler's, in gradients and in seconds (above 1: the learned sampler is cheaper), with every sampler's warm-up "
      "charged for the 4 chains a user would run (gradients exactly, seconds pro rata: a lower bound, in NUTS's favour; "
      "the profile evaluates 256); break-even: the run length from which it is cheaper than every NUTS.\n\n";
  out += "| experiment | NUTS runs | sampling: ESS/grad | ESS/s | 1,000 ESS: grads | s | 10,000 ESS: grads | s | "
         "break-even (gradients) | break-even (seconds) |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : experiment_names()) {
    if (!experiments.contains(name)) continue;
    const json& e = section(experiments, name);
    const json& l = section(e, "learned");
    if (!l.contains("cost")) continue;  // a results file from before all-in accounting
    // the evaluation's chains (every sampler of an experiment runs the same number)
    const double chains = l["cost"].contains("chains") ? num(l["cost"], "chains") : num(section(e, "nuts"), "chains");
    std::map<std::string, RunCost> nuts;
    for (const char* n : {"nuts", "nuts_dense", "nuts_fisher_diag", "nuts_fisher_lowrank"}) {
      const json& r = section(e, n);
      if (r.contains("cost") && num(r, "max_rhat") <= 1.01) nuts[n] = at_user_chains(r, chains);
    }
    if (num(l, "max_rhat") > 1.01 || nuts.empty()) {
      out += fmt::format("| {} | {} | not converged ({}) | | | | | | | |\n", name, nuts.size(),
                         nuts.empty() ? "no NUTS run with R-hat <= 1.01" : "the learned sampler's R-hat > 1.01");
      continue;
    }
    const json v = against_best(at_user_chains(l, chains), nuts);
    auto r = [&](const char* k) {
      const json& x = v[k];
      return fmt::format("{:.3g}x ({})", num(x, "ratio"), x["nuts"].get<std::string>());
    };
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", name, nuts.size(), r("ess_per_grad"),
                       r("ess_per_second"), r("grads_for_1000"), r("seconds_for_1000"), r("grads_for_10000"),
                       r("seconds_for_10000"), v["break_even_grads"]["text"].get<std::string>(),
                       v["break_even_seconds"]["text"].get<std::string>());
  }
  return out;
}

}  // namespace

std::string results_table(const json& results) {
  if (!results.is_object() || !results.contains("experiments") || !results["experiments"].is_object()) {
    throw DataError("not a results file of `nmcmc reproduce` (no \"experiments\" object)");
  }
  const json& experiments = results["experiments"];
  std::string out = fmt::format("Profile: {}. ESS with the true moments (paper convention), 2000-step runs, last 1000 kept.\n\n",
                                results.contains("profile") && results["profile"].is_string()
                                    ? results["profile"].get<std::string>() : std::string("?"));
  out += "| experiment | measure | paper (theirs) | ours (learned) | paper's competitor | our MALA | our HMC | learned accept, max R-hat |\n";
  out += "|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : experiment_names()) {
    if (!experiments.contains(name)) continue;
    const json& e = section(experiments, name);
    const json& l = section(e, "learned");
    const json& m = section(e, "mala");
    const json& h = section(e, "hmc");
    const std::string tail = fmt::format("{:.3f}, {:.3f}", num(l, "accept"), num(l, "max_rhat"));
    const json& p = section(e, "paper");
    const std::string comp = p.contains("competitor") && p["competitor"].is_string() ? p["competitor"].get<std::string>() : "";
    if (name == "icg" || name == "scg" || name == "rotated_icg") {
      out += fmt::format("| {} | ESS/MH, ESS/grad (min) | {}, {} | {:.3g}, {:.3g} | {} | {:.3g}, {:.3g} | {:.3g}, {:.3g} | {} |\n", name,
                         num(p, "ess_per_step"), num(p, "ess_per_grad"), num(l, "ess_per_step_min"), num(l, "ess_per_grad_min"),
                         comp, num(m, "ess_per_step_min"), num(m, "ess_per_grad_min"), num(h, "ess_per_step_min"),
                         num(h, "ess_per_grad_min"), tail);
    } else if (name == "funnel1") {
      out += fmt::format("| funnel1 | ESS/grad x1; x2..x100 min (with the authors' sd constant {}) | {}; {} | {:.3g}; {:.3g} ({:.3g}) | {} | {:.3g}; {:.3g} | {:.3g}; {:.3g} | {} |\n",
                         num(p, "authors_sd_rest"), num(p, "ess_per_grad_x1"), num(p, "ess_per_grad_rest"), num(l, "ess_per_grad_x1"), num(l, "ess_per_grad_rest_min"),
                         num(l, "authors_constants_ess_per_step_rest_min") / num(l, "grads_per_step"), comp, num(m, "ess_per_grad_x1"),
                         num(m, "ess_per_grad_rest_min"), num(h, "ess_per_grad_x1"), num(h, "ess_per_grad_rest_min"), tail);
    } else if (name == "funnel3") {
      const json& hp = section(e, "hmc_paper");
      out += fmt::format("| funnel3 | ESS/MH (min; x1) | {} | {:.3g}; {:.3g} | {} | {:.3g}; {:.3g} | {:.3g}; {:.3g} (paper protocol, eps {}: {:.3g}; {:.3g}) | {} |\n",
                         num(p, "ess_per_step"), num(l, "ess_per_step_min"), num(l, "ess_per_step_x1"), comp, num(m, "ess_per_step_min"),
                         num(m, "ess_per_step_x1"), num(h, "ess_per_step_min"), num(h, "ess_per_step_x1"),
                         num(hp, "step_size"), num(hp, "ess_per_step_min"), num(hp, "ess_per_step_x1"), tail);
    } else {
      out += fmt::format("| {} | ESS per 5000 MH steps (min / mean over dims) | {} | {:.0f} / {:.0f} | {} | {:.0f} / {:.0f} | {:.0f} / {:.0f} | {} |\n",
                         name, num(p, "ess_per_5k"), num(l, "ess_5k_min"), num(l, "ess_5k_mean"), comp,
                         num(m, "ess_5k_min"), num(m, "ess_5k_mean"), num(h, "ess_5k_min"), num(h, "ess_5k_mean"), tail);
      if (name == "german" && l.contains("authors_constants_ess_5k_min")) {
        out += fmt::format("| german | the same with the authors' (A-NICE-MC's) moment constants | {} | {:.0f} / {:.0f} | | | | |\n",
                           num(p, "ess_per_5k"), num(l, "authors_constants_ess_5k_min"), num(l, "authors_constants_ess_5k_mean"));
      }
    }
  }
  std::string changes;
  for (const auto& name : experiment_names()) {
    if (!experiments.contains(name)) continue;
    const json& e = section(experiments, name);
    if (!e.contains("profile_changes") || !e["profile_changes"].is_array() || e["profile_changes"].empty()) continue;
    std::vector<std::string> items;
    for (const auto& c : e["profile_changes"]) items.push_back(c.is_string() ? c.get<std::string>() : c.dump());
    changes += fmt::format("- {}: {}\n", name, fmt::join(items, ", "));
  }
  if (!changes.empty()) out += "\nChanged from the paper's configs by this profile:\n\n" + changes;
  out += "\nEvery sampler on the same footing (the same evaluation; the baselines after their adaptation warm-up): accept rate, "
         "gradients per MH step, ESS per MH step (min over dims, true moments), bulk-ESS per MH step (min), max R-hat, "
         "ESS per second of sampling (min), mean squared jump of x1 per MH step; for the learned sampler also its training "
         "wall time and the gradient evaluations per batch row spent in training.\n\n";
  out += "| experiment | sampler | accept | grads/MH step | ESS/MH (min) | bulk-ESS/MH (min) | max R-hat | ESS/s (min) | "
         "x1 MSJD | training s | training grads/row |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : experiment_names()) {
    if (!experiments.contains(name)) continue;
    const json& e = section(experiments, name);
    for (const char* sampler : {"learned", "mala", "hmc", "nuts", "nuts_dense"}) {
      if (!e.contains(sampler)) continue;
      const json& r = section(e, sampler);
      const bool learned = std::string(sampler) == "learned";
      out += fmt::format("| {} | {} | {:.3f} | {:.0f} | {:.4g} | {:.4g} | {:.3f} | {:.4g} | {:.3g} | {} | {} |\n", name, sampler,
                         num(r, "accept"), num(r, "grads_per_step"), num(r, "ess_per_step_min"), num(r, "bulk_ess_per_step_min"),
                         num(r, "max_rhat"), num(r, "ess_per_second_min"), num(r, "msjd_x1"),
                         learned ? fmt::format("{:.0f}", num(r, "seconds_training")) : std::string("-"),
                         learned ? fmt::format("{:.0f}", num(r, "grads_training_per_row")) : std::string("-"));
    }
  }
  out += "\nThe learned sampler against NUTS per gradient (ESS per gradient, minimum over dimensions, true moments). "
         "Training cost T = every gradient evaluation training spent (all batch rows, and the preconditioner's warm-up). "
         "Break-even: the effective draws E at which T + E / (learned ESS/grad) = E / (NUTS ESS/grad), against the better "
         "of the two NUTS metrics (NUTS's own warm-up not counted, which favours NUTS); in learned-sampler draws per "
         "chain-step: E / (learned ESS/MH).\n\n";
  out += "The paper's ESS counts at most one effective draw per step (it sums positive autocorrelations only), which "
         "caps NUTS's often antithetic draws; the bulk-ESS columns (rank-normalised, Stan/ArviZ, not capped) show it.\n\n";
  out += "| experiment | learned ESS/grad | NUTS diag ESS/grad | NUTS dense ESS/grad | learned / best NUTS | "
         "bulk-ESS/grad: learned; NUTS diag; dense | preconditioner | training gradients T | break-even ESS E | "
         "break-even learned draws |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : experiment_names()) {
    if (!experiments.contains(name)) continue;
    const json& e = section(experiments, name);
    const json& l = section(e, "learned");
    const double rl = num(l, "ess_per_grad_min"), nd = num(section(e, "nuts"), "ess_per_grad_min");
    const double nf = num(section(e, "nuts_dense"), "ess_per_grad_min");
    const double best = std::isnan(nf) ? nd : std::isnan(nd) ? nf : std::max(nd, nf);
    const double t = num(l, "grads_training_total");
    std::string be = "never (learned is not better per gradient)", draws = "-";
    if (rl > best && std::isfinite(t)) {
      const double ess = t / (1.0 / best - 1.0 / rl);
      be = fmt::format("{:.3g}", ess);
      draws = fmt::format("{:.3g}", ess / num(l, "ess_per_step_min"));
    } else if (!std::isfinite(t)) {
      be = "-";
    }
    const json& pre = section(e, "preconditioner");
    const std::string pc = pre.contains("kind") && pre["kind"].is_string()
                               ? fmt::format("{} ({} grads)", pre["kind"].get<std::string>(), num(pre, "grads"))
                               : std::string("none");
    auto bulk = [&](const json& r) { return num(r, "bulk_ess_per_step_min") / num(r, "grads_per_step"); };
    const std::string bulks = fmt::format("{:.3g}; {:.3g}; {:.3g}", bulk(l), bulk(section(e, "nuts")),
                                          bulk(section(e, "nuts_dense")));
    out += fmt::format("| {} | {:.4g} | {:.4g} | {:.4g} | {:.2f} | {} | {} | {:.3g} | {} | {} |\n", name, rl, nd, nf, rl / best,
                       bulks, pc, t, be, draws);
  }
  out += all_in_table(experiments);
  return out;
}

}  // namespace nmcmc
