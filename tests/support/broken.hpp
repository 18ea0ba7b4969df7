#pragma once
// Deliberately broken kernels, for the power of the statistical tests (Note [Invariance tests]):
// each must fail the tests its correct counterpart passes. They live here, not in the library:
// production classes carry no switches to break themselves.
#include <torch/torch.h>

#include <memory>

#include "nmcmc/flows/learned.hpp"
#include "nmcmc/flows/model.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/nuts.hpp"

namespace nmcmc::test_support {

/// A proposal whose log q ratio is altered: set to zero (e.g. MALA without its q ratio) or
/// negated (e.g. HMC with the kinetic-energy difference's sign flipped).
class AlteredRatio : public Proposal {
 public:
  enum class How { kZero, kNegate };
  AlteredRatio(std::shared_ptr<Proposal> inner, How how) : inner_(std::move(inner)), how_(how) {}
  std::string name() const override { return inner_->name() + "-altered"; }
  bool uses_grad() const override { return inner_->uses_grad(); }
  double step_size() const override { return inner_->step_size(); }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  std::shared_ptr<Proposal> inner_;
  How how_;
};

/// HMC whose last momentum kick is a full step instead of a half: not reversible.
class HmcWithoutFinalHalfStep : public ScaledProposal {
 public:
  HmcWithoutFinalHalfStep(double step_size, int64_t leapfrog_steps) : ScaledProposal(step_size), leapfrog_(leapfrog_steps) {}
  std::string name() const override { return "hmc-no-final-half-step"; }
  bool uses_grad() const override { return true; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  int64_t leapfrog_;
};

/// A flow proposal with a wrong density: without the log-determinants (kDropLogDet), with the
/// forward density as the reverse one (kDropReverse), or (preconditioned learned samplers) the
/// reverse density computed with diag(L) only, as a forgotten off-diagonal would (kDiagonalReverse).
enum class FlowDefect { kDropLogDet, kDropReverse, kDiagonalReverse };
class BrokenFlow : public Proposal {
 public:
  BrokenFlow(std::shared_ptr<ProposalModel> model, FlowDefect defect) : model_(std::move(model)), defect_(defect) {}
  std::string name() const override { return "broken-flow"; }
  bool uses_grad() const override { return model_->needs_grad(); }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  std::shared_ptr<ProposalModel> model_;
  FlowDefect defect_;
};

/// The learned proposal with persistent noise (Note [Persistent noise]) whose base draw is not
/// negated after a rejection: the rejected draw is tried again (after its refresh) instead of the
/// reversed one, as GHMC without the momentum flip on rejection.
class PersistenceWithoutFlip : public Proposal {
 public:
  PersistenceWithoutFlip(LearnedSampler sampler, double rho) : sampler_(std::move(sampler)), rho_(rho) {}
  std::string name() const override { return "persistence-without-flip"; }
  bool uses_grad() const override { return sampler_->needs_grad(); }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
  void observe(const StepInfo& info) override;

 private:
  LearnedSampler sampler_;
  double rho_;
  torch::Tensor z_, pending_z0_, pending_rev_;
};

/// NUTS rules that are not exact: the new subtree always taken when valid (no progressive
/// bias), the halves inside a subtree chosen 50:50 whatever their weights, the top-level U-turn
/// check of the merged trajectory skipped (only the seam's checks kept).
NutsRules nuts_without_progressive_bias();
NutsRules nuts_without_subtree_weights();
NutsRules nuts_without_merged_check();
/// The U-turn criterion on p instead of p# = M^{-1} p: wrong with any metric but the unit one.
NutsRules nuts_with_criterion_on_p();
/// No U-turn check inside subtrees, only over the whole trajectory: not reversible.
NutsRules nuts_without_subtree_checks();

}  // namespace nmcmc::test_support
