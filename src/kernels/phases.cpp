// A warm-up in phases (Note [Warm-up in phases]) and a run on a transformed target mapped back.
#include "nmcmc/kernels/phases.hpp"

#include <memory>
#include <string>

#include "nmcmc/core/clock.hpp"
#include "nmcmc/core/errors.hpp"
#include "run_in_phases.hpp"

namespace nmcmc {

namespace {
const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);

/// Forwards the run's draws to `inner` mapped to x (draws x = T(y), lp = -U(x)).
class MappedSink : public DrawSink {
 public:
  MappedSink(DrawSink* inner, const TransformedTarget& latent) : inner_(inner), latent_(&latent) {}
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
      torch::Tensor y = result.draws.slice(0, done_, to);  // [s, C, D]
      const auto shape = y.sizes().vec();
      torch::Tensor flat = y.reshape({-1, shape[2]});
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
  const TransformedTarget* latent_;
  torch::Tensor draws_, lp_;
  int64_t done_ = 0;
};

/// A phase's run options: the run's, with the phase's length, metric and starting points.
RunOptions phase_options(const RunOptions& o, const WarmupPhase& ph) {
  RunOptions po = o;
  po.phases = nullptr;
  po.warmup = ph.iterations;
  po.metric = ph.metric;
  po.init_x = ph.init_x;
  if (!ph.sampling) {
    po.draws = ph.draws;
    po.sink = nullptr;
  }
  return po;
}

/// A result that ends in warm-up: its figures with every phase's counts, and no draws.
SampleResult ended_in_warmup(SampleResult r, int64_t grads, int64_t energies, double seconds) {
  r.draws = torch::Tensor();
  r.grads_warmup = grads;
  r.grads_sampling = 0;
  r.energies_warmup = energies;
  r.energies_sampling = 0;
  r.seconds_warmup = seconds;
  r.seconds_sampling = 0;
  return r;
}
}  // namespace

SampleResult run_mapped(TransformedTarget& latent, Kernel& kernel, const RunOptions& options, uint64_t seed,
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

SampleResult run_in_phases(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed,
                           const ProgressFn& progress) {
  PhaseAdapter& adapter = *o.phases;
  const Clock::time_point t_start = Clock::now();
  int64_t grads = 0, energies = 0;  // per chain, every phase before the last
  WarmupPhase ph = adapter.first();
  // Progress over the whole warm-up: every report of a phase before the last is warm-up.
  const ProgressFn phase_progress = [&](const Progress& p) {
    if (!progress) return;
    Progress q = p;
    if (!ph.sampling || p.phase == "warmup") {
      // a phase's draws after its warm-up (not the last phase's) go on from its warm-up's iterations
      const int64_t in_phase = ph.sampling || p.phase == "warmup" ? p.iteration : ph.iterations + p.iteration;
      q.phase = "warmup";
      q.iteration = adapter.iterations_before() + in_phase;
      q.total = adapter.iterations_planned();
      q.elapsed = seconds_since(t_start);
    }
    progress(q);
  };
  for (;;) {
    if (ph.target == nullptr || ph.target->dim() != target.dim()) {
      throw std::logic_error("run_in_phases: a phase's target must be the run's target pulled back");
    }
    const RunOptions po = phase_options(o, ph);
    if (ph.sampling) {
      const double before = seconds_since(t_start);
      SampleResult res = run_mapped(*ph.target, kernel, po, ph.seed, phase_progress);
      res.grads_warmup += grads;
      res.energies_warmup += energies;
      res.seconds_warmup += before;
      return res;
    }
    StepRecord steps;
    RunOptions recorded = po;
    recorded.steps = &steps;
    PhaseEnd end;
    end.result = run_sampler(*ph.target, kernel, recorded, ph.seed, phase_progress);
    grads += end.result.grads_warmup + end.result.grads_sampling;
    energies += end.result.energies_warmup + end.result.energies_sampling;
    if (!end.result.complete) return ended_in_warmup(std::move(end.result), grads, energies, seconds_since(t_start));
    if (!steps.x.empty()) {
      end.x = torch::cat(steps.x);
      end.grad = torch::cat(steps.grad);
    }
    std::optional<WarmupPhase> next = adapter.next(end);
    if (!next) return ended_in_warmup(std::move(end.result), grads, energies, seconds_since(t_start));
    ph = std::move(*next);
  }
}

}  // namespace nmcmc
