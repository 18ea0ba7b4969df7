#pragma once
// NUTS's engine (Note [Batched NUTS], kernels/nuts.hpp): the chains' trees in float64 buffers, the
// leaves batched. Private to nuts.cpp, nuts_engine.cpp (the batch: starting transitions, leaves) and
// nuts_tree.cpp (a chain's tree: merging, U-turns, the transition chosen).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/chain_stream.hpp"
#include "nmcmc/kernels/nuts.hpp"

namespace nmcmc {
namespace nuts_engine {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Vec = std::vector<double>;

inline double log_add_exp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

/// a . b over n values with four partial sums (independent additions the compiler can keep in
/// flight: the U-turn checks are most of a leaf's own work on a cheap target).
inline double dot(const double* a, const double* b, size_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += a[j] * b[j];
    s1 += a[j + 1] * b[j + 1];
    s2 += a[j + 2] * b[j + 2];
    s3 += a[j + 3] * b[j + 3];
  }
  for (; j < n; ++j) s0 += a[j] * b[j];
  return (s0 + s1) + (s2 + s3);
}

/// The generalised no-U-turn criterion with rho = r1 (+ r2): p#_minus . rho > 0 and
/// p#_plus . rho > 0, in one pass.
template <bool kTwo>
inline bool no_u_turn_pass(const double* ps_minus, const double* ps_plus, const double* r1, const double* r2, size_t n) {
  double m0 = 0, m1 = 0, p0 = 0, p1 = 0;
  size_t j = 0;
  for (; j + 2 <= n; j += 2) {
    const double a = kTwo ? r1[j] + r2[j] : r1[j], b = kTwo ? r1[j + 1] + r2[j + 1] : r1[j + 1];
    m0 += ps_minus[j] * a;
    m1 += ps_minus[j + 1] * b;
    p0 += ps_plus[j] * a;
    p1 += ps_plus[j + 1] * b;
  }
  for (; j < n; ++j) {
    const double a = kTwo ? r1[j] + r2[j] : r1[j];
    m0 += ps_minus[j] * a;
    p0 += ps_plus[j] * a;
  }
  return p0 + p1 > 0 && m0 + m1 > 0;
}

using Stream = detail::ChainStream;

// Note [NUTS's leaves by reference]
// A leaf of a trajectory (x, p, dU, M^{-1} p, U, H) is written once, by the leapfrog step that
// makes it, into a block of 4 D doubles of its chain's pool, and everything that needs it later
// holds its index: a subtree's first and last leaves (their momenta p and p# for the U-turn
// checks), its multinomial sample, the trajectory's far ends, the four ends of its two parts.
// Taking a leaf as a sample, or a subtree's end as the trajectory's, is an index and a count; a
// leaf goes back to the pool when nothing holds it (the pool is as deep as the stack, a few dozen
// blocks, and reuses the block freed last, still in cache). Only the summed momenta rho are
// vectors of their own. Before (every chain's points and momenta copied into its nodes) a leaf
// moved about twice the memory, and with 64 chains of a 100-d target the copies were a fifth of
// NUTS's sampling time. The arithmetic is the same, operation for operation: the same draws.

/// The leaves of one chain, reference-counted. Indices stay valid as the pool grows; pointers into
/// a block do too (a block is its own allocation), but a Leaf& does not outlive take().
class Pool {
 public:
  struct Leaf {
    Vec v;  // [x | p | dU | M^{-1} p], D each
    double energy = 0, h = 0;
    int refs = 0;
  };
  void init(size_t d) { d_ = d; }
  /// A free leaf, held once (by the caller, who hands the hold to a holder with `move`).
  int take() {
    int i = 0;
    if (free_.empty()) {
      i = static_cast<int>(leaves_.size());
      leaves_.emplace_back();
      leaves_.back().v.assign(4 * d_, 0.0);
    } else {
      i = free_.back();
      free_.pop_back();
    }
    leaves_[static_cast<size_t>(i)].refs = 1;
    return i;
  }
  void drop(int i) {
    if (i >= 0 && --leaves_[static_cast<size_t>(i)].refs == 0) free_.push_back(i);
  }
  /// holder <- i (another hold on i; the holder's old leaf let go).
  void set(int& holder, int i) {
    if (i >= 0) leaves_[static_cast<size_t>(i)].refs += 1;
    drop(holder);
    holder = i;
  }
  /// holder <- i, with the hold the caller has on i.
  void move(int& holder, int i) {
    drop(holder);
    holder = i;
  }
  Leaf& operator[](int i) { return leaves_[static_cast<size_t>(i)]; }
  double* x(int i) { return leaves_[static_cast<size_t>(i)].v.data(); }
  double* p(int i) { return x(i) + d_; }
  double* g(int i) { return x(i) + 2 * d_; }
  double* ps(int i) { return x(i) + 3 * d_; }  // M^{-1} p

