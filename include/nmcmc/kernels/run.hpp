#pragma once
/// A run of any kernel: starting points, warm-up (step size and metric adaptation, Stan's windows;
/// or in phases on targets pulled back through a transform adapted between them), sampling into
/// memory, a memory-mapped scratch file or a DrawSink, over one process or the ranks of a
/// communicator.
//
// Note [Warm-up in phases]
// A change of variables fitted during warm-up (the flow transport: Note [Transport warm-up],
// services/transport.hpp) is adapted as the metric is, from the chains' positions and energy
// gradients at the end of a stretch of warm-up; unlike the metric it changes the target the kernel
// runs on (U(T(y)) - log|det dT/dy|, a TransformedTarget). So such a warm-up runs in phases
// (run_in_phases). A phase is a stretch of warm-up on one TransformedTarget with its own random stream: its
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
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nmcmc/core/target.hpp"
#include "nmcmc/core/transform.hpp"
#include "nmcmc/kernels/kernel.hpp"
#include "nmcmc/parallel/communicator.hpp"

namespace nmcmc {

struct SampleResult;
/// Receives the draws while run_sampler runs, e.g. to write them to disk as they are drawn.
class DrawSink {
 public:
  virtual ~DrawSink() = default;
  /// Rows [from, to) of the result's per-draw tensors are final (called about every 2 s and at
  /// the end; the first call comes after the first draw, when the adaptation is known).
  virtual void append(const SampleResult& result, int64_t from, int64_t to) = 0;
  /// The run ended (result.complete false: it was stopped) and its timings are set.
  virtual void finish(const SampleResult& result) = 0;
};

/// Every step's positions and energy gradients, as the kernel carries them ([C, D] each, float64
/// on the CPU, in step order).
struct StepRecord {
  std::vector<torch::Tensor> x, grad;
};

/// Run settings.
struct RunOptions {
  int64_t chains = 4;
  int64_t warmup = 1000;
  int64_t draws = 1000;
  /// Note [Thinning]: each kept draw is the last of `thin` steps (sampling only; warm-up is in steps).
  int64_t thin = 1;
  /// Step-size adaptation (dual averaging). Unset: on exactly when the proposal has a tunable
  /// step size (a learned proposal's step size is learned, so its warm-up is burn-in only).
  /// Set to true for a proposal without one: run_sampler refuses with a UsageError.
  std::optional<bool> adapt_step;
  double target_accept = 0.8;
  /// Each chain adapts its own step size on its own accept statistic, as Stan, instead of one for
  /// every chain on their mean (Note [A step size per chain], kernels/adaptation.hpp; kernels without
  /// per-chain step sizes: one always).
  bool step_size_per_chain = false;
  /// The metric warm-up adapts over Stan's windows (HMC, MALA, RWM, NUTS; refused for kernels
  /// without a metric; dense and fisher-lowrank need has_dense_metric, the fisher ones the
  /// gradient): unit (none), diag, dense, fisher-diag, fisher-lowrank (kernels/metric.hpp).
  MetricAdapt metric = MetricAdapt::kUnit;
  bool keep_draws = true;      // store [S, C, D] draws (off for pure speed benchmarks)
  std::string init = "uniform";  // uniform (U(-2, 2), as Stan) | exact | zero
  torch::Tensor init_x;          // explicit starting points [C', D] (rows cycled); overrides `init`
  /// Polled between steps: true stops the run. In warm-up nothing is kept (UsageError-free:
  /// result.complete is false with no draws); in sampling the draws so far are kept.
  std::function<bool()> should_stop;
  /// Draws larger than this many bytes live in a memory-mapped scratch file (unlinked at once,
  /// so nothing is left behind) instead of RAM; the summary reads them a block of parameters at
  /// a time. 0: always in RAM.
  int64_t draws_in_memory_limit = int64_t{512} << 20;
  std::string scratch_directory;   // for that file (empty: the system's temporary directory)
  DrawSink* sink = nullptr;        // gets the draws as they come (needs keep_draws)
  /// Called after every warm-up iteration (its index) with the chains' state: positions x and
  /// energy gradients grad as the kernel carries them (one process; transport auto watches the
  /// warm-up's draws through it: Note [Choosing the transport]). false ends the run there,
  /// complete, with the warm-up's figures so far and no draws (nothing reaches the sink).
  std::function<bool(int64_t, const ChainState&)> warmup_observer;
  /// Every step's state (warm-up and sampling; this process's chains) is appended here; a
  /// UsageError for a kernel that computes no gradients. Not owned.
  StepRecord* steps = nullptr;
  RunOptions& set_chains(int64_t c) { chains = c; return *this; }
  RunOptions& set_warmup(int64_t w) { warmup = w; return *this; }
  RunOptions& set_draws(int64_t d) { draws = d; return *this; }
  RunOptions& set_thin(int64_t t) { thin = t; return *this; }
  RunOptions& set_target_accept(double a) { target_accept = a; return *this; }
  RunOptions& set_adapt_step(bool b) { adapt_step = b; return *this; }
  RunOptions& set_metric(MetricAdapt m) { metric = m; return *this; }
  /// Stan's diagonal metric (true) or none (false).
  RunOptions& set_adapt_mass(bool b) { metric = b ? MetricAdapt::kDiag : MetricAdapt::kUnit; return *this; }
  RunOptions& set_keep_draws(bool b) { keep_draws = b; return *this; }
  RunOptions& set_init(std::string s) { init = std::move(s); return *this; }
  RunOptions& set_init_x(torch::Tensor x) { init_x = std::move(x); return *this; }
};

/// Reported to the progress callback about every 0.25 s and at phase ends.
struct Progress {
  std::string phase;  // "warmup" | "sampling" | "summary" (iteration: parameters summarised)
  int64_t iteration = 0, total = 0;
  double accept = 0, step_size = 0, elapsed = 0;
};
using ProgressFn = std::function<void(const Progress&)>;

/// A finished run. Tensors are CPU; draws-shaped ones are [S, C, ...].
struct SampleResult {
  torch::Tensor draws;        // [S, C, D] float64 (undefined unless keep_draws)
  torch::Tensor lp;           // [S, C] float64 (-U)
  // Per draw; a thinned draw's figures cover every step behind it (Note [Thinning], kernels/run.cpp).
  torch::Tensor accept_stat;  // [S, C] float64 (thinned: the mean over the draw's steps)
  torch::Tensor divergent;    // [S, C] bool (thinned: any of the draw's steps)
  torch::Tensor n_grad;       // [S] int64, gradient evaluations per chain per draw (NUTS: the most of any chain)
  torch::Tensor n_grad_chain; // [S, C] int64, each chain's own count (kernels whose chains differ: NUTS)
  torch::Tensor tree_depth;   // [S, C] int64 (NUTS; thinned: the deepest of the draw's steps)
  torch::Tensor energy;       // [S, C] float64 Hamiltonian (NUTS)
  int64_t max_tree_depth = 0; // NUTS: the depth limit (hits are reported)
  double step_size = 0;
  torch::Tensor inv_mass;     // [D], [D, D] or undefined (a low-rank metric: its dense equivalent)
  std::string metric = "unit";  // the adapted metric's form: unit, diag, dense, low-rank
  int64_t metric_rank = 0;      // a low-rank metric's rank K
  int64_t chains_restarted = 0; // Note [Stuck chains in warm-up]: chains that restarted from a moving one
  int64_t chains_redrawn = 0;   // Note [Starting points that cannot move] (kernels/run.cpp): starting points drawn again
  torch::Tensor step_size_chain;  // [C] when the chains were adapted apart (each its own, or a sharded run), else undefined
  torch::Tensor inv_mass_chain;   // [C, D] or [C, D, D] likewise
  std::vector<std::string> names;  // the D parameter labels (parameter_labels(target))
  int64_t grads_warmup = 0, grads_sampling = 0;      // per chain (NUTS: the mean over chains, rounded)
  int64_t energies_warmup = 0, energies_sampling = 0;  // per chain
  /// The target's batched gradient calls in sampling (a call on any number of chains counts once;
  /// a sharded run: the mean over ranks): what the wall time pays for on a cheap target.
  int64_t batch_grads_sampling = 0;
  double seconds_warmup = 0, seconds_sampling = 0;
  uint64_t seed = 0;
  bool complete = true;       // false: stopped early (should_stop); the tensors hold what was drawn
  int64_t draws_planned = 0;  // the draws per chain that were asked for
  int64_t thin = 1;           // Note [Thinning]: steps per kept draw
};

/// Bytes of RAM a run needs beyond the target itself (the kernel's per-chain state and the
/// per-draw statistics; the draws when they stay in RAM), and of scratch disk for the draws.
struct RunFootprint {
  double memory_bytes = 0, disk_bytes = 0;
};
RunFootprint estimate_footprint(const RunOptions& options, int64_t dim, int64_t dtype_bytes);
/// UsageError when the footprint exceeds the memory available (/proc/meminfo) or the free space
/// of the scratch directory, with the numbers and what to change.
void check_footprint(const RunOptions& options, int64_t dim, int64_t dtype_bytes);

/// Initial positions [C, D] by the named scheme.
torch::Tensor initial_positions(Target& target, const std::string& scheme, int64_t chains, at::Generator& gen);
/// x0 with every row where the energy or its gradient is not finite drawn again by `scheme`
/// (uniform or exact; up to 100 times, as Stan); UsageError if any remains (or `scheme` is
/// neither, e.g. for given points).
torch::Tensor finite_starting_points(Target& target, torch::Tensor x0, const std::string& scheme, at::Generator& gen);
/// Stan's heuristic: doubles or halves eps until the mean accept probability crosses 0.5.
double find_reasonable_step_size(Target& target, Kernel& kernel, const ChainState& state, at::Generator& gen,
                                 double start);

/// Warm-up (adaptation) then sampling with `kernel` (MetropolisHastings over any proposal, or
/// Nuts) on `target`.
/// With a communicator of N processes (all call it together; nullptr or one process: this process
/// runs every chain) the chains are shared out (Note [Data parallelism]): rank r runs its block of
/// options.chains (parallel::block_of) with seed + r, its own warm-up and adaptation, and its
/// options.sink; every rank returns all chains (stopped runs: the draws every rank has), with
/// step_size_chain and inv_mass_chain per chain. UsageError with fewer chains than ranks.
SampleResult run_sampler(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                         const ProgressFn& progress = nullptr, parallel::Communicator* comm = nullptr);

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

/// Warm-up in phases, then sampling in the last (Note [Warm-up in phases]), in one process: `options`
/// as for run_sampler, each phase taking its length, metric, starting points and stream from its
/// WarmupPhase; `target` is the run's target (every phase's is it pulled back), and the result is
/// on it, every phase before the last counted as warm-up.
SampleResult run_in_phases(Target& target, Kernel& kernel, const RunOptions& options, PhaseAdapter& adapter,
                           uint64_t seed, const ProgressFn& progress = nullptr);

/// Runs `kernel` on a fixed transformed target (`options.init_x`, if given, on it) and returns
/// the result on the inner target: draws x = T(y), lp = -U(x); a sink in `options` gets the mapped
/// draws as they come.
SampleResult run_mapped(TransformedTarget& latent, Kernel& kernel, const RunOptions& options, uint64_t seed,
                        const ProgressFn& progress = nullptr);

}  // namespace nmcmc
