#pragma once
/// Explicit random generators. The library never touches torch's global generator.
#include <torch/torch.h>

#include <cstdint>

namespace nmcmc {

/// A fresh generator for `device`, seeded with `seed`. Same seed, same machine: same stream.
at::Generator make_generator(uint64_t seed, const torch::Device& device = torch::kCPU);

/// The seed of stream `index` of a run seeded with `seed` (a shard's or a rank's): stream 0 keeps
/// `seed` itself (so one process with one stream is the single-process run), the others a
/// splitmix64 mix of (seed, index).
uint64_t stream_seed(uint64_t seed, int64_t index);

/// Standard normal draws of `shape` with `options`, from `gen`.
torch::Tensor randn(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options);
/// Uniform(0, 1) draws.
torch::Tensor rand(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options);

}  // namespace nmcmc
