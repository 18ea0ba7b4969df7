// Runs on a target pulled back through a flow fitted during warm-up (Note [Transport warm-up]).
#include "nmcmc/services/transport.hpp"

#include <chrono>
#include <cmath>

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
}  // namespace

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

TransportRun run_with_transport(Target& target, Kernel& kernel, const RunOptions& options,
                                const TransportOptions& t, uint64_t seed, const ProgressFn& progress) {
  if (t.kind != TransportKind::kFlow) throw UsageError("run_with_transport: transport must be flow");
  if (options.warmup < 100) {
    throw UsageError("--transport flow fits the flow during warm-up: give --warmup of at least 100 (got " +
                     std::to_string(options.warmup) + ")");
  }
  if (t.rounds < 1) throw UsageError("--transport-rounds must be at least 1");
  if (t.layers < 0) throw UsageError("--transport-layers must be non-negative");
  if (!(t.fit_fraction > 0 && t.fit_fraction < 1)) throw UsageError("the transport's fit fraction must be in (0, 1)");
  if (!options.keep_draws) throw UsageError("--transport flow keeps its draws (keep_draws)");
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t d = target.dim();
  TransportRun out;
  out.flow = FlowTransport(FlowOptions().set_dim(d).set_layers(t.layers).set_hidden(t.hidden).set_mask_seed(seed));
  TransportedTarget latent(target, out.flow);
  TransportKernel rk(kernel, t.global_moves);

  // Round lengths: doubling, summing to fit_fraction of the warm-up.
  const int64_t fit_iters = static_cast<int64_t>(std::lround(t.fit_fraction * options.warmup));
  std::vector<int64_t> lengths;
  const double unit = double(fit_iters) / double((int64_t{1} << t.rounds) - 1);
  int64_t used = 0;
  for (int64_t r = 0; r < t.rounds; ++r) {
    const int64_t len = std::max<int64_t>(10, static_cast<int64_t>(std::lround(unit * double(int64_t{1} << r))));
    lengths.push_back(len);
    used += len;
  }
  const int64_t final_warmup = options.warmup - used;
  if (final_warmup < 20) throw UsageError("--warmup is too short for " + std::to_string(t.rounds) + " transport rounds");

  // Starting points in x (the inner target has the exact sampler, if any), then in z.
  torch::Tensor x_start;
  if (options.init_x.defined()) {
    x_start = options.init_x;
  } else {
    at::Generator gen = make_generator(seed ^ 0x7a3d5u);
    x_start = initial_positions(target, options.init, options.chains, gen);
  }

  int64_t grads = 0, energies = 0, offset = 0;
  std::vector<torch::Tensor> pool_x, pool_g;
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
      q.total = options.warmup;
      q.elapsed = seconds_since(t_start);
    }
    progress(q);
  };
  for (int64_t r = 0; r < t.rounds; ++r) {
    RunOptions ro = options;
    // The rounds adapt the low-rank-plus-diagonal Fisher metric whatever the final metric: the
    // flow changes between rounds, and the metric from gradients finds a correlated latent
    // space's shape from a short round (Note [Transport warm-up]).
    if (options.metric != MetricAdapt::kUnit && kernel.has_dense_metric()) ro.metric = MetricAdapt::kFisherLowRank;
    ro.warmup = lengths[r];
    ro.draws = 1;
    ro.sink = nullptr;
    ro.init_x = latent.to_latent(x_start);
    rk.set_recording(true);
    SampleResult rr = run_sampler(latent, rk, ro, seed + 7919 * uint64_t(r + 1), warmup_progress);
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
    auto [xs, gxs] = latent.ambient_pairs(zs, gzs);
    pool_x.push_back(xs);
    pool_g.push_back(gxs);
    pool_rows += xs.size(0);
    while (pool_x.size() > 1 && pool_rows - pool_x.front().size(0) >= t.max_points) {
      pool_rows -= pool_x.front().size(0);
      pool_x.erase(pool_x.begin());
      pool_g.erase(pool_g.begin());
    }
    torch::Tensor px = torch::cat(pool_x), pg = torch::cat(pool_g);
    if (px.size(0) > t.max_points) {
      px = px.slice(0, px.size(0) - t.max_points);
      pg = pg.slice(0, pg.size(0) - t.max_points);
    }
    x_start = latent.to_ambient(rr.draws[rr.draws.size(0) - 1]);  // the chains' last positions, in x
    // Note [Transport warm-up]: with two rounds or more the first is the transient from the
    // starting points: its states set only the affine base (the Fisher estimate; no coupling
    // layer is fitted to them) and leave the pool; the coupling layers are fitted from the
    // second round on, whose chains run in that affine latent space. Fitted to transient states
    // far out in the tails (a time series whose states were 200 sds from its posterior), the
    // layers made a latent space in which NUTS needed step sizes 100x smaller.
    const bool affine_round = r == 0 && t.rounds >= 2;
    FitOptions f = t.fit;
    f.init_base = r == 0 || (r == 1 && t.rounds >= 2);
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
    fit_seconds += fr.seconds;
    if (affine_round) {
      pool_x.clear();
      pool_g.clear();
      pool_rows = 0;
    }
    rounds.push_back({{"iterations", lengths[r]},
                      {"step_size", rr.step_size},
                      {"grads_per_chain", rr.grads_warmup + rr.grads_sampling},
                      {"fit", to_json_value(fr)}});
  }

  RunOptions fo = options;
  fo.warmup = final_warmup;
  fo.init_x = latent.to_latent(x_start);
  rk.reset_global();
  const double seconds_before = seconds_since(t_start);
  in_rounds = false;
  SampleResult res = run_mapped(latent, rk, fo, seed, warmup_progress);
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
                {"metric_space", "latent"}};
  if (t.global_moves) out.report["global_accept"] = rk.global_accept();
  return out;
}

}  // namespace nmcmc
