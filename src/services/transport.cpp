// Runs on a target pulled back through a flow fitted during warm-up (Note [Transport warm-up]).
#include "nmcmc/services/transport.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/io/config.hpp"
#include "flow_run.hpp"

namespace nmcmc {

using json = nlohmann::json;


std::pair<FlowTransport, FitReport> transport_affine_estimate(int64_t d, const FitOptions& fit, const torch::Tensor& x,
                                                              const torch::Tensor& g, uint64_t mask_seed,
                                                              uint64_t fit_seed) {
  FlowTransport affine(FlowOptions().set_dim(d).set_layers(0).set_mask_seed(mask_seed));
  FitOptions fa = fit;
  fa.steps = 0;
  fa.init_base = true;
  fa.seed = fit_seed;
  fa.progress = nullptr;
  const FitReport report = fit_transport(*affine, x, g, fa);
  return {affine, report};
}

LatentResidual latent_residual(const TransportedTarget& latent, const torch::Tensor& x, const torch::Tensor& g,
                               uint64_t seed) {
  const auto [z, gz] = latent.latent_pairs(x, g);
  const int64_t d = latent.dim();
  const FlowTransport identity(FlowOptions().set_dim(d).set_layers(0));
  const FlowTransport affine = transport_affine_estimate(d, FitOptions(), z, gz, seed, seed).first;
  torch::NoGradGuard no_grad;
  LatentResidual r;
  r.flow_loss = fisher_loss(*identity, z, gz).item<double>();
  r.affine_loss = fisher_loss(*affine, z, gz).item<double>();
  return r;
}

std::pair<ChainState, StepInfo> TransportKernel::step(Target& target, const ChainState& state, at::Generator& gen) {
  auto [next, info] = inner_->step(target, state, gen);
  if (global_) {  // an independence proposal under the one Metropolis-Hastings decision
    const auto [moved, decided] = mh_accept(next, global_proposal(target, next, gen), gen);
    global_tries_ += next.x.size(0);
    global_accepts_ += decided.accepted.sum().item<int64_t>();
    next = moved;
    info.n_grad += 1;
    info.n_energy += 1;
    if (info.n_grad_chain.defined()) info.n_grad_chain = info.n_grad_chain + 1;
  }
  return {next, info};
}

ProposalResult TransportKernel::global_proposal(Target& target, const ChainState& state, at::Generator& gen) const {
  return normal_independence_proposal(target, state, gen);
}

namespace {
/// Note [Choosing the transport]: the divergence per dimension at finite rows x, g (float64) for
/// the affine map x = mean(x) + L z.
double fisher_per_dim_at(const torch::Tensor& xs, const torch::Tensor& gs, const torch::Tensor& l) {
  const torch::Tensor z = torch::linalg_solve(l, (xs - xs.mean(0)).t()).t();  // x = m + L z
  const torch::Tensor gz = gs.matmul(l);                                      // d(-log p)/dz = L^T grad U
  return (gz - z).pow(2).sum(1).mean().item<double>() / static_cast<double>(xs.size(1));
}
/// The rows of x and g where both are finite (float64).
std::pair<torch::Tensor, torch::Tensor> finite_rows(const torch::Tensor& x, const torch::Tensor& g) {
  const torch::Tensor x64 = x.to(torch::kFloat64), g64 = g.to(torch::kFloat64);
  const torch::Tensor ok = torch::isfinite(g64).all(1) & torch::isfinite(x64).all(1);
  return {x64.index({ok}), g64.index({ok})};
}
/// The Cholesky factor of the rows' covariance; undefined where there is none (fewer rows than
/// D + 1, or rows spanning fewer than D directions).
torch::Tensor covariance_factor(const torch::Tensor& xs) {
  if (xs.size(0) <= xs.size(1)) return torch::Tensor();
  const torch::Tensor c = xs - xs.mean(0);
  const torch::Tensor cov = c.t().matmul(c) / static_cast<double>(xs.size(0) - 1);
  const auto [l, info] = torch::linalg_cholesky_ex(cov);
  return info.item<int64_t>() == 0 ? l : torch::Tensor();
}
}  // namespace

double affine_fisher_per_dim(Target& target, const torch::Tensor& x, const torch::Tensor& l) {
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const EnergyGrad eg = target.energy_and_grad(x64.to(target.options()));
  const auto [xs, gs] = finite_rows(x64, eg.grad);
  if (xs.size(0) < 2) return std::numeric_limits<double>::quiet_NaN();
  return fisher_per_dim_at(xs, gs, l.to(torch::kFloat64));
}

double gaussian_fisher_per_dim(Target& target, const torch::Tensor& x) {
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const torch::Tensor xs = x64.index({torch::isfinite(x64).all(1)});
  const torch::Tensor l = covariance_factor(xs);
  if (!l.defined()) return std::numeric_limits<double>::quiet_NaN();
  return affine_fisher_per_dim(target, xs, l);
}

double gaussian_fisher_per_dim(const torch::Tensor& x, const torch::Tensor& grad_u) {
  TORCH_CHECK(x.dim() == 2 && grad_u.sizes() == x.sizes(), "gaussian_fisher_per_dim: x and grad_u must be [N, D] alike");
  const auto [xs, gs] = finite_rows(x, grad_u);
  const torch::Tensor l = covariance_factor(xs);
  if (!l.defined()) return std::numeric_limits<double>::quiet_NaN();
  return fisher_per_dim_at(xs, gs, l);
}

json FisherBeyondNoise::record() const {
  auto value = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  return {{"fisher_per_dim", value(beyond_noise)},
          {"fisher_per_dim_all_rows", value(all_rows)},
          {"fisher_per_dim_half_rows", value(half_rows)}};
}

FisherBeyondNoise fisher_beyond_noise(const torch::Tensor& x, const torch::Tensor& grad_u) {
  TORCH_CHECK(x.dim() == 2 && grad_u.sizes() == x.sizes(), "fisher_beyond_noise: x and grad_u must be [N, D] alike");
  const auto [xs, gs] = finite_rows(x, grad_u);
  FisherBeyondNoise f;
  f.rows = xs.size(0);
  const torch::Tensor l = covariance_factor(xs);
  if (!l.defined()) return f;
  f.all_rows = fisher_per_dim_at(xs, gs, l);
  const int64_t half = xs.size(0) / 2;
  const torch::Tensor xh = xs.narrow(0, xs.size(0) - half, half), gh = gs.narrow(0, gs.size(0) - half, half);
  const torch::Tensor lh = covariance_factor(xh);
  if (!lh.defined()) return f;  // fewer than 2 (D + 1) rows: the noise cannot be told from the posterior
  f.half_rows = fisher_per_dim_at(xh, gh, lh);
  f.beyond_noise = 2 * f.all_rows - f.half_rows;
  return f;
}

namespace {
TransportRun run_with_auto(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress);
}  // namespace

TransportRun run_with_transport(Target& target, Kernel& kernel, const RunOptions& options,
                                const TransportOptions& t, uint64_t seed, const ProgressFn& progress) {
  if (t.kind == TransportKind::kAuto) return run_with_auto(target, kernel, options, t, seed, progress);
  return run_flow_transport(target, kernel, options, t, seed, progress);
}

std::vector<int64_t> transport_round_lengths(const RunOptions& options, const TransportOptions& t) {
  if (options.warmup < 100) {
    throw UsageError("--transport flow and auto fit a flow during warm-up: give --warmup of at least 100 (got " +
                     std::to_string(options.warmup) + ")");
  }
  if (t.rounds < 1) throw UsageError("--transport-rounds must be at least 1");
  if (t.layers < 0) throw UsageError("--transport-layers must be non-negative");
  if (!(t.fit_fraction > 0 && t.fit_fraction < 1)) throw UsageError("the transport's fit fraction must be in (0, 1)");
  if (!options.keep_draws) throw UsageError("--transport flow and auto keep their draws (keep_draws)");
  // Round lengths: doubling, summing to fit_fraction of the warm-up; with two rounds or more the
  // first (the transient, which sets the affine base: Note [Transport warm-up]) lasts at least
  // rules.first_round iterations and the others share the rest, doubling.
  const int64_t fit_iters = static_cast<int64_t>(std::lround(t.fit_fraction * options.warmup));
  std::vector<int64_t> lengths;
  if (t.rounds == 1) {
    lengths.push_back(std::max<int64_t>(10, fit_iters));
  } else {
    const int64_t first = std::max(t.rules.first_round, static_cast<int64_t>(std::lround(double(fit_iters) / double((int64_t{1} << t.rounds) - 1))));
    const double later_unit = double(std::max<int64_t>(fit_iters - first, 0)) / double((int64_t{1} << t.rounds) - 2);
    lengths.push_back(first);
    for (int64_t r = 1; r < t.rounds; ++r) {
      lengths.push_back(std::max<int64_t>(10, static_cast<int64_t>(std::lround(later_unit * double(int64_t{1} << r)))));
    }
  }
  if (options.warmup - std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) < 20) {
    throw UsageError("--warmup is too short for " + std::to_string(t.rounds) + " transport rounds");
  }
  return lengths;
}

