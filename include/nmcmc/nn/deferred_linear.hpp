#pragma once
/// Linear layers whose weight gradients are computed once per training step.
//
// Note [Deferred weight gradients]
// The learned sampler uses each shared hidden layer 4N times per training step (every coupling
// sub-step of the forward and of the reverse pass), and each sub-step's own layers twice. Autograd
// computes one weight gradient grad_out^T input per use into a new tensor and then adds the 4N
// results one by one, a full pass over the weight matrix each (a tenth of a training step on
// Funnel-1 at batch 128, measured). Inside a DeferredWeightGrads scope, nmcmc::linear()'s backward
// pass accumulates each use's weight gradient into one buffer per weight with a GEMM that adds
// to its output (beta = 1: no separate add, no new tensor) and each bias's into one vector;
// flush() hands the sums to the parameters' .grad. (Concatenating all uses into one GEMM with a
// long inner dimension was slower here: the copies cost more than the better shape gains.) With
// bfloat16 GEMMs (Note [Bfloat16 matmul]) it is the other way round: a bfloat16 GEMM cannot add
// into a float32 buffer and adding each use's product cost as much as the product, so each use's
// bfloat16 input and output gradient are kept and flush() multiplies them in one GEMM over all
// uses (accumulated in float32 inside the GEMM, rounded once). The
// gradients of the layers' inputs are computed as usual. Outside a scope, under no_grad, or for
// a weight that does not require grad, linear() is torch::addmm (or its bfloat16 form). The result equals autograd's up
// to the order of the floating-point sums (tests/unit/test_training_step.cpp).
// First order only: a backward pass with create_graph over a use recorded in an open scope is
// refused (std::logic_error): the accumulated gradient would not be differentiable. A graph
// whose scope has ended gets ordinary weight gradients from its backward pass.
//
// Note [Zero-gradient rows]
// The training objective clamps log a(x'|x) at 0: a batch row whose proposal is accepted with
// probability one adds nothing through its acceptance term, so every quantity of its reverse pass
// (which enters the loss only there) gets an output gradient that is exactly zero; in Funnel-1
// trainings at batch 128 these were a large share of the rows. linear()'s backward pass therefore
// looks at its output gradient's rows (a scan that stops at each row's first nonzero entry) and,
// in a layer of at least 2^16 weights (below that, the scan, gathers and scatter cost what the rows
// save: German's 128 x 128 layers trained slower) when at most 7/8 of the rows have a
// nonzero entry (NaN counts as nonzero), multiplies only those:
// the input gradient's other rows are zeros, and they add nothing to the weight and bias
// gradients. The same gradients, less work; only the order of the weight
// gradient's sums over rows changes. (A row made non-finite upstream carries NaN gradients,
// 0 * inf, which count as nonzero; the objective zeroes such rows first: Note [Non-finite rows in
// training], training/objective.cpp.) Inside a DeferredWeightGrads scope only, i.e. in training steps, and not
// with bfloat16 GEMMs (LibTorch's bfloat16 matmul makes a new oneDNN primitive, JIT-compiled AMX
// kernels, for every new row count, which cost more than the rows saved);
// a policy with skip_zero_gradient_rows = false turns it off (tests, A/B).
//
// Note [Bfloat16 matmul]
// With matmul = bfloat16 (MatmulOption::kBFloat16), linear() multiplies bfloat16 copies of its input and weight (products
// accumulated in float32 by the GEMM, the result rounded to bfloat16) and adds the bias in its own
// dtype (the layer's, float32), which the result keeps; its backward pass multiplies the same way.
// On a CPU with AMX-BF16 (Intel Sapphire Rapids and later), reached through LibTorch's oneDNN,
// such a GEMM runs several times faster than float32; without AMX it is slower, which
// is why the models' default `matmul = auto` asks cpu_has_fast_bf16_matmul(). `auto` uses
// bfloat16 only where no gradient is recorded (sampling, and the no-grad passes of training):
// sampling stays exact in either precision, but a model trained with bfloat16 gradients may be a
// worse sampler (measured on Funnel-3), so training in bfloat16 is the explicit
// `matmul = bfloat16`. The weights' bfloat16 copies are cached while
// the weights are unchanged (their version counter and storage; the layer's WeightCache), so a sampling run casts each
// weight once and a training step once per weight. The network is then a slightly different
// function (its outputs to about 3 significant digits), still a deterministic function of each
// input row: a row's result does not depend on the other rows' values (it may depend on the
// batch size and the row's place, as OpenBLAS's float32 result does; an MH step's forward and
// reverse passes share both), so the learned proposal evaluates the same S, Q, T, R in both
// directions and Metropolis-Hastings stays exact (tests/unit/test_learned.cpp,
// tests/statistical/test_invariance.cpp).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "nmcmc/nn/policy.hpp"

