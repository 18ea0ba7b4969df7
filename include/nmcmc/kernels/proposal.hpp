#pragma once
/// Proposals and the one Metropolis-Hastings kernel that makes any of them exact.
//
// Note [Uncalibrated proposals]
// A Proposal returns the proposed state and its log correction
//   log_q_ratio = log q(x | x') - log q(x' | x)        (float64, [C]).
// For HMC the correction is the kinetic-energy difference K(p) - K(p') (momentum flip
// implied). MetropolisHastings then accepts with
//   log a = U(x) - U(x') + log_q_ratio,
// computed in float64. The acceptance formula is written once, here, and tested once.
#include <torch/torch.h>

#include <memory>
#include <string>

#include "nmcmc/core/target.hpp"
#include "nmcmc/kernels/kernel.hpp"

namespace nmcmc {

/// What a proposal returns: the proposed state and log q(x|x') - log q(x'|x) [C] float64.
/// `extra` may carry proposal-specific per-chain statistics (e.g. the flow's log-det).
struct ProposalResult {
  ChainState proposed;
  torch::Tensor log_q_ratio;
};

/// An uncalibrated proposal (see Note [Uncalibrated proposals]).
class Proposal {
 public:
  virtual ~Proposal() = default;
  virtual std::string name() const = 0;
  /// Whether the chain state must carry the gradient.
  virtual bool uses_grad() const = 0;
  virtual ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) = 0;
  /// The proposal's global step size, for reports (0 when it has none).
  virtual double step_size() const { return 0.0; }
  /// Whether warm-up may tune the step size with set_step_size(). A proposal whose step size
  /// is learned or fixed says no, and run_sampler refuses (or, left to itself, skips) adaptation.
  virtual bool has_tunable_step_size() const { return false; }
  /// Sets the step size; throws for proposals without a tunable one (never a silent no-op).
  virtual void set_step_size(double eps);
  /// Whether warm-up may adapt a metric with set_metric().
  virtual bool has_metric() const { return false; }
  /// Whether the metric may be other than diagonal (dense [D, D], low-rank plus diagonal).
  virtual bool has_dense_metric() const { return false; }
  /// Sets the metric, in the target's dtype and device; throws if unsupported.
  virtual void set_metric(const Metric& metric);
  /// set_metric(Metric(inv_mass)): [D] (diagonal) or [D, D] (dense); undefined: the unit metric.
  void set_inv_mass(const torch::Tensor& inv_mass) { set_metric(inv_mass.defined() ? Metric(inv_mass) : Metric()); }
  /// Called after each MH step with its outcome (for proposals with internal state).
  virtual void observe(const StepInfo& /*info*/) {}
};

/// Log acceptance below this counts as divergent (Stan's energy-error threshold).
constexpr double kDivergenceThreshold = -1000.0;

/// The Metropolis-Hastings kernel over a batch of chains: any proposal made exact.
class MetropolisHastings : public Kernel {
 public:
  explicit MetropolisHastings(std::shared_ptr<Proposal> proposal);

  std::string name() const override { return proposal_->name(); }
  ChainState init(Target& target, const torch::Tensor& x) const override;
  /// One MH step for every chain. The returned state never contains NaN from a proposal.
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;

  // Tuning goes to the proposal.
  double step_size() const override { return proposal_->step_size(); }
  bool has_tunable_step_size() const override { return proposal_->has_tunable_step_size(); }
  void set_step_size(double eps) override { proposal_->set_step_size(eps); }
  bool has_metric() const override { return proposal_->has_metric(); }
  bool has_dense_metric() const override { return proposal_->has_dense_metric(); }
  void set_metric(const Metric& metric) override { proposal_->set_metric(metric); }
  /// One proposal and its MH accept probability (the chains do not move).
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override;

  Proposal& proposal() { return *proposal_; }
  const Proposal& proposal() const { return *proposal_; }
  std::shared_ptr<Proposal> proposal_ptr() const { return proposal_; }

 private:
  std::shared_ptr<Proposal> proposal_;
};

/// The Metropolis-Hastings log acceptance ratio, the one place it is written:
///   log a = U(x) - U(x') + log q(x|x') - log q(x'|x)      (float64, [C]).
/// Differentiable when its inputs are (the entropy objective of training uses it too).
torch::Tensor log_acceptance(const torch::Tensor& energy, const torch::Tensor& energy_new,
                             const torch::Tensor& log_q_ratio);

/// Accept/reject given the current and proposed states and the log q ratio: the decision of the
/// kernel, of training's persistent chains and of every figure that shows accepted proposals.
std::pair<ChainState, StepInfo> mh_accept(const ChainState& current, const ProposalResult& proposal,
                                          at::Generator& gen);

}  // namespace nmcmc
