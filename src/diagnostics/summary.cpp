#include "nmcmc/diagnostics/summary.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <fcntl.h>
#include <unistd.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
/// Parameters per block so that one block of draws [S, C, k] and the summaries' temporaries
/// (about 8 copies) stay near 256 MiB: the summary of disk-backed draws reads them in blocks.
int64_t parameter_block(const torch::Tensor& draws, int64_t block_bytes) {
  const double per_parameter = 8.0 * 8.0 * static_cast<double>(draws.size(0)) * static_cast<double>(draws.size(1));
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(block_bytes) / per_parameter));
}

StanSummary blocked_stan_summary(const torch::Tensor& draws, int64_t block_bytes, const ProgressFn& progress) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  if (block >= d) return stan_summary(draws);
  std::vector<StanSummary> parts;
  const auto t0 = std::chrono::steady_clock::now();
  SummaryWorkspace workspace;  // one set of buffers for all blocks
  for (int64_t k = 0; k < d; k += block) {
    parts.push_back(stan_summary(draws.narrow(2, k, std::min(block, d - k)), &workspace));
    if (progress) {
      Progress p;
      p.phase = "summary";
      p.iteration = std::min(d, k + block);
      p.total = d;
      p.elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(p);
    }
  }
  auto cat = [&](torch::Tensor StanSummary::*field) {
    std::vector<torch::Tensor> v;
    for (auto& p : parts) v.push_back(p.*field);
    return torch::cat(v);
  };
  StanSummary st;
  for (auto field : {&StanSummary::mean, &StanSummary::sd, &StanSummary::mcse_mean, &StanSummary::mcse_sd, &StanSummary::ess_bulk,
                     &StanSummary::ess_tail, &StanSummary::rhat, &StanSummary::q05, &StanSummary::q50, &StanSummary::q95}) {
    st.*field = cat(field);
  }
  return st;
}

double blocked_msjd(const torch::Tensor& draws, int64_t block_bytes) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  double total = 0;  // |x' - x|^2 sums over parameters, so blocks add up
  for (int64_t k = 0; k < d; k += block) total += mean_squared_jump(draws.narrow(2, k, std::min(block, d - k)));
  return total;
}

torch::Tensor blocked_paper_ess(const torch::Tensor& draws, const Moments& m, int64_t block_bytes) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  std::vector<torch::Tensor> v;
  for (int64_t k = 0; k < d; k += block) {
    const int64_t n = std::min(block, d - k);
    v.push_back(paper_ess_ratio(draws.narrow(2, k, n), m.mean.narrow(0, k, n), m.sd.narrow(0, k, n)));
  }
  return torch::cat(v);
}

double finite_min(const torch::Tensor& t) {
  torch::Tensor f = t.masked_select(torch::isfinite(t));
  return f.numel() ? f.min().item<double>() : std::nan("");
}
}  // namespace