namespace nmcmc {

/// How one linear() call multiplies, resolved from the policy's MatmulOption (Note [Bfloat16 matmul]).
enum class Matmul { kNative, kBFloat16 };

/// Whether this CPU multiplies bfloat16 in hardware (AMX-BF16) and this LibTorch reaches it through
/// oneDNN; then a bfloat16 GEMM is several times faster than a float32 one.
bool cpu_has_fast_bf16_matmul();

/// The multiplication `option` gives a layer whose input is `input`, under the current grad mode:
/// bfloat16 always takes bfloat16 (for floating inputs); auto takes it for float32 CPU inputs on a
/// CPU with cpu_has_fast_bf16_matmul() when no gradient is recorded (sampling), native otherwise.
Matmul resolve_matmul(MatmulOption option, const torch::Tensor& input);

/// What a model with this `matmul` option multiplies in for `dtype` on `device` while training
/// (`training`: autograd recording) or sampling: "bfloat16" or the dtype's own name ("float32",
/// "float64").
std::string matmul_dtype_name(MatmulOption option, torch::Dtype dtype, torch::Device device, bool training);
/// Both in words: "bfloat16", "float32", or "float32 in training, bfloat16 in sampling".
std::string matmul_summary(MatmulOption option, torch::Dtype dtype, torch::Device device);

/// A bfloat16 copy of `weight`, kept in `cache` while the weight is unchanged (Note [Linear-layer
/// policy]); without a cache, a fresh copy.
torch::Tensor bf16_weight(const torch::Tensor& weight, WeightCache* cache);

/// input [C, in] -> [C, out]: input @ weight + bias with weight [in, out], or input @ weight^T +
/// bias with weight [out, in] when `transposed` (torch::nn::Linear's layout). bias [out]. How it
/// multiplies is `policy`'s (Note [Linear-layer policy]); `cache` (the layer's, may be null) keeps
/// the weight's derived copies.
torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool transposed, const LinearPolicy& policy, WeightCache* cache = nullptr);

namespace test_hooks {
/// Rows left out by Note [Zero-gradient rows] so far in this process (tests, benchmarks).
uint64_t zero_gradient_rows_skipped();
}  // namespace test_hooks

/// A scope in which linear() defers its weight gradients (Note [Deferred weight gradients]).
/// A scope belongs to the thread that opens it; scopes do not nest on one thread (a second one is a
/// std::logic_error). Each thread (a data-parallel rank run as a thread) may have its own.
class DeferredWeightGrads {
 public:
  DeferredWeightGrads();
  ~DeferredWeightGrads();
  DeferredWeightGrads(const DeferredWeightGrads&) = delete;
  DeferredWeightGrads& operator=(const DeferredWeightGrads&) = delete;

  /// Adds the weight and bias gradients accumulated by the backward passes so far to the
  /// parameters' .grad (setting it where undefined) and starts again from zero. Call after
  /// backward(); uses that no backward pass reached contribute nothing.
  void flush();
  /// Weights with accumulated gradients not yet flushed (tests).
  int64_t pending() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace nmcmc
