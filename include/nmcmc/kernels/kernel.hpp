#pragma once
/// What every MCMC kernel shares: the chain state it carries, what it reports, and the interface
/// run_sampler, adaptation and the diagnostics use (BlackJAX-style init + step).
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>

#include "nmcmc/core/target.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/kernels/tunable.hpp"

namespace nmcmc {

/// Carried from step to step. x [C, D] in the target's dtype; energy [C] float64;
/// grad [C, D] (undefined for proposals that do not use the gradient).
struct ChainState {
  torch::Tensor x;
  torch::Tensor energy;
  torch::Tensor grad;
};

/// Reported by a step, never fed back. Tensors are [C].
struct StepInfo {
  torch::Tensor accept_prob;  // float64, min(1, a); 0 for divergent proposals
  torch::Tensor accepted;     // bool
  torch::Tensor divergent;    // bool: non-finite energy/ratio, or log a < -1000
  int64_t n_grad = 0;         // target gradient evaluations per chain spent in this step
  int64_t n_energy = 0;       // target energy evaluations per chain spent in this step
  // Kernels whose chains spend different amounts (NUTS) also report, per chain:
  torch::Tensor n_grad_chain;  // [C] int64, exact gradient evaluations of each chain (n_grad: their maximum)
  torch::Tensor tree_depth;    // [C] int64
  torch::Tensor energy;        // [C] float64, the Hamiltonian at the new state
};

/// Receives the transitions of a multi-step run in order (the state after the i-th transition of
/// every chain, and what it reported); returning false stops the run.
using StepCallback = std::function<bool(const ChainState& state, const StepInfo& info)>;

/// A Markov kernel over a batch of chains: MetropolisHastings (any proposal) or Nuts.
/// Its step size and metric: Tunable.
class Kernel : public Tunable {
 public:
  /// Evaluates U (and dU if needed) at x [C, D] to start chains there.
  virtual ChainState init(Target& target, const torch::Tensor& x) const = 0;
  /// One transition of every chain. The returned state never contains NaN.
  virtual std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) = 0;
  /// `n` transitions of every chain from `state` with the kernel held fixed, each handed to
  /// `on_step` in order as soon as every chain has made it; returns the last state handed over
  /// (`state` itself if none was). The default calls step() n times; NUTS lets its chains run
  /// ahead of each other instead of waiting for the deepest tree (Note [Asynchronous NUTS chains]).
  virtual ChainState run_steps(Target& target, ChainState state, int64_t n, at::Generator& gen,
                               const StepCallback& on_step);

  /// The tree-depth limit of tree-building kernels (NUTS); 0 for the others.
  virtual int64_t max_tree_depth() const { return 0; }
  /// Accept probability [C] of one trial move from `state` at the current step size, without
  /// moving the chains: what Stan's initial step-size heuristic looks at.
  virtual torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen);
};

}  // namespace nmcmc
