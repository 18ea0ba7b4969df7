#pragma once
/// Training the learned sampler by maximising E[min(0, log a)] + beta * proposal entropy
/// (paper section 3.3 and appendix), with beta adapted to hold a target accept rate.
//
// The step itself is Note [Sampler training step] (training/proposal_trainer.hpp). Around it the
// Trainer owns: Adam (0.9, 0.999), cosine annealing from lr to min_lr after a linear warm-up, the
// data (exact samples when the target has a sampler, else a bootstrap buffer of persistent chains
// that each step advances by MH with its own proposals), the log and resumable checkpoints.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <map>
#include <string>

#include "nmcmc/core/json.hpp"
#include "nmcmc/flows/checkpoint.hpp"
#include "nmcmc/io/draws.hpp"
#include "nmcmc/kernels/factory.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/training/proposal_trainer.hpp"

namespace nmcmc {

/// Above this many dimensions a dense preconditioner's warm-up adapts fisher-lowrank (Note [The
/// warm-up's metric], training/trainer.cpp).
constexpr int64_t kFisherWarmupMinDim = 50;

/// The warm-up that sets the affine preconditioner (model.precondition diag | dense | lowrank; Note
/// [Affine preconditioner]): a baseline sampler with Stan's windowed metric adaptation, whose
/// regularised covariance gives L and whose draws give m and the first bootstrap buffer.
struct PreconditionWarmup {
  SamplerKind sampler = SamplerKind::kNuts;  // nuts | hmc | mala
  int64_t warmup = 500;                       // adaptation iterations
  std::optional<int64_t> draws;               // draws after it (for m, L and the buffer); unset: 100
                                              // (400 for lowrank, whose factors need them)
  int64_t chains = 16;
  /// The metric its windows adapt (kernels/metric.hpp); unset: metric_for's rule. fisher-lowrank
  /// and fisher-diag adapt from draws and gradients (Note [Metrics from draws and gradients]); the
  /// preconditioner then takes their dense (or diagonal) equivalent as it takes a dense estimate.
  std::optional<MetricAdapt> metric;
  bool refit = true;             // lowrank: a second stage that samples with the first fit as the metric
                                 // and refits from its draws
  bool eps_from_warmup = true;   // start eps at the warm-up's adapted step size
  bool beta_from_warmup = true;  // then start beta where that eps is the objective's optimum
  /// Its draws for a preconditioner of this kind: `draws`, or where it is unset (or 0, as JSON
  /// reads it) the default.
  int64_t draws_for(bool lowrank) const { return draws.value_or(0) > 0 ? *draws : lowrank ? 400 : 100; }
  /// Its metric for a preconditioner of this form and dimension (Note [The warm-up's metric]):
  /// `metric`, or where it is unset the form's own (diag for diag and lowrank, whose second stage
  /// refits along the wide directions), and for a dense one fisher-lowrank above
  /// kFisherWarmupMinDim dimensions, dense below.
  MetricAdapt metric_for(Precondition kind, int64_t dim) const;
};

/// When training stops (Note [Training budget], services/train.hpp): after `steps`, or before them
/// once the proposal entropy has stopped improving (its moving average gained less than `min_gain`
/// nats per dimension in the last `patience` steps; unset: never), or after `max_seconds` of
/// training steps (unset: no limit). The result says why training stopped.
struct TrainBudget {
  int64_t steps = 5000;
  std::optional<int64_t> patience;
  double min_gain = 0.01;
  std::optional<double> max_seconds;
  // Starting from another data set's model (Note [Training from a previous model], services/
  // train_run.cpp): the preconditioner's warm-up, warm-started from the model's own metric, step
  // size and chains, runs `from_warmup` iterations instead of PreconditionWarmup::warmup; the
  // training steps then stop on a plateau of `from_patience` steps (then patience's, where the
  // mixing check fails).
  int64_t from_warmup = 150;
  int64_t from_patience = 50;
  // Note [Training stops when it no longer pays] (services/train_run.cpp): every `probe_every`
  // steps a short run of the sampler projects the all-in gradients to `ess_goal` effective draws;
  // training stops once that projection has not fallen for two probes (unset: off).
  std::optional<double> ess_goal;
  int64_t probe_every = 200;
};

/// A config's "train" section: the optimisation, the preconditioner's warm-up and the budget.
/// In JSON one flat object (configs/*.json, `--set train.KEY=VALUE`): the warm-up's keys are
/// precondition_sampler, precondition_warmup, precondition_draws, precondition_chains,
/// precondition_metric, precondition_refit, eps_from_warmup and beta_from_warmup; the budget's steps, patience,
/// min_gain, max_seconds, from_warmup, from_patience, ess_goal and probe_every. An unset value is
/// null there; 0 (-1 for warmup_steps) reads as unset too, as "off" is written on a command line.
struct TrainOptions {
  double accept_target = 0.7;
  double lr = 1e-3, min_lr = 1e-5;
  int64_t batch = 8192;
  std::optional<int64_t> warmup_steps;  // the learning rate's linear warm-up; unset: 2 % of steps (at most 200)
  double beta = 1e-3, beta_min = 1e-3, beta_max = 1e3, rho = 0.03;
  double clip = 10.0;
  bool amsgrad = false;
  std::string data = "auto";           // auto | exact | buffer
  std::optional<int64_t> buffer_size;  // unset: equal to the batch
  double buffer_init_scale = 1.0;      // buffer chains start at N(0, scale^2 I)
  bool stop_grad = false;              // stop the gradient at dU (for comparison)
  uint64_t seed = 1;
  int64_t checkpoint_every = 500;
  int64_t log_every = 10;
  // Data parallelism (Note [Data parallelism]): each batch is split into `shards` blocks with a
  // random stream each; N processes take shards / N each (unset: one per process). A checkpoint
  // resumes on any number of processes that divides its shard count.
  std::optional<int64_t> shards;
  PreconditionWarmup precondition;
  TrainBudget budget;
  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);  // throws UsageError
};
void to_json(nlohmann::json& j, const TrainOptions& o);
void from_json(const nlohmann::json& j, TrainOptions& o);

