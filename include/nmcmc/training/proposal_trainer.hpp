#pragma once
/// One sampler-training step for any ProposalModel: the step that `nmcmc train` (Trainer) and the
/// EBM loop's sampler phase both take.
//
// Note [Sampler training step]
// On rows x with U(x) (and dU(x) for Langevin-type models):
//  1. the entropy objective (Note [Entropy objective]) with one fresh z0 per row;
//  2. backward, clip the gradient's L2 norm at `clip`, Adam step. A step whose loss or gradient
//     norm is not finite is skipped (and reported): a proposal that overflows (U(x') = inf far
//     out in a funnel) is excluded from the objective, but 0 * inf in the backward pass can still
//     produce NaN, which must not reach the weights;
//  3. beta <- clip(beta * (1 + rho * (mean accept - accept_target)), beta_min, beta_max)
//     (paper appendix: beta holds the accept rate at its target);
//  4. callers with persistent chains (the bootstrap buffer, the EBM's replay buffer) then move
//     the rows by one Metropolis-Hastings step with this step's own proposals: advance_rows(),
//     decided by mh_accept like every other accept/reject. (Exact-data training skips it, and so
//     draws nothing more from the generator.)
#include <torch/torch.h>

#include <memory>
#include <string>

#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/training/objective.hpp"

namespace nmcmc {

/// The entropy weight beta and its multiplicative controller (Note [Sampler training step], 3).
class BetaController {
 public:
  BetaController(double beta, double beta_min, double beta_max, double rho, double accept_target);
  /// Feeds one mean accept rate; returns the new beta.
  double update(double accept);
  double value() const { return beta_; }
  /// Restores a saved value (resume).
  void set_value(double beta) { beta_ = beta; }

 private:
  double beta_, beta_min_, beta_max_, rho_, accept_target_;
};

/// What one training step produced.
/// One shard of a data-parallel batch (Note [Data parallelism]): rows x [b, D], U(x) [b], dU(x)
/// (or undefined) and the shard's own random stream.
struct ShardInput {
  torch::Tensor x, u_x, grad_x;
  at::Generator* gen = nullptr;
};

/// What a training step produced: the local shards' terms and the statistics of the whole batch
/// (all shards of all ranks).
struct TrainingStep {
  std::vector<ObjectiveTerms> shards;  // this rank's, in order
  double loss = 0, accept = 0, entropy = 0;
  int64_t rows = 0;
  int64_t rows_bad = 0;  // rows (whole batch) whose proposal met a non-finite energy or gradient
                         // (Note [Non-finite rows in training])
  bool skipped = false;  // the optimiser step was skipped (a shard's loss was not finite, or the gradient)
  bool stop = false;  // some rank asked to stop (the run ends after this step, on every rank)
};

/// Owns a proposal model's optimiser and beta controller; takes Note [Sampler training step].
/// Note [Sampler training step], 4: rows x [B, D] with U(x) [B] after one MH step with the
/// step's own proposals (detached).
torch::Tensor advance_rows(const torch::Tensor& x, const torch::Tensor& u_x, const ObjectiveTerms& terms,
                           at::Generator& gen);

class ProposalTrainer {
 public:
  ProposalTrainer(std::shared_ptr<ProposalModel> model, const torch::optim::AdamOptions& adam, BetaController beta,
                  double clip);

  /// Note [Sampler training step] on a batch split into shards: this process's in `shards` (rows x
  /// [b, D], U(x) [b], dU(x) or undefined when the model does not need it, and the shard's own
  /// random stream), the others on the other ranks of `comm` (parallel::single_process() for one process).
  /// Each shard's objective is backpropagated with its share of the batch's finite rows as weight,
  /// the gradients and statistics are summed over ranks, and every rank takes the same clipped Adam
  /// step and beta update: the step of one process on the concatenated batch (to float rounding;
  /// exactly the plain step for one shard on one process). create_graph: backpropagate through
  /// the target's gradient. `stop` is this rank's wish to stop; the result's stop is any rank's.
  TrainingStep step(Target& target, const std::vector<ShardInput>& shards, bool create_graph,
                    parallel::Communicator& comm, bool stop = false);
  /// Makes every rank's parameters, buffers and beta rank 0's.
  void broadcast_from_root(parallel::Communicator& comm);

  void set_learning_rate(double lr);
  ProposalModel& model() { return *model_; }
  const ProposalModel& model() const { return *model_; }
  std::shared_ptr<ProposalModel> model_ptr() const { return model_; }
  BetaController& beta() { return beta_; }
  const BetaController& beta() const { return beta_; }

  /// Writes the model and optimiser state under `model_key` and `optimizer_key`.
  void save(torch::serialize::OutputArchive& archive, const std::string& model_key,
            const std::string& optimizer_key) const;
  /// Reads what save() wrote (c10::Error if absent or malformed; callers map it to DataError).
  void load(torch::serialize::InputArchive& archive, const std::string& model_key, const std::string& optimizer_key);

 private:
  std::shared_ptr<ProposalModel> model_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  BetaController beta_;
  double clip_;
};

}  // namespace nmcmc
