#pragma once
/// Adam with its element-wise update in one pass over each parameter.
//
// Note [Fused Adam]
// torch::optim::Adam updates a parameter in eight element-wise passes (two moment updates, the
// square root, the bias-corrected denominator in a new tensor, the parameter step): on the learned
// sampler's 3 million weights (Funnel-1, width 512) that was a measurable share of a training step
// (measured).
// FusedAdam computes the same update, in the same order of operations per element, in one loop
// over CPU tensors (float or double, contiguous, no amsgrad, no weight decay; anything else takes
// torch's Adam::step), and keeps its state in torch's AdamParamState, so that optimiser
// checkpoints read and write exactly as torch's Adam does. Results agree with torch's Adam to the
// rounding of a fused multiply-add (tests/unit/test_training_step.cpp, FusedAdam.*).
// Gradient clipping folds into the same pass: clip_and_step(max_norm) computes the gradients' total
// norm in one pass (float64 sums) and takes the step with every gradient scaled by
// min(1, max_norm / (norm + 1e-6)), as torch::nn::utils::clip_grad_norm_ followed by step() does,
// without clip_grad_norm_'s per-parameter norms and its in-place scaling pass over the gradients
// (the .grad tensors are left unscaled).
#include <torch/torch.h>

#include <vector>

namespace nmcmc {

class FusedAdam : public torch::optim::Adam {
 public:
  FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions options)
      : torch::optim::Adam(std::move(params), std::move(options)) {}
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// The total 2-norm of the parameters' gradients times `pre_scale`; when it is finite, one step
  /// with the gradients times pre_scale, scaled to norm at most `max_norm` (clip_grad_norm_'s
  /// coefficient). Returns that norm (not finite: no step).
  double clip_and_step(double max_norm, double pre_scale = 1.0);
  /// false: every step is torch's Adam::step on the gradients scaled in place (engine libtorch,
  /// Note [Native copies]); true (the default): the fused pass where it applies.
  void set_fused(bool on) { fused_ = on; }

 private:
  double grad_scale_ = 1.0;  // applied to the gradients by the fused update
  bool fused_ = true;
};

/// The total 2-norm of the gradients of `params` (those that have one), summed in float64.
double total_grad_norm(const std::vector<torch::Tensor>& params);

}  // namespace nmcmc
