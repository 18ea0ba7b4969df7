#pragma once
/// The No-U-Turn sampler as Stan runs it, batched over chains.
//
// Note [Batched NUTS]
// Hoffman & Gelman (2014, JMLR 15, Algorithm 3: the doubling tree and the no-U-turn idea) in the
// form Stan runs today (stan/mcmc/hmc/nuts/base_nuts.hpp; Betancourt 2017, "A Conceptual
// Introduction to Hamiltonian Monte Carlo", arXiv:1701.02434, appendix A.4):
//  - multinomial sampling of the new state along the trajectory with weights exp(-H): inside a
//    subtree uniformly in proportion to the weights, and *biased progressive sampling* between
//    the old trajectory and a new subtree (the new one is taken with probability
//    min(1, w_new / w_old));
//  - the generalised U-turn criterion on rho = sum of momenta, p#_minus . rho > 0 and
//    p#_plus . rho > 0 with p# = M^{-1} p (Betancourt 2013, arXiv:1304.1920), checked on every
//    merged subtree and, since Stan 2.23, also across the two halves of each merge (rho of one
//    half plus the nearest momentum of the other);
//  - maximum tree depth (default 10); a leaf whose H exceeds H0 by more than 1000 is divergent
//    and ends the trajectory; the reported accept statistic is the mean over all leaves of
//    min(1, exp(H0 - H)).
// Every chain builds its own tree in one [C, D] batch: at each depth every chain still going
// extends in its own random direction; leaves are leapfrog steps of the chains still building
// (the others wait, masked, and are not evaluated: the gradient is computed on the live rows
// only), and each chain's gradient count is exact (StepInfo::n_grad_chain).
#include "nmcmc/kernels/kernel.hpp"
#include "nmcmc/kernels/metric.hpp"

namespace nmcmc {

/// Deliberate errors for the power of the statistical tests; never used outside tests.
/// kUniformTopLevel: the top-level choice between old trajectory and new subtree is multinomial
///   (in proportion to the weights) instead of biased progressive: still exact, but not Stan's.
/// kNoProgressiveBias: the new subtree is always taken when valid (not exact).
/// kNoMergedCheck: the top-level U-turn check skips the merged trajectory, keeping only the
///   checks across the seam (not exact: tree building becomes asymmetric).
/// kNoSubtreeWeights: the choice inside subtrees ignores the weights exp(-H) (not exact).
enum class NutsDefect { kNone, kUniformTopLevel, kNoProgressiveBias, kNoMergedCheck, kNoSubtreeWeights };

struct NutsOptions {
  double step_size = 0.0;      // 0: found at the start of the run (Stan's heuristic)
  int64_t max_depth = 10;
  double max_delta_h = 1000.0;  // divergence threshold on H - H0
  NutsOptions& set_step_size(double e) { step_size = e; return *this; }
  NutsOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
};

class Nuts : public Kernel {
 public:
  explicit Nuts(NutsOptions options = {}, NutsDefect defect = NutsDefect::kNone);
  std::string name() const override { return "nuts"; }
  ChainState init(Target& target, const torch::Tensor& x) const override;
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;

  double step_size() const override { return eps_; }
  bool has_tunable_step_size() const override { return true; }
  void set_step_size(double eps) override { eps_ = eps; }
  bool has_metric() const override { return true; }
  bool has_dense_metric() const override { return true; }
  void set_inv_mass(torch::Tensor inv_mass) override { metric_ = Metric(inv_mass); }
  const Metric& metric() const { return metric_; }
  int64_t max_tree_depth() const override { return options_.max_depth; }
  /// One leapfrog step from fresh momentum: min(1, exp(H0 - H1)) per chain.
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  NutsOptions options_;
  NutsDefect defect_;
  double eps_;
  Metric metric_;
};

}  // namespace nmcmc
