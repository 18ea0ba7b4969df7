#pragma once
// What services/train.cpp's warm-ups and train_from.cpp share with train_run.cpp's run.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <limits>
#include <optional>
#include <string>

#include "nmcmc/flows/learned.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/warm_start.hpp"
#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

/// Seeds the trainer's bootstrap buffer from a warm-up's draws [S, C, D]: the last draws of every
/// chain (where the warm-up left them), enough rows for one batch.
void seed_buffer_from(Trainer& trainer, const torch::Tensor& draws, const torch::TensorOptions& options);

/// Note [Training from a previous model] (train_from.cpp): the model a run starts from, and the
/// warm start of its preconditioner's warm-up (for preconditioned models).
struct PreviousModel {
  LearnedSampler sampler{nullptr};
  nlohmann::json meta;
  std::optional<WarmStart> start;
  FlowTransport flow{nullptr};  // the flow whose latent space it was trained in (none: null)
};
/// Loads the checkpoint at `path` and checks it against `target` (UsageError: another dimension or
/// parameter names).
PreviousModel load_previous_model(const std::string& path, const Target& target, const TrainOptions& options);
/// Whether the previous networks fit after the affine map moved: the mixing check's record
/// `check` (which gets "ess_of_previous") against the previous model's.
bool previous_networks_fit(nlohmann::json& check, const nlohmann::json& previous_meta);

/// Note [The mixing check] (train_run.cpp), where a check fails: the parameter of `target` that
/// mixed worst in its draws [S, C, D] by R-hat, {"name", "rhat"}; draws in `latent`'s space (a
/// flow's) are mapped back to the target's own coordinates first.
nlohmann::json slowest_parameter(const torch::Tensor& draws, const Target& target, const TransportedTarget* latent);

/// Note [An extension that does not pay] (train_run.cpp): whether the mixing check `now` improved
/// on `previous` (the check at the last stop; null: none, which counts as a gain) by kExtensionGain.
constexpr double kExtensionGain = 0.1;
bool extension_gained(const nlohmann::json* previous, const nlohmann::json& now);

/// Note [Training stops when it no longer pays] (train_from.cpp): the probes' projections and the
/// stopping rule.
class CostWatch {
 public:
  CostWatch(double ess_goal, int64_t every) : goal_(ess_goal), every_(every) {}
  bool due(int64_t step) const { return goal_ > 0 && step > 0 && step % every_ == 0; }
  /// Records a probe (the mixing check's record) after `spent` gradients of warm-up, training and
  /// checks; true where training should stop.
  bool stops(int64_t step, double spent, nlohmann::json probe);
  const nlohmann::json& log() const { return log_; }

 private:
  double goal_;
  int64_t every_;
  double best_ = std::numeric_limits<double>::infinity(), spent_probes_ = 0;
  int not_falling_ = 0;
  nlohmann::json log_ = nlohmann::json::array();
};

}  // namespace nmcmc
