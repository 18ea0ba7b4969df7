#pragma once
/// A run whose warm-up adapts a change of variables: phases on targets pulled back through it,
/// and a strategy that updates it between them (Note [Warm-up in phases]).
//
// Note [Warm-up in phases]
// A change of variables fitted during warm-up (the flow transport: Note [Transport warm-up],
// services/transport.hpp) is adapted as the metric is, from the chains' positions and energy
// gradients at the end of a stretch of warm-up; unlike the metric it changes the target the kernel
// runs on (U(T(y)) - log|det dT/dy|, a TransformedTarget). So run_sampler runs such a warm-up in
// phases. A phase is a stretch of warm-up on one TransformedTarget with its own random stream: its
// starting points there, the kernel's state there, a step-size search and Stan's metric windows
// within its iterations, then a few steps with the kernel frozen (its draws). The run loop
// collects every step's positions and gradients as the kernel carries them (on the phase's
// target) and hands them, with the phase's figures and draws, to the run's PhaseAdapter: the
// strategy that fits the transform, and names the next phase or ends the run. The kernel's step
// size and metric carry from a phase into the next as the start of its search (the adapter may
// set them). The last phase samples on the transform the adapter kept; its draws are mapped back
// to the run's target, x = T(y) with lp = -U(x), as they are written (the sink) and in the result.
// Every phase before it is warm-up in the result (its gradients, energy evaluations and seconds,
// and the adapter's fits between phases): a run through a transport is accounted as any other.
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "nmcmc/core/transform.hpp"
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// One phase of a warm-up in phases (Note [Warm-up in phases]).
struct WarmupPhase {
  TransformedTarget* target = nullptr;  // where the chains run: the run's target pulled back (not owned)
  int64_t iterations = 0;               // warm-up iterations (Stan's metric windows within them)
  int64_t draws = 0;                    // steps with the kernel frozen after them (the last phase: RunOptions::draws)
  MetricAdapt metric = MetricAdapt::kUnit;  // adapted over the phase's windows (kUnit: none)
  uint64_t seed = 0;                    // the phase's random stream
  torch::Tensor init_x;                 // starting points on `target` [C', D]; undefined: RunOptions::init's scheme
  bool sampling = false;                // the last phase: it samples, and its draws are mapped back
};

/// What a phase left: its figures and draws ([draws, C, D] on its target), and every step's
/// positions and energy gradients ([n, D] each, step-major, float64 on the CPU).
struct PhaseEnd {
  SampleResult result;
  torch::Tensor x, grad;
};

/// The strategy that adapts the transform between phases (Note [Warm-up in phases]).
class PhaseAdapter {
 public:
  virtual ~PhaseAdapter() = default;
  /// The first phase (called once, as the run starts).
  virtual WarmupPhase first() = 0;
  /// A phase (not the last) ended complete: the next phase, or none, which ends the run there,
  /// complete, with no draws.
  virtual std::optional<WarmupPhase> next(PhaseEnd& ended) = 0;
  /// Progress: the warm-up's iterations before the phase now running, and in all as now planned.
  virtual int64_t iterations_before() const = 0;
  virtual int64_t iterations_planned() const = 0;
};

/// Runs `kernel` on a fixed transformed target (`options.init_x`, if given, on it) and returns
/// the result on the inner target: draws x = T(y), lp = -U(x); a sink in `options` gets the mapped
/// draws as they come.
SampleResult run_mapped(TransformedTarget& latent, Kernel& kernel, const RunOptions& options, uint64_t seed,
                        const ProgressFn& progress = nullptr);

}  // namespace nmcmc
