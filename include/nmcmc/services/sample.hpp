#pragma once
/// The sampling service: what `nmcmc sample`, the benchmarks and the examples call.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/io/stan_csv.hpp"
#include "nmcmc/kernels/proposal.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

/// How to build a baseline proposal or kernel.
struct ProposalOptions {
  std::string sampler = "hmc";  // rwm | mala | hmc | nuts
  std::optional<double> step_size;  // unset: find a reasonable one (Stan's heuristic)
  int64_t leapfrog = 10;
  double jitter = 0.0;  // HMC per-chain step-size jitter
  ProposalOptions& set_jitter(double j) { jitter = j; return *this; }
  ProposalOptions& set_sampler(std::string s) { sampler = std::move(s); return *this; }
  ProposalOptions& set_step_size(std::optional<double> e) { step_size = e; return *this; }
  int64_t max_depth = 10;  // NUTS tree-depth limit
  ProposalOptions& set_leapfrog(int64_t l) { leapfrog = l; return *this; }
  ProposalOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
};
/// Builds rwm / mala / hmc; throws UsageError for anything else.
std::shared_ptr<Proposal> make_baseline_proposal(const ProposalOptions& options);
/// A baseline kernel: NUTS for "nuts", else MetropolisHastings over make_baseline_proposal.
std::unique_ptr<Kernel> make_baseline_kernel(const ProposalOptions& options);
/// The default accept-rate target of a sampler (rwm 0.234, mala 0.574, hmc 0.8, others 0.8).
double default_target_accept(const std::string& sampler);

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

