#pragma once
/// Float32 GEMMs through oneDNN with the weights kept in its blocked layout.
//
// Note [oneDNN GEMM]
// A training step of Funnel-1 spends most of its time in OpenBLAS, a good part of it packing
// operands (measured with perf): OpenBLAS copies both matrices into its panel layout on every call, and
// each weight matrix is multiplied 36 times per step (12 uses, each forward, input gradient and
// weight gradient) while it does not change. oneDNN's matmul primitive (brgemm kernels for
// AVX-512), called directly, takes a weight already reordered into its blocked layout, and on one
// core is faster than OpenBLAS for these shapes. linear() multiplies
// float32 CPU tensors through oneDNN when this build has it and one thread runs (gemm = auto):
// forward products and input gradients against reordered weights kept in the layer's WeightCache
// (re-made when the weight's version counter moves, i.e. once per optimiser step). The weight gradients stay with
// LibTorch's accumulating addmm_ (Note [Deferred weight gradients]): their left operand is
// transposed, and there oneDNN was not faster (measured). Same float32
// arithmetic, another summation order: results differ from OpenBLAS's in the last bits, and a row's result does not depend on the other rows'
// values (Note [Bfloat16 matmul] says why that is what exactness needs).
// Needs oneDNN's headers at build time (Debian's libdnnl-dev: the oneDNN that Debian's LibTorch
// itself links); without them, or with gemm = libtorch, LibTorch's GEMM
// (OpenBLAS, MKL) is used as before. Which backend a layer uses is its policy's
// `gemm` (Note [Linear-layer policy]; the model option `gemm`, `nmcmc sample --gemm`).
#include <torch/torch.h>

#include <cstdint>

#include "nmcmc/nn/policy.hpp"

namespace nmcmc {

/// Whether this build has oneDNN (found at build time, Note [oneDNN GEMM]).
bool onednn_gemm_available();

/// Whether a policy's `gemm` multiplies float32 through oneDNN now: onednn (when available),
/// never with libtorch; auto when LibTorch and the BLAS each run one thread (`--threads 1` and
/// OPENBLAS_NUM_THREADS=1, as `reproduce --jobs` and `launch` give their children).
bool onednn_gemm_enabled(GemmBackend backend);

/// c = a W (+ bias) with W = weight, or weight^T when `transpose`; the weight is kept reordered in
/// `cache` (the layer's; without one it is reordered for this call) while it is unchanged, one
/// copy for every M, and the primitives are cached by shape (per thread). c contiguous float32 [M, N].
void onednn_gemm_weight(const torch::Tensor& a, const torch::Tensor& weight, bool transpose, torch::Tensor& c,
                        const torch::Tensor& bias = torch::Tensor(), WeightCache* cache = nullptr);

namespace test_hooks {
/// GEMMs run through oneDNN so far in this process (tests).
uint64_t onednn_gemm_calls();
}  // namespace test_hooks

}  // namespace nmcmc
