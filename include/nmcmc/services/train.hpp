#pragma once
/// The training service: what `nmcmc train` and `nmcmc reproduce` call.
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "nmcmc/io/config.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/kernels/warm_start.hpp"
#include "nmcmc/services/transport.hpp"
#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

/// A config's "transport" section (`nmcmc train --transport`; Note [The transport's options],
/// services/transport.hpp): train the learned proposal in the latent space of a flow fitted in the
/// warm-up (Note [Learned proposal in a flow's latent space], flows/checkpoint.hpp), the same flow
/// as `nmcmc sample`'s, fitted four times in training's shorter warm-up unless its rounds are set.
constexpr int64_t kTrainTransportRounds = 4;

/// A training configuration: configs/*.json hold {"name", "target", "model", "train", "dtype"}.
struct TrainConfig {
  std::string name;
  nlohmann::json target;
  LearnedOptions model;
  TrainOptions train;
  std::string dtype = "float32";
  TransportChoice transport;  // its numbers filled in with training's defaults by parse_train_config
  /// Note [Training from a previous model] (services/train_run.cpp): the checkpoint of a model
  /// trained on another data set of the same model to start from ("": none; config key "from").
  std::string from;
  nlohmann::json to_json() const;
};
/// Parses and validates a configuration (UsageError on bad values). A top-level "engine" (Note
/// [Native copies]) sets model.engine, transport.engine and a TorchScript target's.
TrainConfig parse_train_config(const nlohmann::json& j);

/// Note [Training budget]
/// What `nmcmc train --module M` and `nmcmc.train(target)` use without a config, defined once: the
/// Langevin variant (one gradient per step) with the affine preconditioner, learned, the faster
/// beta controller, and a budget sized to a user's posterior rather than the paper's GPU runs
/// (5,000 steps at batch 8,192): batch 64, at most 3,000 steps, stopping when the proposal
/// entropy has gained less than 0.01 nats per dimension over 200 steps, after at most 90 s of
/// training steps, or once more steps no longer pay for 10,000 effective draws (ess_goal: Note
/// [Training stops when it no longer pays], services/train_from.cpp). The preconditioner's
/// warm-up runs in float64 whatever the model's dtype (a float32 warm-up ended at step sizes 50x
/// smaller on correlated regressions; issue #35). The
/// networks' width is sized to the posterior (model.hidden 0: default_hidden(D) = clamp(4 D, 64,
/// 256)) instead of the paper's 256: on posteriordb's arK (D = 7) width 64 trained to its plateau
/// in 10.4 s instead of 43.6 s, and sampled at 0.555 bulk-ESS per gradient instead of 0.491 and
/// 2.5x the effective draws per second (the networks' GEMMs are most of a step's time). Batch 64
/// rather than 256: over posteriordb's 16 the same plateau in a median 2.2x less time (a step's
/// gradients cost 4x less where the target's gradient is dear: the mixture 95 s -> 30 s), the
/// sampler a median 0.95x per gradient. Patience 200 rather than 300: on eight
/// posteriordb posteriors at two seeds the same sampler (bulk-ESS per sampling gradient 0.99x by
/// the geometric mean, 0.73-1.42x pair by pair) after 0.75x the training time; 150 cost 0.90x
/// (down to 0.56x on nes) for 0.65x.
nlohmann::json default_train_config();
/// The networks' width for a D-dimensional posterior when a config gives model.hidden = 0.
int64_t default_hidden(int64_t dim);

/// Reads a training (or compare) config file: read_config_file, then the file names its target
/// spec holds (a TorchScript module) made relative to the file's directory (resolve_target_paths).
nlohmann::json read_train_config_file(const std::string& path);

/// Where the shipped configs live: the source tree's configs/, else the installed share/nmcmc/configs.
std::string configs_directory();

struct TrainProgress {
  std::string phase = "train";  // "precondition" (the warm-up: stats.step = iteration, accept, eps) | "fit" (a flow
                                // transport's fit: stats.step = its step, stats.loss = held-out loss) | "train"
  TrainStats stats;
  int64_t total = 0;
  double elapsed = 0;
};
using TrainProgressFn = std::function<void(const TrainProgress&)>;

/// A warm-up run's progress (run_sampler's) as training's phase "precondition": its step counts
/// the warm-up's iterations and then the draws'. The warm-up's own plan is the total where it
/// reports one (a transported warm-up whose fitting rounds start again plans more iterations than
/// `warmup`). Empty without `progress`.
ProgressFn precondition_progress(const TrainProgressFn& progress, int64_t warmup, int64_t draws);