/// Run settings.
struct RunOptions {
  int64_t chains = 4;
  int64_t warmup = 1000;
  int64_t draws = 1000;
  /// Step-size adaptation (dual averaging). Unset: on exactly when the proposal has a tunable
  /// step size (a learned proposal's step size is learned, so its warm-up is burn-in only).
  /// Set to true for a proposal without one: run_sampler refuses with a UsageError.
  std::optional<bool> adapt_step;
  double target_accept = 0.8;
  bool adapt_mass = false;     // a mass matrix over Stan's windows (HMC, MALA, RWM, NUTS); refused
                               // for kernels without a metric
  bool dense_mass = false;     // with adapt_mass: a dense (covariance) rather than diagonal metric
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
  RunOptions& set_chains(int64_t c) { chains = c; return *this; }
  RunOptions& set_warmup(int64_t w) { warmup = w; return *this; }
  RunOptions& set_draws(int64_t d) { draws = d; return *this; }
  RunOptions& set_target_accept(double a) { target_accept = a; return *this; }
  RunOptions& set_adapt_step(bool b) { adapt_step = b; return *this; }
  RunOptions& set_adapt_mass(bool b) { adapt_mass = b; return *this; }
  RunOptions& set_dense_mass(bool b) { dense_mass = b; return *this; }
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
  torch::Tensor accept_stat;  // [S, C] float64
  torch::Tensor divergent;    // [S, C] bool
  torch::Tensor n_grad;       // [S] int64, gradient evaluations per chain per step (NUTS: the most of any chain)
  torch::Tensor n_grad_chain; // [S, C] int64, each chain's own count (kernels whose chains differ: NUTS)
  torch::Tensor tree_depth;   // [S, C] int64 (NUTS)
  torch::Tensor energy;       // [S, C] float64 Hamiltonian (NUTS)
  int64_t max_tree_depth = 0; // NUTS: the depth limit (hits are reported)
  double step_size = 0;
  torch::Tensor inv_mass;     // [D], [D, D] or undefined
  torch::Tensor step_size_chain;  // [C] when the chains were adapted apart (a sharded run), else undefined
  torch::Tensor inv_mass_chain;   // [C, D] or [C, D, D] likewise
  std::vector<std::string> names;  // the D parameter labels (parameter_labels(target))
  int64_t grads_warmup = 0, grads_sampling = 0;      // per chain (NUTS: the mean over chains, rounded)
  int64_t energies_warmup = 0, energies_sampling = 0;  // per chain
  double seconds_warmup = 0, seconds_sampling = 0;
  uint64_t seed = 0;
  bool complete = true;       // false: stopped early (should_stop); the tensors hold what was drawn
  int64_t draws_planned = 0;  // the draws per chain that were asked for
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

/// A trained learned sampler ready to run: its proposal, the target it was trained on, the
/// checkpoint's metadata and the tensor options to run it with.
struct LearnedRun {
  std::shared_ptr<Proposal> proposal;
  nlohmann::json target_spec;
  nlohmann::json meta;
  torch::TensorOptions options;
};
/// Loads the checkpoint at `model_path` (DataError if unreadable). A given `target_spec` must
/// describe the model's own target (UsageError otherwise). The model runs in `options`' dtype
/// when `dtype_given`, else in the dtype it was trained in; its networks multiply as `matmul`
/// says (auto | native | bfloat16) when given, else as its checkpoint says.
LearnedRun load_learned_run(const std::string& model_path, const std::optional<nlohmann::json>& target_spec,
                            torch::TensorOptions options, bool dtype_given,
                            const std::optional<std::string>& matmul = std::nullopt);

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
SampleResult run_sampler(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                         const ProgressFn& progress = nullptr);

/// Summary statistics of a run: per-parameter Stan summary, ESS per step/gradient/second,
/// accept rate, divergences, MSJD, and (when the target has reference moments) the paper's ESS.
/// The draws are read a block of parameters at a time, each block about `block_bytes` with its
/// temporaries (so disk-backed draws of any size are summarised within memory); `progress` hears
/// of each block (phase "summary", iteration = parameters done) when there is more than one.
nlohmann::json summarise(const SampleResult& result, Target& target, int64_t block_bytes = int64_t{256} << 20,
                         const ProgressFn& progress = nullptr);

/// The draw files a run writes: Stan CSV per chain, ArviZ InferenceData (NetCDF-4), or both.
struct OutputFormats {
  bool csv = true, netcdf = true;
};
/// Parses "csv", "netcdf", "csv,netcdf" (UsageError otherwise).
OutputFormats parse_formats(const std::string& text);

/// A sink writing the chosen formats into `directory` as the draws come: chain_K.csv (see
/// StanCsvStream) and inference_data.nc (see NetcdfStream). `training_log`: the learned
/// sampler's log rows (checkpoint meta "log"), written as a group of the NetCDF file.
std::unique_ptr<DrawSink> make_output_sink(const std::string& directory, const nlohmann::json& config,
                                           OutputFormats formats, const nlohmann::json& training_log = nullptr);

/// Writes summary.json into `directory` and, unless `draws_written` (a sink from
/// make_output_sink wrote them during the run), the draws in `formats`.
void write_run(const std::string& directory, const nlohmann::json& config, const SampleResult& result,
               const nlohmann::json& summary, bool draws_written = false, OutputFormats formats = {},
               const nlohmann::json& training_log = nullptr);

/// Chain k's draws of a result, for the Stan-CSV writers.
ChainDraws chain_draws(const SampleResult& result, int64_t chain);

/// Writes Stan-CSV rows per chain as they are drawn: chain_K.csv.part during the run (so an
/// interrupted or killed run keeps every row written), renamed to chain_K.csv at the end with the
/// timing trailer; a stopped run's files end with "# nmcmc: incomplete run: N of M draws".
class StanCsvStream : public DrawSink {
 public:
  /// `first_chain`: the number of chains before these (a sharded run's rank writes chain_K.csv
  /// for its own chains K = first_chain + 1, ...).
  StanCsvStream(std::string directory, nlohmann::json config, int64_t first_chain = 0);
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;

 private:
  std::string path(int64_t chain, bool part) const;
  std::string directory_;
  nlohmann::json config_;
  int64_t first_chain_ = 0;
  bool started_ = false;
};

/// Writes the draws as ArviZ InferenceData, inference_data.nc (see io/netcdf.hpp): posterior
/// and sample_stats (lp, acceptance_rate, step_size, diverging, n_steps = gradient evaluations
/// of the step; for NUTS also tree_depth and energy), the run's config as attributes, and for the
/// learned sampler its training log as group `nmcmc_training`. Written as inference_data.nc.part
/// and renamed at the end; a stopped run's file says complete = 0 and how many draws it has.
class NetcdfStream : public DrawSink {
 public:
  NetcdfStream(std::string directory, nlohmann::json config, nlohmann::json training_log = nullptr);
  ~NetcdfStream() override;
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;

