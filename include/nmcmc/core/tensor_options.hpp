#pragma once
/// Tensor options from the names a user gives: the one parser the command line, the sampling
/// service and the Python package share.
#include <torch/torch.h>

#include <string>

namespace nmcmc {

/// dtype "float32" | "float64", device "cpu" | "cuda" | "cuda:N". UsageError for anything else, or
/// for a CUDA device this LibTorch build or machine does not have.
torch::TensorOptions parse_tensor_options(const std::string& dtype, const std::string& device);

}  // namespace nmcmc
