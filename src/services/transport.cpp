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

namespace nmcmc {

using json = nlohmann::json;

namespace {
const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Forwards the run's draws to `inner` mapped to x (draws x = T(z), lp = -U(x)).
class MappedSink : public DrawSink {
 public:
  MappedSink(DrawSink* inner, const TransportedTarget& latent) : inner_(inner), latent_(&latent) {}
  void append(const SampleResult& result, int64_t from, int64_t to) override {
    inner_->append(view(result, to), from, to);
  }
  void finish(const SampleResult& result) override { inner_->finish(view(result, result.draws.size(0))); }

 private:
  SampleResult view(const SampleResult& result, int64_t to) {
    if (!draws_.defined() || draws_.size(0) < result.draws.size(0)) {
      draws_ = torch::zeros(result.draws.sizes(), kF64);
      lp_ = torch::zeros(result.lp.sizes(), kF64);
      done_ = 0;
    }
    if (to > done_) {
      torch::Tensor z = result.draws.slice(0, done_, to);  // [s, C, D]
      const auto shape = z.sizes().vec();
      torch::Tensor flat = z.reshape({-1, shape[2]});
      draws_.slice(0, done_, to).copy_(latent_->to_ambient(flat).to(torch::kFloat64).reshape(shape));
      lp_.slice(0, done_, to).copy_(result.lp.slice(0, done_, to) - latent_->log_det(flat).reshape({shape[0], shape[1]}));
      done_ = to;
    }
    SampleResult v = result;
    v.draws = draws_.slice(0, 0, result.draws.size(0));
    v.lp = lp_.slice(0, 0, result.lp.size(0));
    return v;
  }
  DrawSink* inner_;
  const TransportedTarget* latent_;
  torch::Tensor draws_, lp_;
  int64_t done_ = 0;
};
/// The affine map alone with its base estimated from (x, g) (the low-rank-plus-diagonal Fisher
/// estimate; no Adam step), and its held-out loss on those points.
std::pair<FlowTransport, FitReport> affine_estimate(int64_t d, const FitOptions& fit, const torch::Tensor& x,
                                                    const torch::Tensor& g, uint64_t mask_seed, uint64_t fit_seed) {
  FlowTransport affine(FlowOptions().set_dim(d).set_layers(0).set_mask_seed(mask_seed));
  FitOptions fa = fit;
  fa.steps = 0;
  fa.init_base = true;
  fa.seed = fit_seed;
  fa.progress = nullptr;
  const FitReport report = fit_transport(*affine, x, g, fa);
  return {affine, report};
}
}  // namespace

LatentResidual latent_residual(const TransportedTarget& latent, const torch::Tensor& x, const torch::Tensor& g,
                               uint64_t seed) {
  const auto [z, gz] = latent.latent_pairs(x, g);
  const int64_t d = latent.dim();
  const FlowTransport identity(FlowOptions().set_dim(d).set_layers(0));
  const FlowTransport affine = affine_estimate(d, FitOptions(), z, gz, seed, seed).first;
  torch::NoGradGuard no_grad;
  LatentResidual r;
  r.flow_loss = fisher_loss(*identity, z, gz).item<double>();
  r.affine_loss = fisher_loss(*affine, z, gz).item<double>();
  return r;
}

std::pair<ChainState, StepInfo> TransportKernel::step(Target& target, const ChainState& state, at::Generator& gen) {
  auto [next, info] = inner_->step(target, state, gen);
  if (global_) {
    torch::Tensor z = torch::randn(next.x.sizes(), gen, next.x.options());
    EnergyGrad eg = target.energy_and_grad(z);
    torch::Tensor log_a = global_log_ratio(next.energy.to(torch::kFloat64), eg.energy.to(torch::kFloat64),
                                           next.x.to(torch::kFloat64), z.to(torch::kFloat64));
    torch::Tensor ok = torch::isfinite(log_a) & torch::isfinite(eg.grad).all(1);
    torch::Tensor u = torch::rand({z.size(0)}, gen, kF64);
    torch::Tensor accept = ok & (u.log() < log_a);
    torch::Tensor a = accept.unsqueeze(1);
    next.x = torch::where(a, z, next.x);
    next.grad = torch::where(a, eg.grad, next.grad);
    next.energy = torch::where(accept, eg.energy, next.energy);
    global_tries_ += z.size(0);
    global_accepts_ += accept.sum().item<int64_t>();
    info.n_grad += 1;
    info.n_energy += 1;
    if (info.n_grad_chain.defined()) info.n_grad_chain = info.n_grad_chain + 1;
  }
  if (recording_) {
    if (!next.grad.defined()) {
      throw UsageError("a flow transport is fitted from gradients, which sampler '" + inner_->name() +
                       "' does not compute (use nuts, hmc or mala)");
    }
    xs_.push_back(next.x.detach().to(torch::kCPU, torch::kFloat64));
    gs_.push_back(next.grad.detach().to(torch::kCPU, torch::kFloat64));
  }
  return {next, info};
}

torch::Tensor TransportKernel::global_log_ratio(const torch::Tensor& u_old, const torch::Tensor& u_new,
                                                const torch::Tensor& z_old, const torch::Tensor& z_new) const {
  // log a = U(z) - U(z') + log N(z) - log N(z')   (q(z) / q(z') of the independence proposal)
  return u_old - u_new + 0.5 * (z_new.pow(2).sum(1) - z_old.pow(2).sum(1));
}

std::pair<torch::Tensor, torch::Tensor> TransportKernel::take() {
  if (xs_.empty()) return {torch::Tensor(), torch::Tensor()};
  std::pair<torch::Tensor, torch::Tensor> out{torch::cat(xs_), torch::cat(gs_)};
  xs_.clear();
  gs_.clear();
  return out;
}

SampleResult run_mapped(TransportedTarget& latent, Kernel& kernel, const RunOptions& options, uint64_t seed,
                        const ProgressFn& progress) {
  RunOptions fo = options;
  std::unique_ptr<MappedSink> sink;
  if (options.sink) {
    sink = std::make_unique<MappedSink>(options.sink, latent);
    fo.sink = sink.get();
  }
  SampleResult res = run_sampler(latent, kernel, fo, seed, progress);
  if (res.draws.defined() && res.draws.size(0) > 0) {
    const auto shape = res.draws.sizes().vec();
    torch::Tensor flat = res.draws.reshape({-1, latent.dim()});
    torch::Tensor ld = latent.log_det(flat).reshape({shape[0], shape[1]});
    res.draws = latent.to_ambient(flat).to(torch::kFloat64).reshape(shape);
    res.lp = res.lp.to(torch::kFloat64) - ld;
  }
  return res;
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

namespace {
TransportRun run_with_flow(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress);
TransportRun run_with_auto(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress);
}  // namespace

TransportRun run_with_transport(Target& target, Kernel& kernel, const RunOptions& options,
                                const TransportOptions& t, uint64_t seed, const ProgressFn& progress) {
  if (t.kind == TransportKind::kAuto) return run_with_auto(target, kernel, options, t, seed, progress);
  return run_with_flow(target, kernel, options, t, seed, progress);
}

namespace {
/// The transport's options checked, and its rounds' lengths (Note [Transport warm-up]).
std::vector<int64_t> round_lengths(const RunOptions& options, const TransportOptions& t) {
  if (options.warmup < 100) {
    throw UsageError("--transport " + enum_name(t.kind) + " fits a flow during warm-up: give --warmup of at least 100 (got " +
                     std::to_string(options.warmup) + ")");
  }
  if (t.rounds < 1) throw UsageError("--transport-rounds must be at least 1");
  if (t.layers < 0) throw UsageError("--transport-layers must be non-negative");
  if (!(t.fit_fraction > 0 && t.fit_fraction < 1)) throw UsageError("the transport's fit fraction must be in (0, 1)");
  if (!options.keep_draws) throw UsageError("--transport " + enum_name(t.kind) + " keeps its draws (keep_draws)");
  // Round lengths: doubling, summing to fit_fraction of the warm-up; with two rounds or more the
  // first (the transient, which sets the affine base: Note [Transport warm-up]) lasts at least
  // kFirstRound iterations and the others share the rest, doubling. With train's 500-iteration
  // warm-up and 4 rounds the first round was 17 iterations: on kilpisjarvi (a correlation near
  // -1) the base fitted to its states put the next round at step sizes of 5e-4, and the learned
  // sampler's warm-up did not finish in 9 minutes; with 50 it finishes (438 s) and the sampler
  // still fails there (BENCHMARKS.md, "The learned proposal through the flow on posteriordb").
  constexpr int64_t kFirstRound = 50;
  const int64_t fit_iters = static_cast<int64_t>(std::lround(t.fit_fraction * options.warmup));
  std::vector<int64_t> lengths;
  if (t.rounds == 1) {
    lengths.push_back(std::max<int64_t>(10, fit_iters));
  } else {
    const int64_t first = std::max(kFirstRound, static_cast<int64_t>(std::lround(double(fit_iters) / double((int64_t{1} << t.rounds) - 1))));
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

TransportRun run_with_flow(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress) {
  if (t.kind != TransportKind::kFlow) throw UsageError("run_with_transport: transport must be flow");
  std::vector<int64_t> lengths = round_lengths(options, t);
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t d = target.dim();
  TransportRun out;
  out.flow = FlowTransport(FlowOptions().set_dim(d).set_layers(t.layers).set_hidden(t.hidden).set_mask_seed(seed));
  TransportedTarget latent(target, out.flow);
  // The first of two rounds or more runs where T is still the identity and only sets the affine
  // base (Note [Transport warm-up]): on the affine map alone, the same values without a pass
  // through the (identity) coupling layers' graph.
  TransportedTarget first_latent(target, FlowTransport(FlowOptions().set_dim(d).set_layers(0).set_mask_seed(seed)));
  TransportKernel rk(kernel, /*global_moves=*/false);  // global moves once the flow is fitted (Note [Transport warm-up])
  auto affine_estimate = [&](const torch::Tensor& x, const torch::Tensor& g, uint64_t fit_seed) {
    return nmcmc::affine_estimate(d, t.fit, x, g, seed, fit_seed);
  };

  const int64_t used = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  int64_t final_warmup = options.warmup - used;

  // Starting points in x (the inner target has the exact sampler, if any), then in z.
  torch::Tensor x_start;
  if (options.init_x.defined()) {
    x_start = options.init_x;
  } else {
    at::Generator gen = make_generator(seed ^ 0x7a3d5u);
    x_start = initial_positions(target, options.init, options.chains, gen);
  }

  int64_t grads = 0, energies = 0, offset = 0;
  int64_t extra_iterations = 0;  // Note [Far out twice]: the rounds' iterations beyond options.warmup
  bool restarted = false;
  bool abandoned = false;  // Note [Far out after the restart]
  double first_loss = 0;  // the first round's fit
  std::vector<torch::Tensor> pool_x, pool_g;
  torch::Tensor last_px, last_pg;  // the last fit's points (Note [The flow or its affine base])
  double last_loss = std::numeric_limits<double>::infinity();  // the last fit's held-out loss
  int64_t pool_rows = 0;
  json rounds = json::array();
  double fit_seconds = 0;
  // Progress over the whole warm-up: in the rounds every phase (their one draw included) is warm-up.
  bool in_rounds = true;
  auto warmup_progress = [&](const Progress& p) {
    if (!progress) return;
    Progress q = p;
    if (in_rounds || p.phase == "warmup") {
      q.phase = "warmup";
      q.iteration = offset + p.iteration;
      q.total = options.warmup + extra_iterations;
      q.elapsed = seconds_since(t_start);
    }
    progress(q);
  };
  bool fresh_base = true;  // the next fit estimates the base afresh: the first, and after a round that left the pool
  for (int64_t r = 0; r < t.rounds; ++r) {
    const bool affine_round = r == 0 && t.rounds >= 2;
    TransportedTarget& round_latent = affine_round ? first_latent : latent;
    RunOptions ro = options;
    // The rounds adapt the low-rank-plus-diagonal Fisher metric whatever the final metric: the
    // flow changes between rounds, and the metric from gradients finds a correlated latent
    // space's shape from a short round (Note [Transport warm-up]).
    if (options.metric != MetricAdapt::kUnit && kernel.has_dense_metric()) ro.metric = MetricAdapt::kFisherLowRank;
    ro.warmup = lengths[r];
    ro.draws = 1;
    ro.sink = nullptr;
    ro.init_x = round_latent.to_latent(x_start);
    rk.set_recording(true);
    SampleResult rr = run_sampler(round_latent, rk, ro, seed + 7919 * uint64_t(r + 1) + (restarted ? 104717 : 0), warmup_progress);
    rk.set_recording(false);
    auto [zs, gzs] = rk.take();
    if (!rr.complete) {
      out.result = rr;
      out.result.draws = torch::Tensor();
      return out;
    }
    offset += lengths[r];
    grads += rr.grads_warmup + rr.grads_sampling;
    energies += rr.energies_warmup + rr.energies_sampling;
    if (r == 0) {  // the transient from the starting points
      const int64_t rows = zs.size(0);
      zs = zs.slice(0, rows / 2);
      gzs = gzs.slice(0, rows / 2);
    }
    auto [xs, gxs] = round_latent.ambient_pairs(zs, gzs);
    pool_x.push_back(xs);
    pool_g.push_back(gxs);
    pool_rows += xs.size(0);
    while (pool_x.size() > 1 && pool_rows - pool_x.front().size(0) >= t.max_points) {
      pool_rows -= pool_x.front().size(0);
      pool_x.erase(pool_x.begin());
      pool_g.erase(pool_g.begin());
    }
    // The fit's points: the pool's, the most recent t.max_points of them.
    auto pool_points = [&] {
      torch::Tensor x = torch::cat(pool_x), g = torch::cat(pool_g);
      if (x.size(0) > t.max_points) {
        x = x.slice(0, x.size(0) - t.max_points);
        g = g.slice(0, g.size(0) - t.max_points);
      }
      return std::make_pair(x, g);
    };
    auto [px, pg] = pool_points();
    x_start = round_latent.to_ambient(rr.draws[rr.draws.size(0) - 1]);  // the chains' last positions, in x
    // Note [Transport warm-up]: with two rounds or more the first is the transient from the
    // starting points: its states set only the affine base (the Fisher estimate; no coupling
    // layer is fitted to them) and leave the pool; the coupling layers are fitted from the
    // second round on, whose chains run in that affine latent space. Fitted to transient states
    // far out in the tails (a time series whose states were 200 sds from its posterior), the
    // layers made a latent space in which NUTS needed step sizes 100x smaller.
    // Note [Transient states in the pool]
    // The pool holds every state since the second round, and a later fit is warm-started from
    // the last. Where the early rounds' states were still partly transient (not far enough out
    // to be flagged by Note [Transport warm-up]'s rule) they stay there: on posteriordb's earnings
    // (three parameters, nearly Gaussian, a correlation near -1) the base estimated afresh from
    // all the pool's states fitted them 164-17,000x worse (held-out Fisher loss) than the base
    // estimated from the last two rounds' states fitted theirs, at six seeds of ten; its
    // warm-started fits ended at 0.02-0.49 per coordinate and NUTS through the flow got 0.78x the
    // bulk-ESS per gradient of NUTS with the low-rank Fisher metric alone (ten seeds). So before
    // each fit from the fourth round on, both affine estimates are made (no Adam step; network
    // time only): where the whole pool's is more than kDriftRatio times worse than the recent
    // one's, the older rounds leave the pool and the fit starts afresh from the last two rounds
    // (base estimated, layers from the identity): earnings 0.379 -> 0.417 bulk-ESS per gradient
    // (median of ten seeds); it also acted on the worst seeds of kidiq's interaction (0.236 ->
    // 0.431, ratio 5,033) and the mixture (0.231 -> 0.533, 0.161 -> 0.322; 472 and 627). The
    // threshold is set from measurements, with a narrow margin: on sblrc the ratio reached 14-91
    // at nine seeds of ten, and acting there at 10 cost it 0.258 -> 0.218 (a fresh fit loses what
    // the warm-started fits had learned); at 100 it acts on one (155: 0.256 -> 0.200). On
    // Funnel-3 it stayed at 2.9 or below (six seeds: their runs are bitwise unchanged, as are
    // Funnel-1's). The summary's rounds record both losses (`drift`) and `dropped_rounds` where
    // it acted. Dropping the older rounds always (a pool of the last two), or the second round's
    // states after the fourth, moved Funnel-3's neck (BENCHMARKS.md "Far out twice; ten seeds").

    constexpr double kDriftRatio = 100.0;
    json drift;
    if (!affine_round && t.layers > 0 && pool_x.size() >= 3) {
      const size_t k = pool_x.size();
      torch::Tensor rx = torch::cat({pool_x[k - 2], pool_x[k - 1]}), rg = torch::cat({pool_g[k - 2], pool_g[k - 1]});
      const FitReport fa_all = affine_estimate(px, pg, seed + uint64_t(r)).second;
      const FitReport fa_recent = affine_estimate(rx, rg, seed + uint64_t(r)).second;
      fit_seconds += fa_all.seconds + fa_recent.seconds;
      drift = {{"affine_all", fa_all.loss_end}, {"affine_recent", fa_recent.loss_end}};
      if (fa_all.loss_end > kDriftRatio * fa_recent.loss_end) {
        drift["dropped_rounds"] = int64_t(k - 2);
        pool_x.erase(pool_x.begin(), pool_x.end() - 2);
        pool_g.erase(pool_g.begin(), pool_g.end() - 2);
        pool_rows = rx.size(0);
        std::tie(px, pg) = pool_points();
        fresh_base = true;
        out.flow->reset_layers();
      }
    }
    FitOptions f = t.fit;
    f.init_base = fresh_base;
    if (affine_round) f.steps = 0;
    f.seed = seed + uint64_t(r);
    if (progress) {
      // Progress phase "fit": iteration = the fit's step, accept = its held-out Fisher loss.
      const auto t_fit = std::chrono::steady_clock::now();
      f.progress = [&, t_fit](int64_t step, int64_t steps, double loss) {
        Progress q;
        q.phase = "fit";
        q.iteration = step;
        q.total = steps;
        q.accept = loss;
        q.elapsed = seconds_since(t_fit);
        progress(q);
      };
    }
    FitReport fr = fit_transport(*out.flow, px, pg, f);
    last_px = px;
    last_pg = pg;
    last_loss = fr.loss_end;
    fit_seconds += fr.seconds;
    // Note [Transport warm-up]: a later round (not the last) whose fit's held-out loss is still
    // above kTransientLoss per coordinate ran in the transient too: its coupling layers are
    // dropped, the base is estimated from its states alone, its states leave the pool, and the
    // next fit estimates the base afresh.
    const bool transient = !affine_round && r + 1 < t.rounds && !(fr.loss_end <= kTransientLoss);
    if (transient) {
      out.flow->reset_layers();
      if (xs.size(0) >= 8) {
        FitOptions fb = t.fit;
        fb.steps = 0;
        fb.init_base = true;
        fb.progress = nullptr;
        fit_transport(*out.flow, xs, gxs, fb);
      }
    }
    fresh_base = affine_round || transient;
    if (fresh_base) {
      pool_x.clear();
      pool_g.clear();
      pool_rows = 0;
    }
    rounds.push_back({{"iterations", lengths[r]},
                      {"step_size", rr.step_size},
                      {"grads_per_chain", rr.grads_warmup + rr.grads_sampling},
                      {"fit", to_json_value(fr)},
                      {"transient", transient}});
    if (!drift.is_null()) rounds.back()["drift"] = drift;
    if (affine_round) first_loss = fr.loss_end;
    // Note [Far out twice]
    // The first round (50 iterations from the starting box) is the transient, and a later round
    // in the transient is dropped (Note [Transport warm-up]); the chains usually arrive within
    // a round or two. Where the first two fits both end far out (above kFarOutLoss per
    // coordinate), they are not arriving: the base fitted from far-out states makes a latent
    // space in which they stay. On posteriordb's kilpisjarvi with 16 chains (a correlation near
    // -1; 4 chains arrive) every fit of the six rounds ended at the clip (10^4), NUTS ran at step
    // sizes of 1.3-11 on a flat ridge and the run ended with R-hat 1.17 after 149 s of warm-up;
    // NUTS alone from the same box arrives in 200 iterations with its own metric adaptation (R-hat
    // 1.007 over 200 draws; 100 are too few). So the rounds start again, once, with a first round
    // of `arrival_round` iterations in x and a fresh base, from new points in the starting box
    // (where the caller gave the starting points, from where the chains are); the abandoned rounds
    // count as warm-up (the warm-up runs that many iterations longer) and stay in the record
    // (`restarted`). On kilpisjarvi with 16 chains: R-hat 1.001, 58 s of warm-up; restarted from
    // where the chains were, the 200-iteration round still ended far out (R-hat 1.002, 111 s). In
    // the posteriordb suite with 4 chains (seeds 1-3) two runs of 39 had two far-out fits, and
    // their later rounds had arrived after two or three transient rounds: restarted, kidiq's
    // interaction got 0.323 bulk-ESS per gradient (0.367 before), kilpisjarvi 0.469 (0.392).
    if (r == 1 && t.arrival_round > 0 && !restarted && !(first_loss <= kFarOutLoss) && !(fr.loss_end <= kFarOutLoss)) {
      restarted = true;
      rounds.back()["restarted_after"] = true;
      out.flow->reset_layers();
      pool_x.clear();
      pool_g.clear();
      pool_rows = 0;
      fresh_base = true;
      extra_iterations += lengths[1] + t.arrival_round;  // rounds 0 and 1 ran, then round 0 at its new length
      lengths[0] = t.arrival_round;
      if (!options.init_x.defined()) {  // from the box again, fresh points
        at::Generator gen = make_generator(seed ^ 0x5e3c1u);
        x_start = initial_positions(target, options.init, options.chains, gen);
      }
      r = -1;  // the loop's ++r: round 0 again, in x
      continue;
    }
    // Note [Far out after the restart]
    // On kilpisjarvi with 16 chains the restarted first round (200 iterations in x) still ended
    // far out on one CPU (an Intel Xeon; on an AMD EPYC it arrived: Note [Far out twice]), every
    // later fit ended at the clip, and the run ended with R-hat 1.16 after 169 s of warm-up,
    // where NUTS with the low-rank Fisher metric alone passes from the box with 300 warm-up
    // iterations (R-hat 1.002, 2 s). The fits cannot help where they see no posterior: after a
    // restart whose first round still ends far out the transport is given up, and the rest of
    // the warm-up (the rounds not run included) runs as a run without transport would, on the
    // target itself from the starting points, adapting the metric the rounds adapt
    // (`transport.choice.chosen`: none). Continued from where the chains were, with the rounds'
    // metric, the same warm-up ended at R-hat 1.31 in float32 (648 divergences; 0.042 bulk-ESS per
    // gradient in float64): far-out chains given as starting points are never redrawn.
    if (t.give_up_far_out && restarted && affine_round && !(fr.loss_end <= kFarOutLoss)) {
      abandoned = true;
      for (int64_t k = r + 1; k < t.rounds; ++k) final_warmup += lengths[k];
      break;
    }
    if (affine_round && t.far_out_loss > 0 && !(fr.loss_end <= t.far_out_loss)) {
      // The chains have not arrived: the caller starts again elsewhere (TransportOptions::far_out_loss).
      out.far_out = true;
      out.result = rr;
      out.result.draws = torch::Tensor();
      out.result.grads_warmup = grads;
      out.result.grads_sampling = 0;
      out.result.energies_warmup = energies;
      out.result.energies_sampling = 0;
      out.result.seconds_warmup = seconds_since(t_start);
      out.result.seconds_sampling = 0;
      out.report = {{"kind", t.kind}, {"layers", t.layers}, {"rounds", rounds}, {"fit_seconds", fit_seconds}, {"far_out", true}};
      return out;
    }
  }

  rk.set_global_moves(t.global_moves);  // the fits are done: the flow is what the trials and the sampling use
  // Note [The flow or its affine base]
  // The Fisher loss is not what NUTS pays. On posteriordb's kilpisjarvi (three parameters, a
  // correlation near -1, nearly Gaussian) the coupling layers cut the held-out loss 4x against
  // the affine base alone and yet NUTS through the flow got 0.026 bulk-ESS per gradient, through
  // the affine base alone (`--transport-layers 0`) 0.36 (seed 1; NUTS with fisher-lowrank and no
  // transport: 0.30-0.41). So after the rounds two candidates are tried with the kernel, each for
  // kTrialWarmup iterations of warm-up (step size and, as in the rounds, the low-rank Fisher
  // metric) and kTrialDraws draws, from the same positions: the fitted flow, and the affine map
  // alone with its base estimated afresh from the last fit's points (the low-rank-plus-diagonal
  // Fisher estimate, as the first rounds set it). The cheaper goes on: NUTS's gradients per draw
  // (a latent space that is far from N(0, I) needs smaller steps and longer trees), or for the
  // kernels with a fixed number of gradients per step the inverse of the adapted step size. The
  // affine map goes on only when it costs at most kAffineIfBelow of the flow's: the trials see
  // the cost of a draw, not how well draws mix, and where the flow helps by mixing (eight
  // schools: 2.7x the bulk-ESS per gradient) the two cost the same per draw (6.25 and 6.4
  // gradients at seed 1), while on kilpisjarvi the flow's draws cost twice the affine's (7.4 and
  // 3.7). Each trial also records how far its draws move per gradient (`score`: the worst
  // coordinate's mean squared jump between consecutive draws in x, over its variance among the
  // last fit's points, per gradient). Choosing by that score instead was tried (f24abeb, the
  // flow kept at 1.25x the affine map's score) and measured on 13 posteriors: it kept the affine
  // map on six, and where the two rules differ the cost rule did as well or better on four of four
  // in the same session (low_dim_gauss_mix 0.284 bulk-ESS per gradient through the flow against
  // 0.188 through the affine map, whose 20 trial draws had moved farther; earnings 0.477 against
  // 0.390): 20 draws' lag-one jumps do not rank two latent spaces by their ESS (BENCHMARKS.md,
  // "Choosing the flow by how far its draws move"). Both
  // trials come out of the final warm-up (their gradients and seconds are warm-up's; they run
  // when at least 100 iterations of it remain: the learned sampler's 500-iteration transport
  // warm-up leaves 130), and the final warm-up starts where the chosen trial ended.
  constexpr int64_t kTrialWarmup = 40, kTrialDraws = 20;
  constexpr double kAffineIfBelow = 0.75;
  json choice = {{"chosen", "flow"}};
  std::optional<TransportedTarget> affine_latent;
  if (abandoned) {
    out.flow = FlowTransport(FlowOptions().set_dim(d).set_layers(0).set_mask_seed(seed));  // the identity
    affine_latent.emplace(target, out.flow);
    choice = {{"chosen", "none"}, {"why", "the restarted first round still ended far out (Note [Far out after the restart])"}};
  } else if (t.layers > 0 && t.rounds >= 2 && final_warmup - 2 * (kTrialWarmup + kTrialDraws) >= 100) {
    const auto [affine, affine_fit] = affine_estimate(last_px, last_pg, seed + 7);
    struct Trial {
      double cost = 0, score = 0, step_size = 0, grads_per_draw = 0;
      int64_t worst = 0;  // the coordinate with the smallest scaled jump
      int64_t divergent = 0;  // divergent transitions among the trial's draws
      torch::Tensor x_end;
      bool complete = false;
    };
    const bool per_chain = kernel.max_tree_depth() > 0;  // NUTS: gradients per draw vary
    // One scale per coordinate for both trials' scores: the variance among the last fit's points.
    const torch::Tensor scale = last_px.to(torch::kFloat64).var(0, /*unbiased=*/true).clamp_min(1e-300);
    auto trial = [&](TransportedTarget& lt, uint64_t s) {
      RunOptions ro = options;
      if (options.metric != MetricAdapt::kUnit && kernel.has_dense_metric()) ro.metric = MetricAdapt::kFisherLowRank;
      ro.warmup = kTrialWarmup;
      ro.draws = kTrialDraws;
      ro.sink = nullptr;
      ro.init_x = lt.to_latent(x_start);
      SampleResult rr = run_sampler(lt, rk, ro, s, warmup_progress);
      Trial tr;
      tr.complete = rr.complete;
      if (!rr.complete) return tr;
      offset += kTrialWarmup + kTrialDraws;
      grads += rr.grads_warmup + rr.grads_sampling;
      energies += rr.energies_warmup + rr.energies_sampling;
      tr.step_size = rr.step_size;
      if (rr.divergent.defined()) tr.divergent = rr.divergent.sum().item<int64_t>();
      tr.grads_per_draw = double(rr.grads_sampling) / double(kTrialDraws);
      tr.cost = per_chain ? tr.grads_per_draw : 1.0 / std::max(rr.step_size, 1e-300);
      if (!std::isfinite(tr.cost)) tr.cost = std::numeric_limits<double>::infinity();
      // The draws in x [S, C, D]; squared jumps between consecutive draws, per coordinate.
      const int64_t n = rr.draws.size(0), c = rr.draws.size(1);
      const torch::Tensor x = lt.to_ambient(rr.draws.reshape({n * c, d})).to(torch::kFloat64).reshape({n, c, d});
      const torch::Tensor jump = (x.narrow(0, 1, n - 1) - x.narrow(0, 0, n - 1)).pow(2).mean(std::vector<int64_t>{0, 1}) / scale;  // [D]
      const auto [worst, at] = jump.min(0);
      tr.worst = at.item<int64_t>();
      tr.score = worst.item<double>() / std::max(tr.grads_per_draw, 1e-300);
      if (!std::isfinite(tr.score)) tr.score = 0;
      tr.x_end = lt.to_ambient(rr.draws[n - 1]);  // the last draws mapped as before (one batch of C rows): the same bits
      return tr;
    };
    const Trial with_flow = trial(latent, seed + 104729);
    if (!with_flow.complete) {
      out.result.complete = false;
      return out;
    }
    affine_latent.emplace(target, affine);
    const Trial with_affine = trial(*affine_latent, seed + 104723);
    if (!with_affine.complete) {
      out.result.complete = false;
      return out;
    }
    const bool use_affine = with_affine.cost <= kAffineIfBelow * with_flow.cost;
    auto record = [](const Trial& tr) {
      return json{{"cost", tr.cost}, {"score", tr.score}, {"worst_coordinate", tr.worst}, {"step_size", tr.step_size},
                  {"grads_per_draw", tr.grads_per_draw}, {"divergent", tr.divergent}};
    };
    choice = {{"chosen", use_affine ? "affine" : "flow"},
              {"cost", per_chain ? "gradients per draw" : "1 / step size"},
              {"affine_if_below", kAffineIfBelow},
              {"score", "recorded, not used: min over coordinates of the mean squared jump / the fit points' variance, "
                        "per gradient"},
              {"flow", record(with_flow)},
              {"affine", record(with_affine)},
              {"iterations", 2 * (kTrialWarmup + kTrialDraws)},
              {"affine_loss", affine_fit.loss_end}};
    final_warmup -= 2 * (kTrialWarmup + kTrialDraws);
    if (use_affine) {
      out.flow = affine;
      x_start = with_affine.x_end;
    } else {
      affine_latent.reset();
      x_start = with_flow.x_end;
    }
  } else if (t.layers > 0) {
    choice["not_tried"] = "the warm-up is too short for the trials (or one round only)";
  }
  TransportedTarget& final_latent = affine_latent ? *affine_latent : latent;

  RunOptions fo = options;
  fo.warmup = final_warmup;
  // Note [A linear residual in the latent space]
  std::optional<LatentResidual> residual;
  if (!affine_latent && t.layers > 0 && last_px.defined() && options.metric == MetricAdapt::kDiag &&
      kernel.has_dense_metric() && last_loss > t.fit.tolerance) {
    residual = latent_residual(latent, last_px, last_pg, seed + 11);
    choice["latent_residual"] = {{"flow_loss", residual->flow_loss}, {"affine_loss", residual->affine_loss},
                                 {"ratio", residual->ratio()}};
  }
  if (abandoned && options.metric == MetricAdapt::kDiag && kernel.has_dense_metric()) {
    // Note [Far out after the restart]: the metric the rounds adapt, on the target itself.
    fo.metric = MetricAdapt::kFisherLowRank;
    choice["final_metric"] = "fisher-lowrank (no transport: the metric the rounds adapt)";
  } else if (affine_latent && options.metric == MetricAdapt::kDiag && kernel.has_dense_metric()) {
    // Note [The flow or its affine base]: with the affine map kept, a diagonal metric in its latent
    // space cannot correct what its base (the last fit's pool) missed. On posteriordb's earnings at
    // seed 2 (fd020cd; rounds 4-6 ended at held-out losses of 0.83, 0.88 and 0.49, the pool partly
    // transient) the affine map won the trials and NUTS's diagonal metric in its latent space got
    // 0.041 bulk-ESS per gradient, NUTS with fisher-lowrank and no transport 0.48; the low-rank
    // Fisher metric there (as the rounds and trials adapt it) got 0.527. Over the five runs of 39
    // that kept the affine map: 0.041 -> 0.527, 0.340 -> 0.390, 0.256 -> 0.239, 0.195 -> 0.183,
    // 0.290 -> 0.209 (BENCHMARKS.md "The fit's own gradient"). Through the flow the diagonal metric
    // stays: there the low-rank one left Funnel-3's neck under-sampled.
    fo.metric = MetricAdapt::kFisherLowRank;
    choice["final_metric"] = "fisher-lowrank (the affine map kept: a diagonal metric cannot correct its base)";
  } else if (!affine_latent && t.layers > 0 && options.metric == MetricAdapt::kDiag && kernel.has_dense_metric() &&
             last_loss <= t.fit.tolerance) {
    // Note [The final metric through the flow]: the low-rank Fisher metric estimates the latent
    // covariance from gradients, which is sound where the latent space is Gaussian (for N(m, S)
    // the gradients' covariance is S^-1) and biased where it is not: on Funnel-3 (the last fit's
    // held-out loss 0.016-0.033 per coordinate) it under-sampled the neck (x1's sd 3.0-4.6 MCSE
    // low on four seeds of six) where the diagonal metric passed six of six. Where the last fit
    // reached its tolerance the latent space is Gaussian to it, and the diagonal metric leaves
    // the correlations the flow did not remove: posteriordb's kidiq interaction and mixture, 0.76x
    // and 0.83x the best NUTS per gradient with it (BENCHMARKS.md "The final metric through the flow").
    fo.metric = MetricAdapt::kFisherLowRank;
    choice["final_metric"] = "fisher-lowrank (the last fit reached its tolerance: the latent space is Gaussian to it)";
  } else if (residual && residual->ratio() >= kLinearResidualRatio) {
    // Note [A linear residual in the latent space]
    // Where the last fit did not reach its tolerance, what it left can be linear: a warm-started
    // fit moves a stale affine base slowly (posteriordb's earnings, a correlation near -1: last
    // fits at 0.014-0.03 per coordinate where the affine map estimated afresh reaches 0.003). The
    // last fit's points, pulled back into the latent space (no target gradient), tell: an affine
    // map estimated from them fits them kLinearResidualRatio times better than N(0, I) does only
    // where the residual is linear - the latent space is Gaussian up to an affine map, and the
    // low-rank Fisher metric (the same estimate, adapted over the final warm-up) is sound there.
    // On Funnel-3 the ratio was 0.89-1.00 at six seeds (a funnel is not linear), and those runs
    // keep the diagonal metric, bitwise as before. Measured (BENCHMARKS.md "A linear residual in
    // the latent space"): earnings over 20 seeds 0.94x -> 1.00x NUTS with fisher-lowrank per seed
    // (it acted on 8; 5 faster, 3 slower), kilpisjarvi on 3 of 10 (all faster): level, not clearly ahead.
    fo.metric = MetricAdapt::kFisherLowRank;
    choice["final_metric"] = "fisher-lowrank (an affine map fits the latent points " + fmt::format("{:.3g}", residual->ratio()) +
                             "x better than N(0, I): the latent space is Gaussian up to it)";
  }
  if (abandoned) {
    // Note [Far out after the restart]: as a run without transport starts - the caller's starting
    // points or the starting box (where stuck chains are redrawn: Note [Starting points that cannot
    // move]), a unit metric - so that the rounds' far-out positions and metric leave nothing behind.
    fo.init_x = options.init_x;
    if (kernel.has_metric()) rk.set_metric(Metric());
  } else {
    fo.init_x = final_latent.to_latent(x_start);
  }
  rk.reset_global();
  const double seconds_before = seconds_since(t_start);
  in_rounds = false;
  SampleResult res = run_mapped(final_latent, rk, fo, seed, warmup_progress);
  res.grads_warmup += grads;
  res.energies_warmup += energies;
  res.seconds_warmup += seconds_before;
  out.result = std::move(res);
  out.report = {{"kind", t.kind},
                {"layers", t.layers},
                {"hidden", t.hidden},
                {"rounds", rounds},
                {"fit_seconds", fit_seconds},
                {"global_moves", t.global_moves},
                {"metric_space", "latent"},
                {"choice", choice}};
  if (restarted) {
    out.report["restarted"] = {{"why", "the first two fits ended far out (Note [Far out twice])"},
                               {"first_round", t.arrival_round},
                               {"warmup_iterations", options.warmup + extra_iterations}};
  }
  if (t.global_moves) out.report["global_accept"] = rk.global_accept();
  return out;
}

/// Note [Choosing the transport], sampling: a run without a transport that watches its warm-up,
/// and goes on into sampling, or gives way to the flow's run.
TransportRun run_with_auto(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                           uint64_t seed, const ProgressFn& progress) {
  TransportOptions flow_options = t;
  flow_options.kind = TransportKind::kFlow;
  round_lengths(options, flow_options);  // the flow's run must be possible before the first step
  // The first quarter of the warm-up (at least 100 iterations) is watched; the states of its
  // second half, newest last (positions and energy gradients [C, D] per iteration, at most
  // kFisherRows rows in all), decide at its end.
  const int64_t decide_at = std::min(options.warmup, std::max<int64_t>(kAutoWatchMin, options.warmup / 4));
  const int64_t keep_iterations = (kFisherRows + options.chains - 1) / options.chains;
  std::deque<std::pair<torch::Tensor, torch::Tensor>> seen;
  double fisher = std::numeric_limits<double>::quiet_NaN();
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
      if (x.size(0) > kFisherRows) {
        x = x.narrow(0, x.size(0) - kFisherRows, kFisherRows);
        g = g.narrow(0, g.size(0) - kFisherRows, kFisherRows);
      }
      rows = x.size(0);
      fisher = gaussian_fisher_per_dim(x, g);
    }
    seen.clear();
    flow = fisher > kFlowFisherPerDim;  // NaN (not measured): no transport
    return !flow;
  };
  const double step_size_given = kernel.step_size();
  SampleResult first = run_sampler(target, kernel, watched, seed, progress);
  json record = {{"fisher_per_dim", std::isfinite(fisher) ? json(fisher) : json(nullptr)},
                 {"threshold", kFlowFisherPerDim},
                 {"rows", rows},
                 {"decided_after", decide_at},
                 {"chose", flow ? "flow" : "none"}};
  if (!std::isfinite(fisher) && first.complete) {
    record["why"] = "not measured: the warm-up's draws span fewer than D directions (or fewer than D + 1 finite rows)";
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
  // metric starts the rounds worse than the first round's own (BENCHMARKS.md, "Handing the watched
  // quarter over"). Not kept.
  if (kernel.has_tunable_step_size()) kernel.set_step_size(step_size_given);
  if (kernel.has_metric()) kernel.set_metric(Metric());
  out = run_with_flow(target, kernel, options, flow_options, seed, progress);
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