void to_json(nlohmann::json& j, const TransportChoice& c) {
  j = {{"kind", c.kind}, {"layers", c.layers}, {"hidden", c.hidden}, {"rounds", c.rounds},
       {"global_moves", c.global_moves}, {"engine", c.engine}};
}

void from_json(const nlohmann::json& j, TransportChoice& c) {
  c = TransportChoice();
  if (j.is_string()) {
    c.kind = j.get<TransportKind>();
    return;
  }
  if (!j.is_object()) throw UsageError("transport: give a kind (\"flow\") or an object such as {\"kind\": \"flow\"}");
  check_known_keys(j, nlohmann::json(TransportChoice()), "transport");
  auto whole = [&j](const char* key, std::optional<int64_t>& to) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number_integer()) throw UsageError(std::string("transport.") + key + " must be a whole number, got " + j[key].dump());
    to = j[key].get<int64_t>();
  };
  whole("layers", c.layers);
  whole("hidden", c.hidden);
  whole("rounds", c.rounds);
  try {
    if (j.contains("kind")) c.kind = j["kind"].get<TransportKind>();
    if (j.contains("global_moves")) c.global_moves = j["global_moves"].get<bool>();
    if (j.contains("engine")) c.engine = j["engine"].get<Engine>();
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(std::string("transport: ") + e.what());
  }
}

