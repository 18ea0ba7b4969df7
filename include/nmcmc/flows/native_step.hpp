#pragma once
/// The learned proposal's sampling step in plain loops, without LibTorch.
//
// Note [The learned step's native pass]
// Sampling a user's posterior runs a handful of chains (4 by default), and there a learned MH
// step through LibTorch is a few dozen small operations (the coupling sub-steps' gathers, cats,
// three linear layers each, the drift network twice, the preconditioner's triangular solves),
// each a dispatch and an allocation: on posteriordb's arK (D = 7, width 64, 4 chains) about
// 0.4 ms a step, where the posterior's own gradient on the native engine costs tens of
// microseconds (targets/script_program.hpp) and NUTS with a dense metric draws 3-5x more
// effective draws per second than the learned sampler although it needs 2-3x more gradients per
// effective draw. Once trained the networks are fixed, so a sampling step copies
// them (float64, each layer by input row so that a row's product is a running sum over contiguous
// memory) and writes the proposal out by hand, row by row, exactly as propose_from does
// (Note [Learned proposal], Note [Affine preconditioner]):
//   y = L^-1 (x - m), gy = L^T dU(x); z = f(z0; y) through the 2N coupling sub-steps;
//   y' = y + eps z (+ the Langevin drift mu(y, gy)); x' = m + L y';  U(x'), dU(x') in one
//   batched call of the target; the reverse pass from y' gives log q(x|x').
// dU(x') is returned as the target gave it (the LibTorch path returns L^-T L^T dU(x'), the same
// to rounding). Everything runs in float64 whatever the model's dtype; x' is rounded to the
// chains' dtype before the target sees it, as the LibTorch path's x' is. The values agree with
// propose_from to rounding (tests/unit/test_learned_native.cpp: 1e-12 in float64); the proposal
// is the same Markov kernel. Taken by LearnedSamplerImpl::propose where it applies
// (native_step_applies: a CPU batch of at most model.native_max_flops network flops, no autograd
// graph, the gradient-free coupling variants (langevin, no-grad), model.matmul auto, or native
// for a float64 model: a model told to multiply in bfloat16 or in float32 does so); the copy is
// remade when a parameter or buffer changed (their version counters and storage).
// Training, the full variant and large batches (where LibTorch's GEMMs win) stay on LibTorch.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "nmcmc/flows/model.hpp"
#include "nmcmc/nn/activations.hpp"

namespace nmcmc {

class Target;

/// The default of LearnedOptions::native_max_flops: up to this many network flops per step (chains x
/// LearnedSamplerImpl::flops_per_step()) a sampling step takes the native pass under engine auto
/// (Note [The learned step's native pass], Note [Native copies]). Measured on a
/// 2-vCPU Intel Xeon (AVX-512), per step, native / LibTorch: arK (D = 7, width 64) 136 / 427 us at
/// 4 chains (0.45 Mflop), 1082 / 965 at 64 (7.2 Mflop); German (D = 25, width 128) 334 / 862 at 4
/// (2 Mflop), 778 / 687 at 16 (8 Mflop); ICG (D = 100, width 256) 1024 / 613 at 4 (9.6 Mflop):
/// above a few Mflop LibTorch's float32 GEMMs, which read half the bytes of weights and reuse
/// them across rows, win. On a 2-vCPU AMD EPYC (Zen 4) the crossover is 4-6 Mflop as well
/// (`bash bench/native_threshold.sh`).
constexpr int64_t kNativeStepMaxFlops = 4'000'000;

/// A tensor's values as float64 in row-major order (detached, on the CPU): how the native
/// passes copy weights and rows.
std::vector<double> native_rows(const torch::Tensor& t);

/// A StepMLP's weights (every sub-step's first and last layers, the shared middle layers) as
/// float64 arrays, each layer [n_in, n_out] row-major (by input row).
struct NativeStepNet {
  int64_t in = 0, hidden = 0, out = 0;
  Activation activation = Activation::kElu;
  bool tanh_last = false;
  std::vector<std::vector<double>> w_in, b_in, w_out, b_out;  // per sub-step
  std::vector<std::vector<double>> w_shared, b_shared;        // per shared layer
  /// out [R, out] = net_k(in [R, in]) for R rows; h1, h2: scratch of R `hidden` doubles each.
  void forward(int64_t k, const double* in, int64_t rows, double* out, double* h1, double* h2) const;
};

/// The affine preconditioner x = m + L y as float64 arrays (Note [Affine preconditioner]).
struct NativeAffine {
  enum class Kind { kNone, kDiag, kDense, kLowRank };
  Kind kind = Kind::kNone;
  int64_t dim = 0, rank = 0;
  std::vector<double> m;       // [D]
  std::vector<double> scale;   // diag, lowrank: [D]
  std::vector<double> lower;   // dense: L = L0 M [D, D] row-major, lower triangular
  std::vector<double> q;       // lowrank: Q [D, k] row-major
  std::vector<double> em1_t;   // lowrank: exp(t) - 1 [k]
  std::vector<double> em1_nt;  // lowrank: exp(-t) - 1 [k]
  double log_det = 0;          // log|det L|
  /// One row each; tmp: scratch of max(D, k) doubles.
  void to_latent(const double* x, double* y, double* tmp) const;    // y = L^-1 (x - m)
  void from_latent(const double* y, double* x, double* tmp) const;  // x = m + L y
  void latent_grad(const double* g, double* gy, double* tmp) const; // gy = L^T g
};

/// Everything a learned proposal's sampling step reads, copied from a LearnedSampler
/// (LearnedSamplerImpl::propose_native builds and keeps one).
struct NativeLearnedStep {
  int64_t dim = 0, substeps = 0, half_max = 0;
  bool langevin = true;                             // else the no-grad variant
  std::vector<std::vector<int64_t>> upd, cond;      // per sub-step
  NativeStepNet sqt, drift;                         // drift: Langevin only
  NativeAffine affine;
  /// As LearnedSamplerImpl::propose_from(target, x, grad, z0) with eps = exp(log_eps): x [C, D]
  /// (CPU), grad dU(x) [C, D] (Langevin; else undefined), z0 [C, D].
  Proposed propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad, const torch::Tensor& z0,
                   double log_eps) const;
};

}  // namespace nmcmc
