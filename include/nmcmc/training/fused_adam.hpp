#pragma once
/// Adam with its element-wise update in one pass over each parameter.
//
// Note [Fused Adam]
// torch::optim::Adam updates a parameter in eight element-wise passes (two moment updates, the
// square root, the bias-corrected denominator in a new tensor, the parameter step): on the learned
// sampler's 3 million weights (Funnel-1, width 512) that was ~5 % of a training step at batch 128.
// FusedAdam computes the same update, in the same order of operations per element, in one loop
// over CPU tensors (float or double, contiguous, no amsgrad, no weight decay; anything else takes
// torch's Adam::step), and keeps its state in torch's AdamParamState, so that optimiser
// checkpoints read and write exactly as torch's Adam does. Results agree with torch's Adam to the
// rounding of a fused multiply-add (tests/unit/test_deferred_linear.cpp, FusedAdam.*).
#include <torch/torch.h>

#include <vector>

namespace nmcmc {

class FusedAdam : public torch::optim::Adam {
 public:
  FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions options)
      : torch::optim::Adam(std::move(params), std::move(options)) {}
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace nmcmc
