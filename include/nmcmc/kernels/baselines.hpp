#pragma once
/// Baseline proposals: random walk, MALA and HMC (identity or diagonal mass matrix).
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// The state the baselines share: a global step size and an optional inverse mass matrix: [D]
/// diagonal (a variance estimate, in the target's dtype; undefined = identity) or [D, D] dense
/// (a covariance estimate; then `dense_` holds its factors).
class ScaledProposal : public Proposal {
 public:
  explicit ScaledProposal(double step_size) : eps_(step_size) {}
  double step_size() const override { return eps_; }
  bool has_tunable_step_size() const override { return true; }
  void set_step_size(double eps) override { eps_ = eps; }
  bool has_metric() const override { return true; }
  bool has_dense_metric() const override { return true; }
  void set_inv_mass(torch::Tensor inv_mass) override;
  /// The inverse mass matrix: [D], [D, D] or undefined (identity).
  torch::Tensor inv_mass() const { return is_dense() ? dense_.inv_mass() : inv_mass_; }

 protected:
  bool is_dense() const { return dense_.kind() == MetricKind::kDense; }
  double eps_;
  torch::Tensor inv_mass_;  // diagonal [D] (undefined when identity or dense)
  Metric dense_;            // the dense metric, else the unit placeholder
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
/// and the MH correction log q(x|x') - log q(x'|x) computed from both Gaussian densities.
/// With `drop_q_ratio` the q correction is omitted (a deliberately broken kernel for tests).
class Mala : public ScaledProposal {
 public:
  explicit Mala(double step_size, bool drop_q_ratio = false) : ScaledProposal(step_size), drop_q_ratio_(drop_q_ratio) {}
  std::string name() const override { return "mala"; }
  bool uses_grad() const override { return true; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  bool drop_q_ratio_;
};

/// Deliberate errors for power tests of the statistical suite. Never used outside tests.
/// kWrongKineticSign: log q ratio K(pL) - K(p0) instead of K(p0) - K(pL).
/// kNoFinalHalfStep: the last momentum kick is a full step, so the integrator is not reversible.
/// (Dropping the momentum flip is NOT a defect here: with full momentum refresh and
/// K(p) = K(-p) the flip changes neither the accept ratio nor the next state.)
enum class HmcDefect { kNone, kWrongKineticSign, kNoFinalHalfStep };

/// Hamiltonian Monte Carlo with L leapfrog steps and a diagonal (or identity) mass matrix (Neal
/// 2011, "MCMC using Hamiltonian dynamics", Handbook of MCMC ch. 5: leapfrog eqs. 5.18-5.20,
/// accept eq. 5.24). Momentum p ~ N(0, M); K(p) = p^T M^{-1} p / 2; log q ratio = K(p0) - K(pL)
/// (the momentum flip that makes the proposal an involution is implied, K(p) = K(-p)).
class Hmc : public ScaledProposal {
 public:
  Hmc(double step_size, int64_t leapfrog_steps, HmcDefect defect = HmcDefect::kNone);
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

  /// Runs the leapfrog integrator from (x, p) with the state's gradient; returns (x, p, end state).
  /// Exposed for the integrator tests (energy error, reversibility, volume).
  /// `eps` overrides the step size (a scalar or a per-chain [C, 1] tensor).
  std::pair<ChainState, torch::Tensor> leapfrog(Target& target, const ChainState& start,
                                                const torch::Tensor& p0, torch::Tensor eps = {}) const;
  /// K(p) [C] float64.
  torch::Tensor kinetic(const torch::Tensor& p) const;

 private:
  int64_t leapfrog_;
  HmcDefect defect_;
  double jitter_ = 0.0;
};

}  // namespace nmcmc
