#pragma once
/// Deep energy-based image models trained by maximum likelihood with persistent contrastive
/// divergence, the negatives drawn with the learned convolutional sampler (paper section 4.2)
/// or with MALA (the baseline).
//
// Note [EBM training loop]
// Replay buffer of `buffer` logit-space images, started from (dequantised) training images.
// Each iteration:
//  1. Sampler phase: `sampler_batch` buffer rows; `sampler_steps` consecutive training steps of
//     the entropy objective on them (each step also moves the rows by MH with its proposals);
//     the rows go back. MALA instead adapts log eps by rho_eps * (accept - target) per step.
//  2. If the phase's mean accept rate exceeds accept_target - accept_margin: `neg_batch` buffer
//     rows take `mcmc_steps` MH steps with the sampler and go back; they are the negatives of
//     the ML update  loss = mean E(data) - mean E(neg) + energy_reg * mean(E(data)^2 + E(neg)^2).
// Adam (lr, betas (0.5, 0.9)) for both networks; both learning rates drop by lr_drop_factor at
// each fraction in lr_drops of the run.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "nmcmc/images/conv_sampler.hpp"
#include "nmcmc/images/data.hpp"
#include "nmcmc/images/ebm_options.hpp"
#include "nmcmc/images/energy_net.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/training/proposal_trainer.hpp"

namespace nmcmc {

/// One logged iteration.
struct EbmStats {
  int64_t iteration = 0;
  double accept = 0;        // sampler phase, mean min(1, a)
  double mcmc_accept = NAN; // negative-sampling phase (NaN when skipped)
  double entropy = 0;       // proposal entropy up to the common constant: log|dz/dz0| + D log eps
  double jump = 0;          // expected squared L2 jump E[a |x' - x|^2] (logit space)
  double energy_diff = NAN; // mean E(data) - mean E(negatives)
  double eps = 0, beta = 0, lr = 0;
  int64_t updates = 0;      // EBM updates so far
  int64_t grads_sampling = 0, grads_training = 0;  // target gradients (per row) so far
  double seconds = 0, elapsed = 0;
};

/// Owns the data, buffer, networks, optimisers and RNG of one EBM run.
class EbmTrainer {
 public:
  /// With a communicator of N processes (Note [Data parallelism]) this one keeps 1/N of the replay
  /// buffer and takes 1/N of every batch with its own random streams; the sampler's and the
  /// energy's gradients and the accept rates are averaged over the processes, so all take the
  /// same steps. UsageError unless N divides buffer, sampler_batch and neg_batch.
  EbmTrainer(EbmOptions options, torch::Tensor data_uint8, std::shared_ptr<parallel::Communicator> comm = nullptr);
  EbmStats iterate();
  parallel::Communicator& comm() { return *comm_; }
  int64_t iteration() const { return it_; }
  const EbmOptions& options() const { return o_; }
  const std::vector<EbmStats>& log() const { return log_; }
  EbmTarget& target() { return *target_; }
  /// The learned sampler (undefined holder for MALA runs).
  ConvSampler& sampler() { return sampler_; }
  /// The MH proposal used for the negatives (learned or MALA).
  std::shared_ptr<Proposal> proposal() const { return proposal_; }
  const torch::Tensor& buffer() const { return buffer_; }
  const LogitTransform& transform() const { return transform_; }
  /// Fresh dequantised logit-space data images [n, D].
  torch::Tensor data_batch(int64_t n);
  double learning_rate(int64_t iteration) const;

  /// All ranks call it (buffers and random streams are gathered); rank 0 writes.
  void save(const std::string& path) const;
  /// Restores a state written by save(); DataError if corrupt or of a different configuration,
  /// UsageError if written by another number of processes.
  void load(const std::string& path);

 private:
  EbmStats sampler_phase(EbmStats s);
  /// Mean over the processes of a few local values.
  std::vector<double> mean_over_ranks(std::vector<double> values);
  EbmOptions o_;
  std::shared_ptr<parallel::Communicator> comm_;
  torch::Tensor data_;  // [N, C, H, W] uint8
  LogitTransform transform_;
  at::Generator gen_;      // proposals and MH decisions (on the device)
  at::Generator cpu_gen_;  // indices and dequantisation noise (CPU)
  std::unique_ptr<EbmTarget> target_;
  ConvSampler sampler_{nullptr};
  std::unique_ptr<ProposalTrainer> sampler_trainer_;  // learned runs: Note [Sampler training step]
  std::shared_ptr<Mala> mala_;
  std::shared_ptr<Proposal> proposal_;
  std::unique_ptr<torch::optim::Adam> ebm_opt_;
  torch::Tensor buffer_;  // [buffer / N, D]: this rank's rows
  double log_eps_mala_;
  int64_t it_ = 0, updates_ = 0, grads_sampling_ = 0, grads_training_ = 0;
  double elapsed_ = 0;
  std::vector<EbmStats> log_;
};

/// Reads a checkpoint's options (to resume or to sample from it).
nlohmann::json read_ebm_checkpoint_meta(const std::string& path);
void write_ebm_log(const std::string& path, const std::vector<EbmStats>& rows);
std::vector<EbmStats> read_ebm_log(const std::string& path);

}  // namespace nmcmc
