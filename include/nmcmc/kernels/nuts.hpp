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
// Each chain builds its own tree, iteratively: a stack of finished subtrees of 1, 2, 4, ...
// leaves, merged as a binary counter carries (two of equal size become one, with the inside
// multinomial choice and the three U-turn checks of Stan's build_tree), in plain C++ on the
// chain's own float64 buffers, and so is its leapfrog step (the integrator's steps, Neal 2011,
// eqs. 5.18-5.20; M^{-1} p in the loops for unit and diagonal metrics, one batched call for dense
// and low-rank ones). What is batched is the costly thing: the gradient of every chain that needs
// a leaf, in one [A, D] call of the target. Each chain draws its directions, its choices and its momentum from
// its own stream (splitmix64, seeded from the caller's generator at each call), so a chain's
// transitions do not depend on which other chains share its batches. Each chain's gradient count
// is exact (StepInfo::n_grad_chain).
//
// Note [Asynchronous NUTS chains]
// Chains build trees of different depths, and a batch of chains in lockstep waits for its deepest
// tree (on Funnel-1 a chain needs 22 gradients per transition where its batch needed 61). Given a
// fixed kernel (the sampling phase: step size and metric frozen), a chain's transitions are a
// Markov chain of their own, so run_steps lets a chain that has finished its transition begin its
// next one while others still build theirs, up to `lookahead` transitions ahead of the last one
// handed over; transition i of the run is handed over once every chain has made it. A chain's
// draws are the same as in lockstep (its randomness is its own stream's); only the batches, and
// so the wall time, change. Warm-up adapts the step size after every transition, so it steps in
// lockstep (step(), one transition).
#include <functional>

#include "nmcmc/kernels/integrator.hpp"
#include "nmcmc/kernels/kernel.hpp"
#include "nmcmc/kernels/metric.hpp"

namespace nmcmc {

/// How a NUTS transition chooses its sample: Stan's rules unless a caller asks otherwise. Each is a
/// probability of taking the new part, from log weights (log sums of exp(H0 - H)).
/// multinomial() is the other exact choice (Betancourt 2017, appendix A.3.2: multinomial at the
/// top level too); tests build rules that are not exact (tests/support/broken.hpp) to prove the
/// statistical tests' power.
struct NutsRules {
  using Choice = std::function<double(double log_w_new, double log_w_old)>;
  /// Between the old trajectory and a new valid subtree. Stan: biased progressive sampling,
  /// min(1, w_new / w_old).
  Choice top_level;
  /// Inside a subtree, between its initial and final halves (log_w_old is the initial half's).
  /// Stan: multinomial, w_final / (w_initial + w_final).
  Choice inside;
  /// Whether the U-turn criterion is checked over the whole merged trajectory (Stan: yes), besides
  /// across the seam.
  bool check_merged = true;
  /// Whether each subtree is checked for a U-turn as it is built (Hoffman and Gelman 2014; Stan:
  /// yes). Without it only the whole trajectory is checked, and the transition is not reversible:
  /// a broken variant for the tests (tests/support/broken.hpp), not a choice.
  bool check_inside = true;
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
  /// run_steps: how many transitions a chain may be ahead of the last one handed over (1: the
  /// chains step in lockstep; 0: as many as 64 while the queued draws take at most 64 MiB).
  int64_t lookahead = 0;
  NutsOptions& set_step_size(double e) { step_size = e; return *this; }
  NutsOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
  NutsOptions& set_lookahead(int64_t l) { lookahead = l; return *this; }
};

class Nuts : public Kernel {
 public:
  explicit Nuts(NutsOptions options = {}, NutsRules rules = NutsRules::stan());
  std::string name() const override { return "nuts"; }
  ChainState init(Target& target, const torch::Tensor& x) const override;
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;
  ChainState run_steps(Target& target, ChainState state, int64_t n, at::Generator& gen,
                       const StepCallback& on_step) override;
  /// The transition from a given momentum p0 [C, D] (step() draws p0 ~ N(0, M)): the directions
  /// and multinomial choices still come from `gen`.
  std::pair<ChainState, StepInfo> transition(Target& target, const ChainState& state, const torch::Tensor& p0,
                                             at::Generator& gen);

  /// The step size; where the chains have their own, their mean.
  double step_size() const override { return eps_; }
  bool has_tunable_step_size() const override { return true; }
  void set_step_size(double eps) override {
    eps_ = eps;
    eps_chain_.clear();
  }
  bool has_per_chain_step_size() const override { return true; }
  void set_step_sizes(const std::vector<double>& eps) override;
  std::vector<double> step_sizes() const override { return eps_chain_; }
  bool has_metric() const override { return true; }
  bool has_dense_metric() const override { return true; }
  void set_metric(const Metric& metric) override { metric_ = metric; }
  const Metric& metric() const { return metric_; }
  int64_t max_tree_depth() const override { return options_.max_depth; }
  /// One leapfrog step from fresh momentum: min(1, exp(H0 - H1)) per chain.
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override;

 private:
  /// The engine behind step, transition and run_steps (p0: given momenta for the first transition).
  ChainState run(Target& target, const ChainState& state, int64_t n, int64_t lookahead, at::Generator& gen,
                 const torch::Tensor& p0, const StepCallback& on_step);

  NutsOptions options_;
  NutsRules rules_;
  double eps_;
  std::vector<double> eps_chain_;  // each chain's step size, or empty: eps_ for all
  Metric metric_;
};

}  // namespace nmcmc