 private:
  std::string directory_;
  nlohmann::json config_, training_log_;
  std::unique_ptr<class InferenceDataWriter> writer_;
};

}  // namespace nmcmc

namespace nmcmc {
/// A human-readable summary table of `summarise()`'s output: the first `rows` parameters and,
/// for larger D, the worst `rows` by bulk ESS; then the efficiency lines.
std::string format_summary(const nlohmann::json& summary, int64_t rows = 8);
}  // namespace nmcmc

namespace nmcmc {

/// Everything `nmcmc sample` (and the Python package's nmcmc.sample) asks for, as one request:
/// the sampler, its metric and settings, the run's size, where to write.
struct SampleRequest {
  nlohmann::json target;               // spec; null with a model: the model's own target
  std::string sampler = "hmc";         // rwm | mala | hmc | nuts | learned
  std::optional<std::string> model;    // checkpoint (learned)
  std::optional<std::string> metric;   // unit | diag | dense; unset: diag for nuts (as Stan), else unit
  bool adapt_mass = false;             // = metric diag (the older flag)
  std::optional<double> step_size, target_accept;
  bool no_adapt = false;               // keep step_size fixed during warm-up
  double jitter = 0;
  int64_t leapfrog = 10, max_depth = 10;
  int64_t chains = 4, warmup = 1000, draws = 1000;
  uint64_t seed = 1;
  std::string init = "auto";           // auto | uniform | exact | zero | buffer (the learned sampler's
                                       // own chains from its checkpoint); auto: buffer when the model
                                       // has one, else uniform
  torch::Tensor init_x;                // explicit starting points (overrides init)
  torch::TensorOptions options;        // dtype and device
  bool dtype_given = false;            // the learned sampler: else it runs in the dtype it was trained in
  std::optional<std::string> matmul;   // the learned sampler's GEMMs (auto | native | bfloat16); unset:
                                       // the checkpoint's model.matmul
  std::optional<std::string> output;   // directory for the draws and summary.json
  OutputFormats formats;               // which draw files (both by default)
  std::string command;                 // recorded in the outputs' config
  std::function<bool()> should_stop;   // polled between steps (Ctrl-C): the draws so far are kept
};

/// A finished request: the draws, their summary, the config written with them, the target.
struct SampleOutcome {
  SampleResult result;
  nlohmann::json summary;
  nlohmann::json config;
  std::shared_ptr<Target> target;
};

/// Validates the request (UsageError), builds the target and kernel, runs, summarises and, with
/// an output directory (checked before the run), writes it. Stopped early (should_stop), the
/// outcome's result.complete is false; what was drawn is summarised and written, marked
/// incomplete (summary.json "complete": false, "# complete = false" in every Stan-CSV); stopped
/// in warm-up, nothing is written and the summary is null.
/// run_sampler over the ranks of `comm` (all call it together): rank r runs its block of
/// options.chains (parallel::block_of) with seed + r, its own warm-up and adaptation, and its
/// options.sink; every rank returns all chains (stopped runs: the draws every rank has), with
/// step_size_chain and inv_mass_chain per chain. UsageError with fewer chains than ranks.
SampleResult run_sampler_sharded(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                                 const ProgressFn& progress, parallel::Communicator& comm);

/// With a communicator of N processes (all call it together) the chains are shared out in blocks
/// (sample_sharded).
SampleOutcome sample(const SampleRequest& request, const ProgressFn& progress = nullptr,
                     std::shared_ptr<parallel::Communicator> comm = nullptr);

/// Note [Data parallelism], sampling: rank r runs chains [begin, end) = parallel::block_of(chains,
/// r, N) as the run `chains = end - begin, seed = seed + r` would (own warm-up and adaptation;
/// given or buffer starting points: the rows the whole run gives those chains) and streams their
/// Stan CSV files chain_K.csv (K the global numbers); then the draws are gathered (every rank gets
/// them; stopped runs keep the draws all ranks have) and rank 0 writes inference_data.nc and
/// summary.json over all chains (result.step_size_chain and inv_mass_chain per chain). Non-root
/// ranks return a null summary. UsageError with fewer chains than processes.
SampleOutcome sample_sharded(const SampleRequest& request, const ProgressFn& progress, parallel::Communicator& comm);

}  // namespace nmcmc
