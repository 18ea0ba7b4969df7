#pragma once
/// The learned sampler's activations, elu and tanh, with vectorised float32 kernels.
//
// Note [Fast activations]
// With bfloat16 GEMMs (Note [Bfloat16 matmul]) the networks' activations cost about as much as
// their products (measured: this LibTorch build dispatches its elementwise kernels
// at AVX2 and computes tanh in full precision). For contiguous float32 CPU tensors activate() runs nmcmc's
// own kernels instead: expm1 by range reduction and a degree-7 polynomial (about 1.3 ulp; elu(x)
// = expm1(x) below zero, tanh(x) = expm1(2|x|) / (expm1(2|x|) + 2) with the sign of x, about
// 2.7 ulp), compiled for x86-64-v4 (AVX-512), v3 (AVX2, FMA) and baseline x86-64 and picked at
// run time (target_clones), split over threads like LibTorch's own. NaN propagates. Their gradients come
// from the output, as LibTorch's in-place elu_ and tanh_ do. Any other tensor (float64, CUDA)
// goes through LibTorch's elu_ / tanh_.
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "nmcmc/core/enum_names.hpp"

namespace nmcmc {

/// A network's activation (the model option `activation`).
enum class Activation { kElu, kRelu, kTanh, kSoftplus, kSilu };
template <>
struct EnumNames<Activation> {
  static constexpr const char* what = "activation";
  static std::vector<std::pair<Activation, const char*>> values() {
    return {{Activation::kElu, "elu"},
            {Activation::kRelu, "relu"},
            {Activation::kTanh, "tanh"},
            {Activation::kSoftplus, "softplus"},
            {Activation::kSilu, "silu"}};
  }
};
NMCMC_ENUM_JSON(Activation)

/// The activation of `h`, a fresh tensor nothing else holds (it may be overwritten): elu and tanh
/// through the kernels below for float32 CPU tensors, relu in place, softplus and silu LibTorch's.
/// Differentiable (first and higher order through LibTorch's backward formulas).
torch::Tensor activate(torch::Tensor h, Activation a);

/// Sampling's fused layer tail (no gradients; elu or tanh): bf16(act(float(y) + bias)) for a bfloat16 GEMM
/// output y [C, H] and a float32 bias [H]; bit for bit what adding the bias in float32, activate()
/// and a cast to bfloat16 give, in one pass instead of three (Note [Bfloat16 matmul]).
torch::Tensor bias_activate_bf16(const torch::Tensor& y, const torch::Tensor& bias, Activation a);

/// float(y) + bias for a bfloat16 y [C, H] and a float32 bias [H], in one pass (torch::add of the
/// two converts y first); not differentiable (for custom autograd functions), bit for bit
/// torch::add's result. Other dtypes and devices: torch::add.
torch::Tensor bias_add_bf16(const torch::Tensor& y, const torch::Tensor& bias);

/// The raw float32 kernels (tests): out[i] = elu(in[i]) or tanh(in[i]); in == out is allowed.
void elu_kernel(const float* in, float* out, int64_t n);
void tanh_kernel(const float* in, float* out, int64_t n);

}  // namespace nmcmc