json summarise(const SampleResult& r, Target& target, int64_t block_bytes, const ProgressFn& progress) {
  TORCH_CHECK(r.draws.defined(), "summarise needs the draws (keep_draws)");
  if (r.draws.size(0) == 0) throw UsageError("no draws to summarise (the run stopped before its first draw)");
  const int64_t s = r.draws.size(0), c = r.draws.size(1), d = r.draws.size(2);
  const double steps = static_cast<double>(s * c);
  // Per chain and draw (a thinned draw: every step behind it); for NUTS the exact mean over chains
  // of each chain's own count.
  const double grads_per_step = r.n_grad_chain.defined() ? r.n_grad_chain.to(torch::kFloat64).mean().item<double>()
                                                         : static_cast<double>(r.grads_sampling) / static_cast<double>(s);
  StanSummary st = blocked_stan_summary(r.draws, block_bytes, progress);
  json j;
  j["target"] = target.spec();
  j["chains"] = c;
  j["draws"] = s;
  j["dim"] = d;
  j["seed"] = r.seed;
  j["complete"] = r.complete;
  j["draws_planned"] = r.draws_planned;
  j["thin"] = r.thin;  // steps per draw (Note [Thinning], kernels/run.cpp): the per-draw figures count them all
  j["step_size"] = r.step_size;  // where the chains have their own: their mean, each in step_sizes
  if (r.step_size_chain.defined()) {
    const torch::Tensor e = r.step_size_chain.to(torch::kFloat64).contiguous();
    j["step_sizes"] = std::vector<double>(e.data_ptr<double>(), e.data_ptr<double>() + e.numel());
  }
  j["metric"] = r.metric;
  if (r.metric == "low-rank") j["metric_rank"] = r.metric_rank;
  // Note [Stuck chains in warm-up]: chains that restarted from a moving chain's position
  j["chains_restarted"] = r.chains_restarted;
  j["chains_redrawn"] = r.chains_redrawn;
  j["accept_rate"] = r.accept_stat.mean().item<double>();
  j["divergences"] = r.divergent.sum().item<int64_t>();
  // Note [A density may fail]: the points where the density raised (rejected, as non-finite ones)
  j["density_failures"] = target.density_failures();
  if (target.density_failures() > 0) j["first_density_failure"] = target.first_density_failure();
  j["grads_per_step"] = grads_per_step;
  j["energies_per_step"] = static_cast<double>(r.energies_sampling) / static_cast<double>(s);
  j["grads_warmup_per_chain"] = r.grads_warmup;
  j["seconds_warmup"] = r.seconds_warmup;
  j["seconds_sampling"] = r.seconds_sampling;
  j["msjd"] = blocked_msjd(r.draws, block_bytes);
  if (r.tree_depth.defined()) {
    j["max_tree_depth"] = r.max_tree_depth;
    j["tree_depth_hits"] = (r.tree_depth >= r.max_tree_depth).sum().item<int64_t>();
    j["mean_tree_depth"] = r.tree_depth.to(torch::kFloat64).mean().item<double>();
  }
  if (r.n_grad_chain.defined()) {
    // Batched gradient calls per draw (chains running ahead of each other share calls across
    // draws: Note [Asynchronous NUTS chains]); grads_per_step / this is the batch's utilisation.
    j["batch_grads_per_step"] = r.batch_grads_sampling > 0 && r.n_grad.size(0) > 0
                                    ? static_cast<double>(r.batch_grads_sampling) / static_cast<double>(r.n_grad.size(0))
                                    : r.n_grad.to(torch::kFloat64).mean().item<double>();
  }
  json params = json::array();
  // The draws' own labels (Note [Draws in the model's own parameters]), else the target's.
  const std::vector<std::string> names =
      static_cast<int64_t>(r.names.size()) == d ? r.names : parameter_labels(target);
  for (int64_t k = 0; k < d; ++k) {
    params.push_back({{"name", names[k]},
                      {"mean", st.mean[k].item<double>()},
                      {"sd", st.sd[k].item<double>()},
                      {"mcse_mean", st.mcse_mean[k].item<double>()},
                      {"mcse_sd", st.mcse_sd[k].item<double>()},
                      {"q05", st.q05[k].item<double>()},
                      {"q50", st.q50[k].item<double>()},
                      {"q95", st.q95[k].item<double>()},
                      {"ess_bulk", st.ess_bulk[k].item<double>()},
                      {"ess_tail", st.ess_tail[k].item<double>()},
                      {"rhat", st.rhat[k].item<double>()}});
  }
  j["parameters"] = params;
  const double min_bulk = finite_min(st.ess_bulk), min_tail = finite_min(st.ess_tail);
  j["min_ess_bulk"] = min_bulk;
  j["min_ess_tail"] = min_tail;
  j["max_rhat"] = st.rhat.masked_select(torch::isfinite(st.rhat)).numel() ? st.rhat.nan_to_num(0).max().item<double>() : std::nan("");
  j["ess_bulk_per_step"] = min_bulk / steps;
  j["ess_bulk_per_grad"] = grads_per_step > 0 ? min_bulk / (steps * grads_per_step) : std::nan("");
  j["ess_bulk_per_second"] = min_bulk / r.seconds_sampling;
  if (auto m = target.reference_moments(); m && s >= 2) {  // (ESS needs two draws)
    torch::Tensor ratio = blocked_paper_ess(r.draws, *m, block_bytes);  // ESS / S per dimension
    json p;
    p["convention"] = "L2HMC/A-NICE-MC: known moments, cutoff 0.05, averaged over chains";
    p["ess_per_step_min"] = ratio.min().item<double>();
    p["ess_per_step_mean"] = ratio.mean().item<double>();
    p["ess_per_step_x1"] = ratio[0].item<double>();
    if (d > 1) p["ess_per_step_rest_min"] = ratio.narrow(0, 1, d - 1).min().item<double>();
    if (grads_per_step > 0) {
      p["ess_per_grad_min"] = ratio.min().item<double>() / grads_per_step;
      p["ess_per_grad_x1"] = ratio[0].item<double>() / grads_per_step;
      if (d > 1) p["ess_per_grad_rest_min"] = ratio.narrow(0, 1, d - 1).min().item<double>() / grads_per_step;
    }
    const double seconds_per_step = r.seconds_sampling / static_cast<double>(s);
    p["ess_per_second_min"] = ratio.min().item<double>() * static_cast<double>(c) / seconds_per_step;
    p["per_dim"] = std::vector<double>(ratio.data_ptr<double>(), ratio.data_ptr<double>() + d);
    j["paper_ess"] = p;
  }
  return j;
}