void check_transport_choice(const TransportChoice& c, bool sampling, const std::string& what) {
  const bool flags = c.layers || c.hidden || c.rounds || c.global_moves;
  if (c.kind == TransportKind::kNone && flags) {
    throw UsageError(what + ": " + (sampling ? "--global-moves, " : "") +
                     "--transport-layers and --transport-rounds (transport.layers, .hidden, .rounds) go with "
                     "--transport flow or auto");
  }
  if (c.global_moves && !sampling) {
    throw UsageError(what + ": global moves are a sampling run's (nmcmc sample --global-moves); training does not take them");
  }
  if (c.layers && *c.layers < 0) throw UsageError(what + ": --transport-layers must be non-negative");
  if (c.hidden && *c.hidden < 0) throw UsageError(what + ": transport.hidden must be non-negative");
  if (c.rounds && (*c.rounds < 1 || *c.rounds > 30)) throw UsageError(what + ": --transport-rounds must be between 1 and 30");
}

TransportOptions transport_options(const TransportChoice& c, int64_t default_rounds) {
  TransportOptions t;
  t.kind = c.kind;
  t.layers = c.layers.value_or(kDefaultTransportLayers);
  t.hidden = c.hidden.value_or(0);
  t.rounds = c.rounds.value_or(default_rounds);
  t.global_moves = c.global_moves;
  t.engine = c.engine;
  t.fit.own_gradient = c.engine != Engine::kLibTorch;  // Note [Native copies]
  return t;
}

