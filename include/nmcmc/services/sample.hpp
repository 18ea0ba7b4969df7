#pragma once
/// The sampling service: `nmcmc sample` and the Python package's nmcmc.sample. A request goes
/// down once: the target and kernel (kernels/factory.hpp, flows/checkpoint.hpp), the run
/// (kernels/run.hpp), the summary (diagnostics/summary.hpp) and the files (io/draws.hpp).
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "nmcmc/core/json.hpp"
#include "nmcmc/diagnostics/summary.hpp"
#include "nmcmc/flows/checkpoint.hpp"
#include "nmcmc/io/draws.hpp"
#include "nmcmc/kernels/factory.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/services/transport.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

/// Every option of a sampling run, defined once: `nmcmc sample` binds its flags to these fields and
/// the Python package's nmcmc.sample passes them as JSON (sample_options_from_json). Unset
/// optionals take the documented defaults.
struct SampleOptions {
  SamplerKind sampler = SamplerKind::kNuts;
  std::optional<std::string> model;    // checkpoint (learned)
  std::optional<std::string> metric;   // unit | diag | dense; unset: diag for nuts (as Stan), else unit
  bool adapt_mass = false;             // = metric diag (the older flag)
  std::optional<double> step_size;     // initial step size; unset: found at the start
  std::optional<double> target_accept; // of step-size adaptation; unset: per sampler
  bool no_adapt = false;               // keep step_size fixed during warm-up
  bool step_size_per_chain = false;    // NUTS: each chain adapts its own (RunOptions::step_size_per_chain)
  double jitter = 0;                   // HMC: per-chain step-size jitter
  int64_t leapfrog = 10;               // HMC: leapfrog steps
  int64_t max_depth = 10;              // NUTS: maximum tree depth
  int64_t chains = 4, warmup = 1000, draws = 1000;
  std::optional<int64_t> thin;         // steps per kept draw (Note [Thinning], kernels/run.cpp); unset:
                                       // 1, the learned sampler: learned_default_thin
  uint64_t seed = 1;
  std::string init = "auto";           // auto | uniform | exact | zero | buffer (the learned sampler's
                                       // own chains from its checkpoint); auto: buffer when the model
                                       // has one, else uniform
  std::optional<std::string> dtype;    // float32 | float64; unset: float32, the learned sampler: its model's
  std::string device = "cpu";          // cpu | cuda | cuda:N
  std::optional<MatmulOption> matmul;  // the learned sampler's GEMMs' precision; unset: the checkpoint's
                                       // model.matmul
  std::optional<GemmBackend> gemm;     // where they run; unset: the checkpoint's model.gemm
  std::optional<double> persistence;   // the learned sampler's base draw carried from step to step
                                       // (Note [Persistent noise], flows/learned.hpp); unset:
                                       // kDefaultPersistence; 0: fresh draws, the paper's sampler
  std::optional<Engine> engine;        // Note [Native copies]: every native copy the run meets (a
                                       // TorchScript target's evaluator, the learned step, the flow's
                                       // passes and fit); unset: each its own default (auto)
  std::optional<std::string> output;   // directory for the draws and summary.json
  std::string formats = "csv,netcdf";  // which draw files with output: csv, netcdf or csv,netcdf
  /// flow: run on the target pulled back through a flow fitted in warm-up (services/transport.hpp;
  /// Note [The transport's options]); its fits kDefaultTransportRounds unless set. The engine is
  /// `engine`'s where that is set.
  TransportChoice transport;
  /// Note [Warm starts] (kernels/warm_start.hpp): a previous run of the same model (the path of its
  /// output directory or summary.json, or its "adaptation" record): the chains start where it
  /// ended, with its step size and metric; the metric is re-estimated only when `metric` is given.
  /// null: none. nuts, hmc and mala, without a transport.
  nlohmann::json warm_start;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SampleOptions, sampler, model, metric, adapt_mass, step_size, target_accept,
                                                no_adapt, step_size_per_chain, jitter, leapfrog, max_depth, chains, warmup, draws, thin, seed, init,
                                                dtype, device, matmul, gemm, persistence, engine, output, formats, transport,
                                                warm_start)

// Note [The learned sampler's thinning]
// A learned step costs one gradient and moves a little; NUTS spends tens of gradients on a draw. A
// user asking for 1,000 draws of a trained model would otherwise get 1,000 steps - a few thousand
// gradients in all, far too short a chain for R-hat and the ESS to say anything on a posterior
// with a slow direction (irt_2pl's learned chains ended at R-hat 1.017 after 4 x 1,000 steps at
// 0.06 effective draws per gradient: about 60 effective draws a chain). Unless --thin is given,
// the learned sampler keeps every k-th step, k about half the steps per effective draw that its
// training's mixing check measured (its chains x draws over its least bulk-ESS, the slowest
// quantity's), at most kMaxLearnedThin: each kept draw then costs about half an effective draw's
// gradients, the chains are long enough to be judged, and about 92 % of the effective draws per
// gradient are kept (Note [Thinning]). A model without a check (trained before it existed, or
// for 0 steps) samples every step.
constexpr int64_t kMaxLearnedThin = 50;
/// The learned sampler's thin where --thin is not given, from its training's mixing check (the
/// checkpoint's "check" record; null or without ESS: 1).
int64_t learned_default_thin(const nlohmann::json& check);

/// SampleOptions from JSON: UsageError naming an unknown key or a value of the wrong type.
SampleOptions sample_options_from_json(const nlohmann::json& j);

/// A sampling run: the target (a spec; null with a model: the model's own target), its options,
/// and what only a program can give (starting points, the command line to record, a stop flag).
struct SampleRequest {
  nlohmann::json target;
  SampleOptions options;
  torch::Tensor init_x;                // explicit starting points (overrides options.init)
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
/// With a communicator of N processes (all call it together) the chains are shared out in blocks:
/// Note [Data parallelism], sampling: rank r runs chains [begin, end) = parallel::block_of(chains,
/// r, N) as the run `chains = end - begin, seed = seed + r` would (own warm-up and adaptation;
/// given or buffer starting points: the rows the whole run gives those chains) and streams their
/// Stan CSV files chain_K.csv (K the global numbers); then the draws are gathered and rank 0
/// writes the NetCDF file and summary.json over all chains. Non-root ranks return a null summary.
SampleOutcome sample(const SampleRequest& request, const ProgressFn& progress = nullptr,
                     std::shared_ptr<parallel::Communicator> comm = nullptr);

}  // namespace nmcmc
