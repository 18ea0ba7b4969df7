// The phased warm-up of a transport (run_in_phases: each phase a run of its own in the space the
// adapter maps to, the last one sampling) and a run in a mapped space (run_mapped).
#include <optional>

#include "nmcmc/core/clock.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/run.hpp"
#include "local_run.hpp"
#include "transformed_draws.hpp"

namespace nmcmc {

namespace {
/// A phase's run options: the run's, with the phase's length, metric and starting points.
RunOptions phase_options(const RunOptions& o, const WarmupPhase& ph) {
  RunOptions po = o;
  po.warmup = ph.iterations;
  po.metric = ph.metric;
  po.init_x = ph.init_x;
  if (!ph.sampling) {
    po.draws = ph.draws;
    po.thin = 1;
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
  std::unique_ptr<TransformedSink> sink;
  if (options.sink) {
    sink = std::make_unique<TransformedSink>(options.sink, latent);
    fo.sink = sink.get();
  }
  SampleResult res = run_local(latent, kernel, fo, seed, progress);  // one process (run_sampler's without a communicator)
  map_to_inner(res, latent);
  return res;
}

SampleResult run_in_phases(Target& target, Kernel& kernel, const RunOptions& o, PhaseAdapter& adapter, uint64_t seed,
                           const ProgressFn& progress) {
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
    end.result = run_local(*ph.target, kernel, recorded, ph.seed, phase_progress);
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
