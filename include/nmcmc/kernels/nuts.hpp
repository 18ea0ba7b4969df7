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
#include <functional>

#include "nmcmc/kernels/integrator.hpp"
#include "nmcmc/kernels/kernel.hpp"
#include "nmcmc/kernels/metric.hpp"

namespace nmcmc {

/// How a NUTS transition chooses its sample: Stan's rules unless a caller asks otherwise. Each is a
/// probability of taking the new part, from log weights ([C] float64 in, [C] float64 out).
/// multinomial() is the other exact choice (Betancourt 2017, appendix A.3.2: multinomial at the
/// top level too); tests build rules that are not exact (tests/support/broken.hpp) to prove the
/// statistical tests' power.
struct NutsRules {
  using Choice = std::function<torch::Tensor(const torch::Tensor& log_w_new, const torch::Tensor& log_w_old)>;
  /// Between the old trajectory and a new valid subtree. Stan: biased progressive sampling,
  /// min(1, w_new / w_old).
  Choice top_level;
  /// Inside a subtree, between its initial and final halves (log_w_old is the initial half's).
  /// Stan: multinomial, w_final / (w_initial + w_final).
  Choice inside;
  /// Whether the U-turn criterion is checked over the whole merged trajectory (Stan: yes), besides
  /// across the seam.
  bool check_merged = true;
  /// Whether the criterion uses p# = M^{-1} p (Betancourt 2013: right for any metric; Stan) or p
  /// itself (the original criterion, right only for the unit metric).
  bool sharp = true;
  static NutsRules stan();
  static NutsRules multinomial();
};

struct NutsOptions {
  double step_size = 0.0;      // 0: found at the start of the run (Stan's heuristic)
  int64_t max_depth = 10;
  double max_delta_h = 1000.0;  // divergence threshold on H - H0
  NutsOptions& set_step_size(double e) { step_size = e; return *this; }
  NutsOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
};

class Nuts : public Kernel {
 public:
  explicit Nuts(NutsOptions options = {}, NutsRules rules = NutsRules::stan());
  std::string name() const override { return "nuts"; }
  ChainState init(Target& target, const torch::Tensor& x) const override;
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;
  /// The transition from a given momentum p0 [C, D] (step() draws p0 ~ N(0, M) and calls this):
  /// the directions and multinomial choices still come from `gen`.
  std::pair<ChainState, StepInfo> transition(Target& target, const ChainState& state, const torch::Tensor& p0,
                                             at::Generator& gen);

  double step_size() const override { return eps_; }
  bool has_tunable_step_size() const override { return true; }
  void set_step_size(double eps) override { eps_ = eps; }
  bool has_metric() const override { return true; }
  bool has_dense_metric() const override { return true; }
  void set_metric(const Metric& metric) override { metric_ = metric; }
  const Metric& metric() const { return metric_; }
  int64_t max_tree_depth() const override { return options_.max_depth; }
  /// One leapfrog step from fresh momentum: min(1, exp(H0 - H1)) per chain.
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  NutsOptions options_;
  NutsRules rules_;
  double eps_;
  Metric metric_;
};

}  // namespace nmcmc
