#pragma once
// What services/train.cpp's warm-ups share with train_run.cpp's run.
#include <torch/torch.h>

#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

/// Seeds the trainer's bootstrap buffer from a warm-up's draws [S, C, D]: the last draws of every
/// chain (where the warm-up left them), enough rows for one batch.
void seed_buffer_from(Trainer& trainer, const torch::Tensor& draws, const torch::TensorOptions& options);

}  // namespace nmcmc
