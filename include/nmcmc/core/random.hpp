#pragma once
/// Explicit random generators. The library never touches torch's global generator.
#include <torch/torch.h>

#include <cstdint>

namespace nmcmc {

/// A fresh generator for `device`, seeded with `seed`. Same seed, same machine: same stream.
at::Generator make_generator(uint64_t seed, const torch::Device& device = torch::kCPU);

/// Standard normal draws of `shape` with `options`, from `gen`.
torch::Tensor randn(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options);
/// Uniform(0, 1) draws.
torch::Tensor rand(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options);

}  // namespace nmcmc