/// One logged training step.
struct TrainStats {
  int64_t step = 0;
  double loss = 0, accept = 0, beta = 0, entropy = 0, eps = 0, lr = 0;
  double seconds = 0;       // wall time of this step
  int64_t grads = 0;        // target gradient evaluations (per batch row) spent so far
  int64_t skipped = 0;      // steps skipped so far because the gradient was not finite
  double elapsed = 0;       // training wall time so far (all invocations)
};

/// Trains any ProposalModel on a target: the learning-rate schedule, the data source, the log
/// and checkpoints around one ProposalTrainer.
class Trainer {
 public:
  /// A fresh run. The model is moved to the target's dtype and device. With a communicator of N
  /// processes, this one trains its shards of every batch (Note [Data parallelism]); UsageError
  /// when the shards do not divide among the processes or the batch into the shards.
  Trainer(Target& target, std::shared_ptr<ProposalModel> model, TrainOptions options,
          std::shared_ptr<parallel::Communicator> comm = nullptr);

  /// One optimisation step on one batch (all ranks call it together). `stop`: this rank wants to
  /// stop; stop_agreed() then says whether any rank did (the caller saves and ends on every rank).
  TrainStats step(bool stop = false);
  bool stop_agreed() const { return stop_agreed_; }
  parallel::Communicator& comm() { return *comm_; }
  /// Shards per batch (resolved: at least 1).
  int64_t shards() const { return *options_.shards; }
  /// Makes every rank's model, beta (and so the run) rank 0's: after a warm-up, before step 1.
  void broadcast_from_root() { core_.broadcast_from_root(*comm_); }
  int64_t current_step() const { return step_; }
  /// Steps whose optimiser step was skipped (the gradient was not finite), over the whole run.
  int64_t skipped_steps() const { return skipped_; }
  /// Batch rows rejected because their proposal met a non-finite energy or gradient (Note
  /// [Non-finite rows in training]), over the whole run.
  int64_t bad_rows() const { return bad_rows_; }
  double beta() const { return core_.beta().value(); }
  /// Sets beta (before the first step), e.g. to a previous model's.
  void set_beta(double beta) { core_.beta().set_value(beta); }
  const TrainOptions& options() const { return options_; }
  ProposalModel& model() { return core_.model(); }
  /// Learning rate at step t (warm-up, then cosine).
  double learning_rate(int64_t t) const;
  /// All logged rows so far.
  const std::vector<TrainStats>& log() const { return log_; }
  bool uses_buffer() const { return use_buffer_; }
  /// Sets beta so that the model's current eps is a stationary point of the objective on one
  /// batch: with d/d(log eps) of the entropy term equal to D (exact for the MALA-like model at
  /// initialisation), beta = -dE[min(0, log a)]/d(log eps) / D, by a central difference (+-0.1,
  /// common random numbers), clamped to [beta_min, beta_max]. Only before the first step. A
  /// beta of 1e-3 that grows by at most rho (a - a*) per step otherwise takes thousands of steps
  /// to reach the scale the entropy needs. Returns the new beta.
  double warm_start_beta();
  /// Replaces the bootstrap buffer's starting points with rows of `x` [n, D] (cycled), e.g. the
  /// draws of a warm-up. Only before the first step; ignored when training on exact samples.
  void seed_buffer(const torch::Tensor& x);
  /// This rank's persistent chains [n, D] (the bootstrap buffer, its shards in order); undefined
  /// when training draws exact samples.
  torch::Tensor chains() const;

