#pragma once
// Tensor options shared by the test files (one definition: the unity build compiles several test
// files as one translation unit).
#include <torch/torch.h>

inline const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);