 private:
  size_t d_ = 0;
  std::vector<Leaf> leaves_;
  std::vector<int> free_;
};

/// A finished subtree in its chain's direction of extension: its first ("beg") and last ("end")
/// leaves, its summed momentum, its multinomial sample and the log of its summed weights
/// exp(H0 - H). (Stan's build_tree arguments.)
struct Node {
  int64_t level = 0;  // 2^level leaves
  int beg = -1, end = -1, sample = -1;
  Vec rho;
  double log_w = -kInf;
};

/// A finished transition, queued until every chain has made the same one.
struct Done {
  Vec x, grad;
  double energy = 0, h = 0, accept = 0;
  int64_t n_leapfrog = 0, depth = 0;
  bool divergent = false, moved = false;
};

/// One chain's transition as it is built (Stan's transition, iteratively).
struct Chain {
  Stream rng;
  double eps = 0;  // its step size
  Pool pool;
  int start = -1;  // where the transition starts (p: its momentum)
  double h0 = 0;
  int ends[2] = {-1, -1};  // the trajectory's far ends: [0] backward, [1] forward; the integrator extends one
  // The two parts either side of the start (the forward one built with positive steps): the
  // leaves at the forward part's far and seam ends and at the backward part's seam and far ends,
  // and the summed momenta.
  int ff = -1, fb = -1, bf = -1, bb = -1;
  Vec rho, rho_fwd, rho_bck;
  int sample = -1;
  double log_w = 0;
  int64_t depth = 0, d = 0;  // valid subtrees merged; the depth being built
  bool forward = true;
  std::vector<Node> stack;
  int64_t top = 0;
  int64_t n_leapfrog = 0;
  double sum_metro = 0;
  bool divergent = false;
  bool building = false;
  int64_t started = 0;
  std::vector<Done> done;  // a ring of finished transitions not yet handed over
  int64_t done_head = 0, done_count = 0;
  /// The end the integrator extends in this depth's direction.
  int& head() { return ends[forward ? 1 : 0]; }
  int leaf_from = -1;  // the head a leapfrog step starts from, until the new leaf is written
};

/// Stan's choices (NutsRules::stan()) as plain functions, so that the engine can recognise them.
/// Biased progressive sampling: min(1, w_new / w_old).
inline double biased_progressive(double log_w_new, double log_w_old) { return std::min(1.0, std::exp(log_w_new - log_w_old)); }
/// Multinomial: w_new / (w_old + w_new).
inline double multinomial_choice(double log_w_new, double log_w_old) {
  return std::exp(log_w_new - log_add_exp(log_w_old, log_w_new));
}

/// Whether a rule is `f` itself (not a caller's own, e.g. a broken one in a power test).
inline bool rule_is(const NutsRules::Choice& rule, double (*f)(double, double)) {
  const auto* g = rule.target<double (*)(double, double)>();
  return g != nullptr && *g == f;
}

/// The engine: every chain's transitions, the leaves batched.
class Engine {
 public:
  /// eps: each chain's step size ([C]).
  Engine(Target& target, const Metric& metric, const NutsRules& rules, const NutsOptions& options,
         const std::vector<double>& eps, const ChainState& state, at::Generator& gen);