  /// Writes everything needed to resume bit for bit (atomically). `extra` is stored as-is. All
  /// ranks call it (their random streams and buffer rows are gathered); rank 0 writes. `more`
  /// writes further entries into the archive (a flow transport's parameters).
  void save(const std::string& path, const nlohmann::json& extra,
            const std::function<void(torch::serialize::OutputArchive&)>& more = nullptr) const;
  /// Restores a state written by save() into this trainer (same model shape and target, same
  /// shard count). Throws DataError for a truncated, corrupt or mismatched file.
  nlohmann::json load(const std::string& path);

 private:
  /// One of this rank's shards: its random stream and its block of the bootstrap buffer.
  struct Shard {
    int64_t index = 0;           // global shard number
    at::Generator gen;
    torch::Tensor buffer;        // [buffer_size / shards, D]
    torch::Tensor batch_index;   // rows of the buffer in the current batch (undefined: all)
  };
  torch::Tensor next_batch(Shard& shard);
  /// U(x) and, when the model carries it, dU(x) (undefined otherwise), without a graph.
  EnergyGrad batch_state(const torch::Tensor& x);
  /// Counts the step and logs its statistics (every log_every steps, the first and the last).
  TrainStats record_step(double loss, double accept, double entropy, double lr,
                         std::chrono::steady_clock::time_point t0);
  Target& target_;
  TrainOptions options_;
  ProposalTrainer core_;
  std::shared_ptr<parallel::Communicator> comm_;
  std::vector<Shard> shards_;  // this rank's, in order
  bool use_buffer_ = false;
  bool stop_agreed_ = false;
  int64_t step_ = 0;
  int64_t grads_ = 0;
  int64_t skipped_ = 0;
  int64_t bad_rows_ = 0;
  double elapsed_ = 0;
  std::vector<TrainStats> log_;
};

/// Writes the training log (CSV) atomically.
void write_training_log(const std::string& path, const std::vector<TrainStats>& rows);

}  // namespace nmcmc