struct TrainResult {
  int64_t steps = 0;
  double seconds = 0;        // wall time of this invocation
  int64_t grads = 0;         // target gradient evaluations per batch row, whole run
  bool interrupted = false;
  bool saved = true;         // false: interrupted in the preconditioner warm-up, nothing written
  std::vector<TrainStats> log;
  nlohmann::json preconditioner;  // the warm-up's record (checkpoint meta "preconditioner"), or null
  parallel::CommStats comm;       // this rank's collectives (distributed runs)
  int64_t shards = 1;             // shards per batch
  std::string stopped = "steps";  // why training ended: steps | plateau | time | cost | interrupted
  int64_t skipped = 0;            // steps skipped over the whole run (the gradient was not finite)
  int64_t bad_rows = 0;           // batch rows rejected for a non-finite energy or gradient, whole run
  nlohmann::json check;           // Note [The mixing check]: the short run after training (null: not run)
  nlohmann::json from;            // Note [Training from a previous model]: the model it started from (null: none)
  /// Note [Training stops when it no longer pays]: its probes (each with its gradients, seconds and
  /// the projection; empty when train.ess_goal is 0).
  nlohmann::json probes = nlohmann::json::array();
  /// The mixing checks run when the time limit was reached (Note [A long warm-up shortens
  /// training]): a failed one extended training by another max_seconds.
  nlohmann::json time_extensions = nlohmann::json::array();
};

/// Runs the warm-up of Note [Affine preconditioner] with the training options' precondition_*
/// settings and sets the model's m, L (and eps, with eps_from_warmup); seeds the trainer's buffer
/// with its draws. Returns its record: sampler, chains, iterations, grads (all chains), seconds,
/// step_size, fisher_per_dim (Note [Choosing the transport]); with "interrupted": true when
/// should_stop ended it (the model is then unchanged). `end_positions`, if given, gets where the
/// chains ended [C, D] (float64). With `start` (Note [Warm starts]) the warm-up starts from its
/// chains, step size and metric and runs options.from_warmup iterations.
nlohmann::json warm_up_preconditioner(Target& target, LearnedSampler& sampler, Trainer& trainer,
                                      const TrainOptions& options, const TrainProgressFn& progress = nullptr,
                                      const std::function<bool()>& should_stop = nullptr,
                                      torch::Tensor* end_positions = nullptr, const WarmStart* start = nullptr);

/// Note [Choosing the transport] (services/transport.hpp): `nmcmc train`'s transport "auto".

/// Note [Learned proposal in a flow's latent space]: the warm-up of run_with_transport (the
/// training options' precondition_sampler, _chains and _warmup; 100 draws) fits `flow` and returns
/// its record (grads, seconds, step size, the transport report); its draws in z [S, C, D] float64
/// come back through `latent_draws`. Interrupted: "interrupted": true (`flow` unset). Its rounds
/// start from the uniform box; where they end in the transient they run again from `start`
/// [C, D] in x (where the affine warm-up left the chains) or, without it, from where a warm-up of
/// the chains alone leaves them (Note [The transported warm-up starts at the posterior]; the
/// record's "from_the_box" and "arrival", counted in its totals).
nlohmann::json warm_up_transport(Target& target, const TransportChoice& transport, const TrainOptions& options,
                                 FlowTransport& flow, torch::Tensor& latent_draws,
                                 const TrainProgressFn& progress = nullptr,
                                 const std::function<bool()>& should_stop = nullptr,
                                 const torch::Tensor& start = torch::Tensor());

/// Trains (or, with resume and an existing checkpoint, continues) and writes the checkpoint
/// at `output` every checkpoint_every steps and at the end, with the log CSV at `log_path`.
/// `should_stop` is polled between steps: a stop saves a checkpoint first. With a communicator of
/// N processes all of them call this together (Note [Data parallelism]); rank 0 writes the files.
/// A checkpoint resumes on any number of processes dividing its shard count (UsageError otherwise).
/// A run in which every step was skipped (the gradient was never finite: nothing was learned) is a
/// DataError, after its checkpoint is written.
TrainResult train(const TrainConfig& config, torch::Device device, const std::string& output,
                  const std::string& log_path, bool resume, const TrainProgressFn& progress = nullptr,
                  const std::function<bool()>& should_stop = nullptr,
                  std::shared_ptr<parallel::Communicator> comm = nullptr);

}  // namespace nmcmc