namespace {

/// Note [Choosing the transport], sampling: a run without a transport that watches its warm-up,
/// and goes on into sampling, or gives way to the flow's run.
TransportRun run_with_auto(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress) {
  TransportOptions flow_options = t;
  flow_options.kind = TransportKind::kFlow;
  transport_round_lengths(options, flow_options);  // the flow's run must be possible before the first step
  // The first quarter of the warm-up (at least 100 iterations) is watched; the states of its
  // second half, newest last (positions and energy gradients [C, D] per iteration, at most
  // rules.fisher_rows rows in all), decide at its end.
  const int64_t decide_at = std::min(options.warmup, std::max<int64_t>(t.rules.auto_watch_min, options.warmup / 4));
  const int64_t keep_iterations = (t.rules.fisher_rows + options.chains - 1) / options.chains;
  std::deque<std::pair<torch::Tensor, torch::Tensor>> seen;
  FisherBeyondNoise measured;
  int64_t rows = 0;
  bool flow = false;
  RunOptions watched = options;
  watched.warmup_observer = [&](int64_t i, const ChainState& state) {
    if (options.warmup_observer && !options.warmup_observer(i, state)) return false;
    if (i >= decide_at) return true;
    if (i >= decide_at / 2 && state.grad.defined()) {  // a kernel without gradients: not measured
      seen.emplace_back(state.x.to(torch::kFloat64).clone(), state.grad.to(torch::kFloat64).clone());
      if (static_cast<int64_t>(seen.size()) > keep_iterations) seen.pop_front();
    }
    if (i + 1 < decide_at) return true;
    if (!seen.empty()) {
      std::vector<torch::Tensor> xs, gs;
      for (const auto& [x, g] : seen) {
        xs.push_back(x);
        gs.push_back(g);
      }
      torch::Tensor x = torch::cat(xs), g = torch::cat(gs);
      const int64_t keep = t.rules.fisher_rows;
      if (x.size(0) > keep) {
        x = x.narrow(0, x.size(0) - keep, keep);
        g = g.narrow(0, g.size(0) - keep, keep);
      }
      rows = x.size(0);
      measured = fisher_beyond_noise(x, g);  // Note [The affine map's noise]
    }
    seen.clear();
    flow = measured.beyond_noise > t.rules.flow_fisher_per_dim;  // NaN (not measured): no transport
    return !flow;
  };
  const double step_size_given = kernel.step_size();
  SampleResult first = run_sampler(target, kernel, watched, seed, progress);
  json record = measured.record();
  record.update({{"threshold", t.rules.flow_fisher_per_dim},
                 {"rows", rows},
                 {"decided_after", decide_at},
                 {"chose", flow ? "flow" : "none"}});
  if (!std::isfinite(measured.beyond_noise) && first.complete) {
    record["why"] = "not measured: the warm-up's last draws span fewer than D directions, or half of them fewer "
                    "(fewer than 2 (D + 1) finite rows)";
  }
  TransportRun out;
  if (!flow || !first.complete) {  // sampling went on without a transport, or the run was stopped
    out.result = std::move(first);
    out.report = {{"kind", TransportKind::kAuto}, {"auto", record}};
    return out;
  }
  record["first_warmup"] = {{"iterations", decide_at},
                            {"grads_per_chain", first.grads_warmup},
                            {"energies_per_chain", first.energies_warmup},
                            {"seconds", first.seconds_warmup},
                            {"step_size", first.step_size}};
  // The flow's run starts from the kernel as it was given - its step size, and the unit metric
  // every caller makes it with - as `--transport flow` does. Handing the watched stretch over in
  // place of the flow's first round (its states setting the affine base, round 2 starting where the
  // chains were) saved gradients (Funnel-1 all-in 0.039 -> 0.045-0.050) but failed Funnel-3 at 4
  // seeds of 10 where this passes all 10: a base from NUTS's states in x under the run's diagonal
  // metric starts the rounds worse than the first round's own. Not kept.
  if (kernel.has_tunable_step_size()) kernel.set_step_size(step_size_given);
  if (kernel.has_metric()) kernel.set_metric(Metric());
  out = run_flow_transport(target, kernel, options, flow_options, seed, progress);
  // All-in: the first warm-up, which chose the flow, is paid too.
  out.result.grads_warmup += first.grads_warmup;
  out.result.energies_warmup += first.energies_warmup;
  out.result.seconds_warmup += first.seconds_warmup;
  out.report["kind"] = TransportKind::kAuto;
  out.report["auto"] = record;
  return out;
}
}  // namespace

}  // namespace nmcmc
