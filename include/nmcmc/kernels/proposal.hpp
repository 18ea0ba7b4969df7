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
class Proposal : public Tunable {
 public:
  /// Whether the chain state must carry the gradient.
  virtual bool uses_grad() const = 0;
  virtual ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) = 0;
  /// Called after each MH step with its outcome (for proposals with internal state).
  virtual void observe(const StepInfo& /*info*/) {}
};

/// Log acceptance below this counts as divergent (Stan's energy-error threshold).
constexpr double kDivergenceThreshold = -1000.0;

/// The Metropolis-Hastings kernel over a batch of chains: any proposal made exact.
class MetropolisHastings : public TuningFrom<Kernel> {
 public:
  explicit MetropolisHastings(std::shared_ptr<Proposal> proposal);

  std::string name() const override { return proposal_->name(); }
  ChainState init(Target& target, const torch::Tensor& x) const override;
  /// One MH step for every chain. The returned state never contains NaN from a proposal.
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;

  /// One proposal and its MH accept probability (the chains do not move).
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override;

  Proposal& proposal() { return *proposal_; }
  const Proposal& proposal() const { return *proposal_; }
  std::shared_ptr<Proposal> proposal_ptr() const { return proposal_; }

 protected:
  Tunable& tuned() const override { return *proposal_; }  // tuning goes to the proposal

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

/// The independence proposal from N(0, I) (a flow transport's global move, Note [Transport
/// warm-up]): every chain proposes z' ~ N(0, I) with its energy and gradient, and
///   log q ratio = log N(x) - log N(z') = (|z'|^2 - |x|^2) / 2     (float64, [C]);
/// decided by mh_accept like every other proposal.
ProposalResult normal_independence_proposal(Target& target, const ChainState& state, at::Generator& gen);

}  // namespace nmcmc
