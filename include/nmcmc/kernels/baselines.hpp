#pragma once
/// Baseline proposals: random walk, MALA and HMC, with a unit, diagonal, dense or low-rank metric.
#include "nmcmc/kernels/integrator.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// The state the baselines share: a global step size and one Metric (unit, diagonal, dense or
/// low-rank; kernels/metric.hpp), in the target's dtype, with its float64 copy for log densities.
class ScaledProposal : public Proposal {
 public:
  explicit ScaledProposal(double step_size) : eps_(step_size) {}
  double step_size() const override { return eps_; }
  bool has_tunable_step_size() const override { return true; }
  void set_step_size(double eps) override { eps_ = eps; }
  bool has_metric() const override { return true; }
  bool has_dense_metric() const override { return true; }
  void set_metric(const Metric& metric) override;
  /// The inverse mass matrix: [D], [D, D] or undefined (identity).
  torch::Tensor inv_mass() const { return metric_.inv_mass(); }
  const Metric& metric() const { return metric_; }

 protected:
  double eps_;
  /// Moves the metric to x's device where it was given on another (once).
  void follow_device(const torch::Tensor& x);
  Metric metric_;    // the unit metric until set_metric
  Metric metric64_;  // the same in float64
};

/// Random-walk Metropolis: x' = x + eps * M^{-1/2} z (symmetric: log q ratio 0).
class RandomWalk : public ScaledProposal {
 public:
  explicit RandomWalk(double step_size) : ScaledProposal(step_size) {}
  std::string name() const override { return "rwm"; }
  bool uses_grad() const override { return false; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
};

/// Metropolis-adjusted Langevin (Roberts & Tweedie 1996, Bernoulli 2(4), eq. 2.2; Girolami &
/// Calderhead 2011, eq. 10 for the preconditioned form):
///   x' = x - (eps^2/2) M^{-1} dU(x) + eps M^{-1/2} z,   q(x'|x) = N(x'; x - (eps^2/2) M^{-1} dU(x), eps^2 M^{-1}),
/// and the MH correction log q(x|x') - log q(x'|x) computed from both Gaussian densities (float64).
class Mala : public ScaledProposal {
 public:
  explicit Mala(double step_size) : ScaledProposal(step_size) {}
  std::string name() const override { return "mala"; }
  bool uses_grad() const override { return true; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
};

/// Hamiltonian Monte Carlo with L leapfrog steps (kernels/integrator.hpp) and the metric (Neal
/// 2011, "MCMC using Hamiltonian dynamics", Handbook of MCMC ch. 5: leapfrog eqs. 5.18-5.20,
/// accept eq. 5.24). Momentum p ~ N(0, M); K(p) = p^T M^{-1} p / 2; log q ratio = K(p0) - K(pL)
/// (the momentum flip that makes the proposal an involution is implied, K(p) = K(-p)).
class Hmc : public ScaledProposal {
 public:
  Hmc(double step_size, int64_t leapfrog_steps);
  std::string name() const override { return "hmc"; }
  bool uses_grad() const override { return true; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
  int64_t leapfrog_steps() const { return leapfrog_; }
  /// Per-chain step-size jitter: each MH step uses eps * (1 + j * U(-1, 1)) (0 <= j < 1).
  /// Breaks the resonances of a fixed trajectory length (slow mixing on near-Gaussian targets).
  void set_jitter(double jitter) {
    TORCH_CHECK(jitter >= 0 && jitter < 1, "HMC jitter must be in [0, 1), got ", jitter);
    jitter_ = jitter;
  }


 private:
  int64_t leapfrog_;
  double jitter_ = 0.0;
};

}  // namespace nmcmc
