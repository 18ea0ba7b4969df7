#pragma once
/// The leapfrog integrator: the one HMC, NUTS and the step-size probe run.
#include <torch/torch.h>

#include "nmcmc/core/target.hpp"
#include "nmcmc/kernels/metric.hpp"

namespace nmcmc {

/// A point in phase space for every chain: position and momentum [C, D] (the target's dtype),
/// dU at x [C, D], U(x) [C] float64.
struct PhasePoint {
  torch::Tensor x, p, grad, energy;
};

/// `steps` leapfrog steps (Neal 2011, "MCMC using Hamiltonian dynamics", eqs. 5.18-5.20) with the
/// metric's velocity M^{-1} p: p <- p - (eps/2) dU(x); x <- x + eps M^{-1} p; p <- p - (eps/2) dU(x),
/// the inner half-kicks merged into full ones. `eps` is [1, 1] or a per-chain [C, 1] tensor
/// (negative: backwards in time). One gradient per step; the start's gradient is reused.
PhasePoint leapfrog(Target& target, const Metric& metric, const PhasePoint& start, const torch::Tensor& eps,
                    int64_t steps);

/// H = U(x) + K(p) [C] float64; NaN or -inf become +inf (as Stan treats a NaN energy).
torch::Tensor hamiltonian(const Metric& metric, const PhasePoint& z);

}  // namespace nmcmc