namespace {

/// The quantity whose `key` is largest (or smallest), as "name, value".
std::string worst_of(const json& params, const char* key, bool largest) {
  const json* worst = nullptr;
  for (const auto& p : params) {
    const double v = p.value(key, std::nan(""));
    if (!std::isfinite(v)) continue;
    if (!worst || (largest ? v > (*worst)[key].get<double>() : v < (*worst)[key].get<double>())) worst = &p;
  }
  return worst ? fmt::format("{}, {:.4g}", (*worst)["name"].get<std::string>(), (*worst)[key].get<double>()) : "";
}

/// Note [Convergence warnings]: as Stan's interfaces warn (Vehtari et al. 2021's thresholds, the
/// ones every table of this project uses): chains that disagree (max rank-normalised R-hat above
/// 1.01) and too few effective draws for the summary's own means and quantiles (bulk- or tail-ESS
/// below 100 per chain). The figures above stay as they are; the lines say what not to trust.
template <typename Line>
void convergence_warnings(const json& j, const Line& line) {
  const json& params = j.at("parameters");
  const double rhat = j.value("max_rhat", std::nan(""));
  const int64_t chains = j.value("chains", int64_t{1});
  if (chains > 1 && std::isfinite(rhat) && rhat > 1.01) {
    line(fmt::format("warning: the chains have not mixed: max R-hat {:.3f} (worst {}) is above 1.01; do not use these "
                     "draws for inference: run more warm-up and draws, or another sampler or metric",
                     rhat, worst_of(params, "rhat", true)));
  }
  const double bulk = j.value("min_ess_bulk", std::nan("")), tail = j.value("min_ess_tail", std::nan(""));
  const double floor = 100.0 * static_cast<double>(chains);
  if ((std::isfinite(bulk) && bulk < floor) || (std::isfinite(tail) && tail < floor)) {
    line(fmt::format("warning: too few effective draws for the means and quantiles above: min bulk-ESS {:.0f} (worst "
                     "{}), min tail-ESS {:.0f}, below 100 per chain ({:.0f}); run more draws",
                     bulk, worst_of(params, "ess_bulk", false), tail, floor));
  }
}

}  // namespace

