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

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nmcmc/core/target.hpp"
#include "nmcmc/images/conv_sampler.hpp"
#include "nmcmc/images/data.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/training/proposal_trainer.hpp"

namespace nmcmc {

/// The energy: six convolutions with ELU (3x3, 4x4 stride 2, 3x3, 4x4 stride 2, 3x3, and one
/// spanning the remaining map), `filters` channels. [B, C, H, W] -> [B].
class EnergyNetImpl : public torch::nn::Module {
 public:
  EnergyNetImpl(int64_t channels, int64_t height, int64_t width, int64_t filters, uint64_t seed);
  torch::Tensor forward(const torch::Tensor& images);

 private:
  std::vector<torch::nn::Conv2d> convs_;
};
TORCH_MODULE(EnergyNet);

/// U(x) = EnergyNet(x) on flattened logit-space images [B, C*H*W].
/// With wall > 0 a fixed term wall * sum_i relu(|x_i| - bound)^2 keeps samples inside the logit
/// range of the data, [-bound, bound] (bound = logit(1 - alpha)); it has no parameters.
class EbmTarget : public Target {
 public:
  EbmTarget(EnergyNet net, int64_t channels, int64_t height, int64_t width, torch::TensorOptions options,
            double wall = 0.0, double bound = 0.0);
  std::string name() const override { return "ebm"; }
  int64_t dim() const override { return c_ * h_ * w_; }
  nlohmann::json spec() const override { return {{"name", "ebm"}, {"channels", c_}, {"height", h_}, {"width", w_}}; }
  EnergyNet& net() { return net_; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;

 private:
  EnergyNet net_;
  int64_t c_, h_, w_;
  double wall_, bound_;
};

struct EbmOptions {
  std::string data = "fashion-mnist";  // fashion-mnist | IDX file | image folder
  int64_t size = 28, channels = 1;    // for image folders (IDX files keep their shape)
  int64_t limit = 0;                  // use only the first `limit` images (0: all)
  int64_t ebm_filters = 64;
  std::string sampler = "learned";    // learned | mala
  ConvSamplerOptions conv;
  int64_t iterations = 100000, buffer = 10000, sampler_batch = 64, sampler_steps = 5, neg_batch = 128,
          mcmc_steps = 40;
  double lr = 1e-4, adam_beta1 = 0.5, adam_beta2 = 0.9;
  double sampler_lr = 0;             // the sampler's learning rate (0: lr)
  std::vector<double> lr_drops = {0.8, 0.9};
  double lr_drop_factor = 0.2;
  double accept_target = 0.6, accept_margin = 0.1;
  double beta = 1e-3, beta_min = 1e-8, beta_max = 1e3, rho = 0.03;  // entropy weight and its controller
  double rho_eps = 0.05;             // MALA's step-size controller
  double energy_reg = 0.0, clip = 100.0;
  double wall = 0.0;                 // weight of the support wall (see EbmTarget); 0: none
  int64_t longrun_steps = 2000;      // the long sampling run for the stability figure
  uint64_t seed = 1;
  int64_t checkpoint_every = 100, log_every = 10;
  std::string dtype = "float32";
  std::string device = "cpu";        // cpu | cuda | cuda:N (not part of the model: may change on resume)
  nlohmann::json to_json() const;
  /// Parses {...} over the defaults of `profile` (cpu | paper | smoke); UsageError on bad values.
  static EbmOptions from_json(const nlohmann::json& j, const std::string& profile = "");
  /// The settings a profile changes, as JSON.
  static nlohmann::json profile(const std::string& name);
};

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
  EbmTrainer(EbmOptions options, torch::Tensor data_uint8);
  EbmStats iterate();
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

  void save(const std::string& path) const;
  /// Restores a state written by save(); DataError if corrupt or of a different configuration.
  void load(const std::string& path);

 private:
  EbmStats sampler_phase(EbmStats s);
  EbmOptions o_;
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
  torch::Tensor buffer_;  // [buffer, D]
  double log_eps_mala_;
  int64_t it_ = 0, updates_ = 0, grads_sampling_ = 0, grads_training_ = 0;
  double elapsed_ = 0;
  std::vector<EbmStats> log_;
};

/// Reads a checkpoint's options (to resume or to sample from it).
nlohmann::json read_ebm_checkpoint_meta(const std::string& path);
void write_ebm_log(const std::string& path, const std::vector<EbmStats>& rows);
std::vector<EbmStats> read_ebm_log(const std::string& path);

struct EbmProgress {
  EbmStats stats;
  int64_t total = 0;
  double rate = 0;  // iterations per second in this invocation
};

/// `nmcmc ebm train`: trains (or resumes from output/checkpoint.pt), logs to output/log.csv,
/// checkpoints atomically, and writes the figures. Returns a summary.
nlohmann::json run_ebm_training(const EbmOptions& options, const std::string& output, bool resume,
                                const std::function<void(const EbmProgress&)>& progress,
                                const std::function<bool()>& should_stop, const std::string& compare_with = "");

/// Long sampling run from buffer samples of a trained model, with snapshots as a grid.
nlohmann::json run_ebm_longrun(const std::string& model_dir, int64_t steps, int64_t chains, const std::string& png,
                               const std::function<void(int64_t, int64_t)>& progress, const std::string& device = "cpu");

/// The training curves of one or two runs (learned vs MALA) in one PNG.
void write_ebm_curves(const std::string& path, const std::vector<std::pair<std::string, std::vector<EbmStats>>>& runs);

}  // namespace nmcmc