  /// n transitions of every chain, handed over in order; p0: the first transition's momenta.
  void run(int64_t n, int64_t lookahead, const torch::Tensor& p0, const StepCallback& on_step);

  ChainState last;

 private:
  torch::TensorOptions host() const { return torch::TensorOptions().dtype(torch::kFloat64); }

  /// The momentum the U-turn criterion reads at a leaf: p# = M^{-1} p (or p, for rules that ask).
  const double* sharp(Chain& ch, int i) { return rules_.sharp ? ch.pool.ps(i) : ch.pool.p(i); }

  /// Fresh momenta p0 ~ N(0, M) (each chain's normals from its own stream) and the start of a
  /// transition for the chains in `which`.
  void begin(const std::vector<int64_t>& which, const torch::Tensor& given);

  /// M^{-1} v into to(ch), for the vectors v = from(ch) of the chains in `which` (a dense or
  /// low-rank metric: one batched call).
  template <typename From, typename To>
  void velocities(const std::vector<int64_t>& which, From from, To to);

  /// The next extension: a subtree of 2^d leaves in a random direction.
  void begin_depth(Chain& ch, int64_t d);

  /// The second half kick of every chain in `live` with its new gradient (row i of gs, of type
  /// G) and energy, and for a unit or diagonal metric M^{-1} p and H while the row is in cache.
  template <typename G, typename E>
  void kick_rows(const std::vector<int64_t>& live, const G* gs, const E* es);

  /// One leapfrog step of every chain in `live` (Neal 2011, eqs. 5.18-5.20, as the integrator's
  /// leapfrog: half kick, drift with M^{-1} p, half kick) from its head into a new leaf, the
  /// gradient in one batched call of the target, then each chain's bookkeeping. The arithmetic is
  /// float64 on the chains' own buffers; positions are rounded to the target's dtype, so a
  /// chain's x is where U and dU were evaluated.
  void leaves(const std::vector<int64_t>& live);

  /// leaves() with the target's positions of type T (float or double): the batch's positions are
  /// written once in T (a float32 target's rounded x is exact in float: no conversion pass), the
  /// loops without a branch inside.
  template <typename T>
  void leaves_as(const std::vector<int64_t>& live);

  /// Stan's build_tree base case, then the merges it completes.
  void leaf(Chain& ch, int z);

  /// merge() for two single leaves, `init` on the stack and z just computed (momenta p1, p2):
  /// the three U-turn checks of merge() are then one and the same, (p#1, p#2, rho = p1 + p2), so
  /// it is made once (the same arithmetic, bit for bit).
  bool merge_leaf(Chain& ch, Node& init, int z, double w);

  /// Two finished subtrees of equal size, `init` then `fin` in the direction of extension, into
  /// `init`: the multinomial choice inside and the U-turn checks over the merged subtree and
  /// across its two halves (Stan >= 2.23); `fin` lets go of its leaves. Returns whether the
  /// merged subtree is valid.
  bool merge(Chain& ch, Node& init, Node& fin);

  void release(Chain& ch, Node& n);

  /// The subtree of this depth is finished (or failed): merge it into the trajectory, then go
  /// deeper or end the transition.
  void end_subtree(Chain& ch, bool valid);

  void finish(Chain& ch);

  /// The oldest queued transition of every chain, as tensors, to the callback.
  bool hand_over(const StepCallback& on_step);

  Target& target_;
  Metric metric64_;      // the metric in float64 on the CPU, for the chains' buffers
  bool elementwise_;     // unit or diagonal: M^{-1} applied in the loops
  Vec minv_, sqrt_minv_;  // its diagonal (ones for the unit metric) and the square roots
  bool single_;          // a float32 target: positions rounded to float
  torch::Tensor x_host_;  // [C, D] in the target's dtype, on the CPU: the positions of a batch of leaves
  const NutsRules& rules_;
  const bool inside_multinomial_;  // rules_.inside is Stan's: merges reuse their log_add_exp
  const NutsOptions& options_;
  const int64_t c_, d_;
  std::vector<Chain> chains_;
};


}  // namespace nuts_engine
}  // namespace nmcmc
