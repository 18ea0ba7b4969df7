#pragma once
// Where run.cpp's draws live (draw_storage.cpp; the footprint checks are declared in run.hpp).
#include <torch/torch.h>

#include <string>

namespace nmcmc {

/// A float64 tensor backed by a scratch file in `directory` (empty: the system's temporary
/// directory) that is unlinked at once: the kernel pages it out as needed and frees the space
/// when the tensor goes. IoError where the file cannot be made.
torch::Tensor disk_backed_tensor(torch::IntArrayRef shape, const std::string& directory);

/// dst[i] = src (or -src), the sampling loop's per-draw copy of a [C] or [C, D] value into its
/// [S, C] or [S, C, D] record: a plain loop where both are on the CPU, dst's rows are contiguous
/// and the types are float32/float64 into float64 or the same type (a draw is 64 x 50 numbers, a
/// tensor op costs microseconds: the ops were as much as NUTS's leaves on a cheap target), else
/// the tensor ops.
void put_row(const torch::Tensor& dst, int64_t i, const torch::Tensor& src, bool negate = false);

}  // namespace nmcmc