std::string format_summary(const json& j, int64_t rows) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  const auto& params = j.at("parameters");
  const int64_t d = static_cast<int64_t>(params.size());
  line(fmt::format("{:>10} {:>11} {:>10} {:>9} {:>9} {:>9} {:>7}", "param", "mean", "sd", "mcse", "ess_bulk", "ess_tail",
                   "rhat"));
  auto row = [&](const json& p) {
    line(fmt::format("{:>10} {:>11.4g} {:>10.4g} {:>9.3g} {:>9.0f} {:>9.0f} {:>7.3f}", p["name"].get<std::string>(),
                     p["mean"].get<double>(), p["sd"].get<double>(), p["mcse_mean"].get<double>(),
                     p["ess_bulk"].get<double>(), p["ess_tail"].get<double>(), p["rhat"].get<double>()));
  };
  std::vector<int64_t> order(d);
  for (int64_t k = 0; k < d; ++k) order[k] = k;
  if (d <= 2 * rows) {
    for (auto& p : params) row(p);
  } else {
    for (int64_t k = 0; k < rows; ++k) row(params[k]);
    line(fmt::format("{:>10}", "..."));
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return params[a]["ess_bulk"].get<double>() < params[b]["ess_bulk"].get<double>();
    });
    line(fmt::format("worst {} by bulk ESS:", rows));
    for (int64_t k = 0; k < rows; ++k) row(params[order[k]]);
  }
  const double steps = j["draws"].get<double>() * j["chains"].get<double>();
  line("");
  const int64_t thin = j.value("thin", int64_t{1});  // Note [Thinning]: a draw's figures cover its steps
  line(fmt::format("chains {}  draws/chain {}{}  accept {:.3f}  step size {:.4g}  divergences {}  grads/{} {:.1f}",
                   j["chains"].get<int64_t>(), j["draws"].get<int64_t>(),
                   thin > 1 ? fmt::format(" (one in {} steps)", thin) : std::string(), j["accept_rate"].get<double>(),
                   j["step_size"].get<double>(), j["divergences"].get<int64_t>(), thin > 1 ? "draw" : "step",
                   j["grads_per_step"].get<double>()));
  if (j["divergences"].get<int64_t>() > 0) {
    // As Stan warns: a divergent trajectory met curvature its step size could not follow, and the
    // chains under-visit such regions. Funnel-3 through the flow, 20,000 draws per chain: at 0.8
    // 4.2 % diverged and x1's sd came out 2.4 % low, at 0.95 0.68 % and 1.4 % low (-3.1 MCSE), at
    // 0.99 0.28 % and right.
    line(fmt::format("warning: {} of {:.0f} {} ({:.2g} %): the draws may miss where the density "
                     "curves sharply (a funnel's neck); a higher --target-accept (0.9 to 0.99) takes smaller steps there",
                     j["divergences"].get<int64_t>(), steps, thin > 1 ? "draws had a divergent step" : "transitions diverged",
                     100.0 * j["divergences"].get<double>() / steps));
  }
  line(fmt::format("min bulk-ESS {:.0f} of {:.0f} draws ({:.4f}/{}, {:.4g}/grad, {:.1f}/s)  min tail-ESS {:.0f}  max R-hat {:.3f}",
                   j["min_ess_bulk"].get<double>(), steps, j["ess_bulk_per_step"].get<double>(), thin > 1 ? "draw" : "MH step",
                   j["ess_bulk_per_grad"].is_number() ? j["ess_bulk_per_grad"].get<double>() : std::nan(""),
                   j["ess_bulk_per_second"].get<double>(), j["min_ess_tail"].get<double>(), j["max_rhat"].get<double>()));
  convergence_warnings(j, line);
  if (j.value("metric", std::string("unit")) != "unit") {
    line(fmt::format("metric {}{}", j["metric"].get<std::string>(),
                     j.contains("metric_rank") ? fmt::format(" (rank {} correction)", j["metric_rank"].get<int64_t>()) : ""));
  }
  if (j.value("chains_redrawn", int64_t{0}) > 0) {
    line(fmt::format("{} starting point(s) where no step size could move a chain were drawn again before warm-up",
                     j["chains_redrawn"].get<int64_t>()));
  }
  if (j.value("chains_restarted", int64_t{0}) > 0) {
    line(fmt::format("{} chain(s) stuck at their starting points restarted from moving chains in early warm-up",
                     j["chains_restarted"].get<int64_t>()));
  }
  if (j.value("density_failures", int64_t{0}) > 0) {
    line(fmt::format("the density raised an error at {} points (those proposals were rejected, as where it is not "
                     "finite); the first: {}",
                     j["density_failures"].get<int64_t>(), j["first_density_failure"].get<std::string>().substr(0, 300)));
  }
  if (j.contains("paper_ess")) {
    const auto& p = j["paper_ess"];
    const char* per = thin > 1 ? "draw" : "step";  // a thinned draw is `thin` MH steps
    std::string s = fmt::format("paper ESS (true moments): min {:.4f}/{}{}", p["ess_per_step_min"].get<double>(),
                                thin > 1 ? "" : "MH ", per);
    if (p.contains("ess_per_grad_min")) s += fmt::format(", {:.4g}/grad", p["ess_per_grad_min"].get<double>());
    const std::string first = params.empty() ? "x.1" : params[0]["name"].get<std::string>();
    s += fmt::format("; {} {:.4f}/{}", first, p["ess_per_step_x1"].get<double>(), per);
    if (p.contains("ess_per_step_rest_min")) s += fmt::format("; the others min {:.4f}/{}", p["ess_per_step_rest_min"].get<double>(), per);
    line(s);
  }
  if (j.contains("tree_depth_hits")) {
    line(fmt::format("NUTS: mean tree depth {:.2f}, {} of {} transitions hit the maximum depth {}", j["mean_tree_depth"].get<double>(),
                     j["tree_depth_hits"].get<int64_t>(), static_cast<int64_t>(steps), j["max_tree_depth"].get<int64_t>()));
  }
  line(fmt::format("time: warm-up {:.2f} s, sampling {:.2f} s;  mean squared jump {:.4g}", j["seconds_warmup"].get<double>(),
                   j["seconds_sampling"].get<double>(), j["msjd"].get<double>()));
  return out;
}

}  // namespace nmcmc
