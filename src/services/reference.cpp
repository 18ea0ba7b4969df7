#include "nmcmc/services/reference.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

ReferenceResult compute_reference(const ReferenceOptions& a, const ProgressFn& progress) {
  auto options = torch::TensorOptions().dtype(torch::kFloat64);
  auto target = make_target({{"name", "logistic"}, {"dataset", a.dataset}}, options);
  auto proposal = make_baseline_proposal(ProposalOptions().set_sampler(SamplerKind::kHmc).set_leapfrog(a.leapfrog).set_jitter(a.jitter));
  MetropolisHastings kernel(proposal);
  RunOptions run;
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_adapt_mass(true).set_target_accept(0.8);
  auto result = run_sampler(*target, kernel, run, a.seed, progress);
  ReferenceResult out;
  out.summary = summarise(result, *target);
  const double max_rhat = out.summary["max_rhat"].get<double>();
  out.converged = max_rhat < 1.01;
  std::vector<double> mean, sd, mcse, ess;
  for (const auto& p : out.summary["parameters"]) {
    mean.push_back(p["mean"]);
    sd.push_back(p["sd"]);
    mcse.push_back(p["mcse_mean"]);
    ess.push_back(p["ess_bulk"]);
  }
  json& r = out.reference;
  r["dataset"] = a.dataset;
  r["model"] = "logistic regression, N(0, 10^2) prior, standardised features (sample sd), intercept first";
  r["mean"] = mean;
  r["sd"] = sd;
  r["mcse_mean"] = mcse;
  r["ess_bulk"] = ess;
  r["max_rhat"] = max_rhat;
  r["min_ess_bulk"] = out.summary["min_ess_bulk"];
  r["method"] = fmt::format("HMC, {} leapfrog steps, step-size jitter {}, dual-averaged step size (target 0.8), windowed "
                            "diagonal mass matrix; {} chains x {} draws after {} warm-up, float64",
                            a.leapfrog, a.jitter, a.chains, a.draws, a.warmup);
  r["command"] = a.command;
  r["seed"] = a.seed;
  if (!out.converged) return out;
  out.path = a.output.empty() ? (fs::path(data_directory()) / "reference" / (a.dataset + ".json")).string() : a.output;
  const std::string dir = fs::path(out.path).parent_path().string();
  ensure_directory(dir.empty() ? "." : dir);
  write_atomically(out.path, [&](std::ostream& os) { os << r.dump(2) << "\n"; });
  return out;
}

}  // namespace nmcmc
