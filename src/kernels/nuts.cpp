#include "nmcmc/kernels/nuts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/chain_stream.hpp"

namespace nmcmc {

namespace detail {
namespace {
/// The ziggurat's tables for N(0, 1), 128 layers (Marsaglia & Tsang 2000): kn, the accept
/// thresholds of a layer's rectangle on a 31-bit magnitude; wn, the scale from that magnitude to
/// x; fn, the density exp(-x^2 / 2) at each layer's edge.
struct Ziggurat {
  static constexpr double kR = 3.442619855899;         // the base layer's edge
  static constexpr double kV = 9.91256303526217e-3;    // each layer's area
  uint32_t kn[128];
  double wn[128], fn[128];
  Ziggurat() {
    const double m1 = 2147483648.0;  // 2^31
    double dn = kR, tn = dn;
    const double q = kV / std::exp(-0.5 * dn * dn);
    kn[0] = static_cast<uint32_t>((dn / q) * m1);
    kn[1] = 0;
    wn[0] = q / m1;
    wn[127] = dn / m1;
    fn[0] = 1.0;
    fn[127] = std::exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(kV / dn + std::exp(-0.5 * dn * dn)));
      kn[i + 1] = static_cast<uint32_t>((dn / tn) * m1);
      tn = dn;
      fn[i] = std::exp(-0.5 * dn * dn);
      wn[i] = dn / m1;
    }
  }
};
const Ziggurat& ziggurat() {
  static const Ziggurat z;
  return z;
}
}  // namespace

double ChainStream::normal() {
  const Ziggurat& z = ziggurat();
  for (;;) {
    const uint64_t b = next();
    const int layer = static_cast<int>(b & 127);
    const auto hz = static_cast<int32_t>(static_cast<uint32_t>(b >> 32));  // a signed 32-bit value
    const uint32_t magnitude = hz < 0 ? 0u - static_cast<uint32_t>(hz) : static_cast<uint32_t>(hz);
    const double x = static_cast<double>(hz) * z.wn[layer];
    if (magnitude < z.kn[layer]) return x;  // inside the layer's rectangle
    if (layer == 0) {  // the tail beyond r (Marsaglia 1964)
      double t = 0, y = 0;
      do {
        t = -std::log(1.0 - uniform()) / Ziggurat::kR;
        y = -std::log(1.0 - uniform());
      } while (y + y < t * t);
      return hz > 0 ? Ziggurat::kR + t : -Ziggurat::kR - t;
    }
    if (z.fn[layer] + uniform() * (z.fn[layer - 1] - z.fn[layer]) < std::exp(-0.5 * x * x)) return x;  // the wedge
  }
}
}  // namespace detail

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Vec = std::vector<double>;

double log_add_exp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

/// a . b over n values with four partial sums (independent additions the compiler can keep in
/// flight: the U-turn checks are most of a leaf's own work on a cheap target).
double dot(const double* a, const double* b, size_t n) {
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
bool no_u_turn_pass(const double* ps_minus, const double* ps_plus, const double* r1, const double* r2, size_t n) {
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
double biased_progressive(double log_w_new, double log_w_old) { return std::min(1.0, std::exp(log_w_new - log_w_old)); }
/// Multinomial: w_new / (w_old + w_new).
double multinomial_choice(double log_w_new, double log_w_old) {
  return std::exp(log_w_new - log_add_exp(log_w_old, log_w_new));
}

/// Whether a rule is `f` itself (not a caller's own, e.g. a broken one in a power test).
bool rule_is(const NutsRules::Choice& rule, double (*f)(double, double)) {
  const auto* g = rule.target<double (*)(double, double)>();
  return g != nullptr && *g == f;
}

/// The engine: every chain's transitions, the leaves batched.
class Engine {
 public:
  Engine(Target& target, const Metric& metric, const NutsRules& rules, const NutsOptions& options, double eps,
         const ChainState& state, at::Generator& gen)
      : target_(target), metric64_(metric.to(torch::TensorOptions().dtype(torch::kFloat64).device(torch::kCPU))),
        elementwise_(metric.kind() == MetricKind::kUnit || metric.kind() == MetricKind::kDiag),
        single_(target.options().dtype() == torch::kFloat32), rules_(rules),
        inside_multinomial_(rule_is(rules.inside, multinomial_choice)), options_(options), eps_(eps),
        c_(state.x.size(0)), d_(state.x.size(1)), chains_(c_) {
    TORCH_CHECK(single_ || target.options().dtype() == torch::kFloat64, "NUTS runs targets in float32 or float64");
    x_host_ = torch::empty({c_, d_}, torch::TensorOptions().dtype(single_ ? torch::kFloat32 : torch::kFloat64));
    minv_.assign(static_cast<size_t>(d_), 1.0);
    if (metric.kind() == MetricKind::kDiag) {
      const torch::Tensor m = metric64_.inv_mass().contiguous();
      TORCH_CHECK(m.numel() == d_, "NUTS: the metric is for ", m.numel(), " dimensions, the chains have ", d_);
      std::memcpy(minv_.data(), m.data_ptr<double>(), static_cast<size_t>(d_) * sizeof(double));
    }
    for (double m : minv_) sqrt_minv_.push_back(std::sqrt(m));
    torch::Tensor x = state.x.to(torch::kCPU, torch::kFloat64).contiguous();
    torch::Tensor g = state.grad.to(torch::kCPU, torch::kFloat64).contiguous();
    torch::Tensor e = state.energy.to(torch::kCPU, torch::kFloat64).contiguous();
    torch::Tensor seeds = rand({c_, 2}, gen, state.energy.options().dtype(torch::kFloat64)).cpu().contiguous();
    const double* xs = x.data_ptr<double>();
    const double* gs = g.data_ptr<double>();
    const double* es = e.data_ptr<double>();
    const double* ss = seeds.data_ptr<double>();
    const size_t d = static_cast<size_t>(d_);
    for (int64_t c = 0; c < c_; ++c) {
      Chain& ch = chains_[c];
      ch.rng.s = static_cast<uint64_t>(ss[2 * c] * 0x1.0p53) ^ (static_cast<uint64_t>(ss[2 * c + 1] * 0x1.0p53) << 11);
      ch.pool.init(d);
      ch.start = ch.pool.take();
      std::memcpy(ch.pool.x(ch.start), xs + c * d_, d * sizeof(double));
      std::memcpy(ch.pool.g(ch.start), gs + c * d_, d * sizeof(double));
      ch.pool[ch.start].energy = es[c];
      for (Vec* v : {&ch.rho, &ch.rho_fwd, &ch.rho_bck}) v->assign(d, 0.0);
      ch.stack.resize(static_cast<size_t>(options_.max_depth) + 1);
    }
  }

  /// n transitions of every chain, handed over in order; p0: the first transition's momenta.
  void run(int64_t n, int64_t lookahead, const torch::Tensor& p0, const StepCallback& on_step) {
    for (Chain& ch : chains_) ch.done.resize(static_cast<size_t>(lookahead));
    int64_t emitted = 0;
    bool first = true;
    std::vector<int64_t> starting, live;
    while (emitted < n) {
      starting.clear();
      for (int64_t c = 0; c < c_; ++c) {
        Chain& ch = chains_[c];
        if (!ch.building && ch.started < n && ch.started - emitted < lookahead) starting.push_back(c);
      }
      if (!starting.empty()) begin(starting, first ? p0 : torch::Tensor());
      first = false;
      live.clear();
      for (int64_t c = 0; c < c_; ++c) {
        if (chains_[c].building) live.push_back(c);
      }
      if (!live.empty()) leaves(live);
      TORCH_CHECK(!starting.empty() || !live.empty() ||
                      std::all_of(chains_.begin(), chains_.end(), [](const Chain& ch) { return ch.done_count > 0; }),
                  "NUTS: no chain can go on (internal error)");
      while (emitted < n && std::all_of(chains_.begin(), chains_.end(), [](const Chain& ch) { return ch.done_count > 0; })) {
        ++emitted;
        if (!hand_over(on_step)) return;
      }
    }
  }

  ChainState last;

 private:
  torch::TensorOptions host() const { return torch::TensorOptions().dtype(torch::kFloat64); }

  /// The momentum the U-turn criterion reads at a leaf: p# = M^{-1} p (or p, for rules that ask).
  const double* sharp(Chain& ch, int i) { return rules_.sharp ? ch.pool.ps(i) : ch.pool.p(i); }

  /// Fresh momenta p0 ~ N(0, M) (each chain's normals from its own stream) and the start of a
  /// transition for the chains in `which`.
  void begin(const std::vector<int64_t>& which, const torch::Tensor& given) {
    const int64_t k = static_cast<int64_t>(which.size());
    const size_t d = static_cast<size_t>(d_);
    if (given.defined()) {
      TORCH_CHECK(k == c_, "NUTS: given momenta need every chain to start");
      const torch::Tensor p0 = given.to(torch::kCPU, torch::kFloat64).contiguous();
      for (int64_t i = 0; i < k; ++i) {
        Chain& ch = chains_[which[i]];
        std::memcpy(ch.pool.p(ch.start), p0.data_ptr<double>() + i * d_, d * sizeof(double));
      }
    } else if (elementwise_) {  // p = M^{1/2} z, M^{1/2} = diag(1 / sqrt(M^{-1}))
      for (int64_t i = 0; i < k; ++i) {
        Chain& ch = chains_[which[i]];
        double* p = ch.pool.p(ch.start);
        for (size_t j = 0; j < d; ++j) p[j] = ch.rng.normal() / sqrt_minv_[j];
      }
    } else {
      torch::Tensor z = torch::empty({k, d_}, host());
      double* zs = z.data_ptr<double>();
      for (int64_t i = 0; i < k; ++i) {
        Stream& rng = chains_[which[i]].rng;
        for (int64_t j = 0; j < d_; ++j) zs[i * d_ + j] = rng.normal();
      }
      const torch::Tensor p0 = metric64_.momentum(z).contiguous();
      for (int64_t i = 0; i < k; ++i) {
        Chain& ch = chains_[which[i]];
        std::memcpy(ch.pool.p(ch.start), p0.data_ptr<double>() + i * d_, d * sizeof(double));
      }
    }
    velocities(which, [](Chain& ch) { return ch.pool.p(ch.start); }, [](Chain& ch) { return ch.pool.ps(ch.start); });
    for (int64_t i = 0; i < k; ++i) {
      Chain& ch = chains_[which[i]];
      Pool& pool = ch.pool;
      const int s = ch.start;
      ch.h0 = pool[s].energy + 0.5 * dot(pool.p(s), pool.ps(s), d);
      pool[s].h = ch.h0;
      for (int* end : {&ch.ends[0], &ch.ends[1], &ch.ff, &ch.fb, &ch.bf, &ch.bb, &ch.sample}) pool.set(*end, s);
      std::memcpy(ch.rho.data(), pool.p(s), d * sizeof(double));
      ch.log_w = 0;  // log exp(H0 - H0)
      ch.depth = 0;
      ch.n_leapfrog = 0;
      ch.sum_metro = 0;
      ch.divergent = false;
      ch.started += 1;
      begin_depth(ch, 0);
    }
  }

  /// M^{-1} v into to(ch), for the vectors v = from(ch) of the chains in `which` (a dense or
  /// low-rank metric: one batched call).
  template <typename From, typename To>
  void velocities(const std::vector<int64_t>& which, From from, To to) {
    const int64_t k = static_cast<int64_t>(which.size());
    const size_t d = static_cast<size_t>(d_);
    if (elementwise_) {
      for (int64_t i = 0; i < k; ++i) {
        Chain& ch = chains_[which[i]];
        const double* v = from(ch);
        double* out = to(ch);
        for (size_t j = 0; j < d; ++j) out[j] = minv_[j] * v[j];
      }
      return;
    }
    torch::Tensor v = torch::empty({k, d_}, host());
    for (int64_t i = 0; i < k; ++i) std::memcpy(v.data_ptr<double>() + i * d_, from(chains_[which[i]]), d * sizeof(double));
    const torch::Tensor out = metric64_.velocity(v).contiguous();
    for (int64_t i = 0; i < k; ++i) std::memcpy(to(chains_[which[i]]), out.data_ptr<double>() + i * d_, d * sizeof(double));
  }

  /// The next extension: a subtree of 2^d leaves in a random direction.
  void begin_depth(Chain& ch, int64_t d) {
    ch.d = d;
    ch.forward = ch.rng.uniform() > 0.5;
    // The old trajectory becomes the backward part (forward extension) or the forward part.
    if (ch.forward) {
      ch.rho_bck = ch.rho;
      std::fill(ch.rho_fwd.begin(), ch.rho_fwd.end(), 0.0);
      ch.pool.set(ch.bf, ch.ff);
    } else {
      ch.rho_fwd = ch.rho;
      std::fill(ch.rho_bck.begin(), ch.rho_bck.end(), 0.0);
      ch.pool.set(ch.fb, ch.bb);
    }
    ch.top = 0;
    ch.building = true;
  }

  /// The second half kick of every chain in `live` with its new gradient (row i of gs, of type
  /// G) and energy, and for a unit or diagonal metric M^{-1} p and H while the row is in cache.
  template <typename G, typename E>
  void kick_rows(const std::vector<int64_t>& live, const G* gs, const E* es) {
    const size_t d = static_cast<size_t>(d_);
    const double* minv = minv_.data();
    for (size_t i = 0; i < live.size(); ++i) {
      Chain& ch = chains_[live[i]];
      const int z = ch.head();
      const double half = 0.5 * (ch.forward ? eps_ : -eps_);
      const G* gt = gs + i * d;
      double *p = ch.pool.p(z), *g = ch.pool.g(z);
      for (size_t j = 0; j < d; ++j) {
        g[j] = static_cast<double>(gt[j]);
        p[j] -= half * g[j];
      }
      ch.pool[z].energy = static_cast<double>(es[i]);
      if (elementwise_) {
        double* v = ch.pool.ps(z);
        for (size_t j = 0; j < d; ++j) v[j] = minv[j] * p[j];
        double two_k = 0;  // in order, one sum (H decides the multinomial weights: kept bit for bit)
        for (size_t j = 0; j < d; ++j) two_k += p[j] * v[j];
        ch.pool[z].h = ch.pool[z].energy + 0.5 * two_k;
      }
    }
  }

  /// One leapfrog step of every chain in `live` (Neal 2011, eqs. 5.18-5.20, as the integrator's
  /// leapfrog: half kick, drift with M^{-1} p, half kick) from its head into a new leaf, the
  /// gradient in one batched call of the target, then each chain's bookkeeping. The arithmetic is
  /// float64 on the chains' own buffers; positions are rounded to the target's dtype, so a
  /// chain's x is where U and dU were evaluated.
  void leaves(const std::vector<int64_t>& live) {
    if (single_) {
      leaves_as<float>(live);
    } else {
      leaves_as<double>(live);
    }
  }

  /// leaves() with the target's positions of type T (float or double): the batch's positions are
  /// written once in T (a float32 target's rounded x is exact in float: no conversion pass), the
  /// loops without a branch inside.
  template <typename T>
  void leaves_as(const std::vector<int64_t>& live) {
    const int64_t a = static_cast<int64_t>(live.size());
    const size_t d = static_cast<size_t>(d_);
    torch::Tensor xh = a == c_ ? x_host_ : x_host_.narrow(0, 0, a);
    T* xs = xh.data_ptr<T>();
    const double* minv = minv_.data();
    // Each chain's new leaf, its half kick p <- p - (eps/2) dU(x) from the head.
    for (int64_t i = 0; i < a; ++i) {
      Chain& ch = chains_[live[i]];
      Pool& pool = ch.pool;
      const int n = pool.take();
      const int h = ch.head();
      const double half = 0.5 * (ch.forward ? eps_ : -eps_);
      const double *hp = pool.p(h), *hg = pool.g(h);
      double* np = pool.p(n);
      if (elementwise_) {  // with the drift x <- x + eps M^{-1} p in the same pass
        const double e = ch.forward ? eps_ : -eps_;
        const double* hx = pool.x(h);
        double* nx = pool.x(n);
        T* row = xs + static_cast<size_t>(i) * d;
        for (size_t j = 0; j < d; ++j) {
          np[j] = hp[j] - half * hg[j];
          const T xt = static_cast<T>(hx[j] + e * (minv[j] * np[j]));
          nx[j] = static_cast<double>(xt);
          row[j] = xt;
        }
      } else {
        for (size_t j = 0; j < d; ++j) np[j] = hp[j] - half * hg[j];
      }
      ch.leaf_from = h;  // the head's hold is let go once the new leaf's position is written
      ch.head() = n;
    }
    if (!elementwise_) {  // the drift with M^{-1} p (into the new leaves' p# for now)
      velocities(live, [](Chain& ch) { return ch.pool.p(ch.head()); }, [](Chain& ch) { return ch.pool.ps(ch.head()); });
      for (int64_t i = 0; i < a; ++i) {
        Chain& ch = chains_[live[i]];
        const int n = ch.head();
        const double e = ch.forward ? eps_ : -eps_;
        const double *hx = ch.pool.x(ch.leaf_from), *v = ch.pool.ps(n);
        double* nx = ch.pool.x(n);
        T* row = xs + static_cast<size_t>(i) * d;
        for (size_t j = 0; j < d; ++j) {
          const T xt = static_cast<T>(hx[j] + e * v[j]);
          nx[j] = static_cast<double>(xt);
          row[j] = xt;
        }
      }
    }
    for (int64_t i = 0; i < a; ++i) {
      Chain& ch = chains_[live[i]];
      ch.pool.drop(ch.leaf_from);
      ch.leaf_from = -1;
    }
    // A CPU target in the batch's dtype takes the batch as it is, and its U and dU are read in
    // place as it gives them (float32 or float64, converted to float64 exactly; any other dtype
    // converted first): at a call per leaf, each LibTorch conversion skipped is a few us of the
    // ~90 us a 64-chain leaf of Funnel-1 takes.
    const bool as_is = target_.options().device().is_cpu() && target_.options().dtype() == x_host_.dtype();
    const EnergyGrad eg = target_.energy_and_grad(as_is ? xh : xh.to(target_.options()));
    auto host_values = [](torch::Tensor t) {
      if (!t.device().is_cpu()) t = t.cpu();
      if (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64) t = t.to(torch::kFloat64);
      return t.contiguous();
    };
    const torch::Tensor e1 = host_values(eg.energy), g1 = host_values(eg.grad);
    TORCH_CHECK(g1.numel() == a * d_ && e1.numel() == a, "NUTS: the target's gradient is not [", a, ", ", d_, "]");
    const bool g32 = g1.scalar_type() == torch::kFloat32, e32 = e1.scalar_type() == torch::kFloat32;
    if (g32 && e32) {
      kick_rows(live, g1.data_ptr<float>(), e1.data_ptr<float>());
    } else if (g32) {
      kick_rows(live, g1.data_ptr<float>(), e1.data_ptr<double>());
    } else if (e32) {
      kick_rows(live, g1.data_ptr<double>(), e1.data_ptr<float>());
    } else {
      kick_rows(live, g1.data_ptr<double>(), e1.data_ptr<double>());
    }
    if (!elementwise_) {
      velocities(live, [](Chain& ch) { return ch.pool.p(ch.head()); }, [](Chain& ch) { return ch.pool.ps(ch.head()); });
      for (int64_t i = 0; i < a; ++i) {
        Chain& ch = chains_[live[i]];
        const int z = ch.head();
        ch.pool[z].h = ch.pool[z].energy + 0.5 * dot(ch.pool.p(z), ch.pool.ps(z), d);
      }
    }
    for (int64_t i = 0; i < a; ++i) {
      Chain& ch = chains_[live[i]];
      const int z = ch.head();
      if (!std::isfinite(ch.pool[z].h)) ch.pool[z].h = kInf;  // a NaN or infinite H: weight 0, divergent
      leaf(ch, z);
    }
  }

  /// Stan's build_tree base case, then the merges it completes.
  void leaf(Chain& ch, int z) {
    Pool& pool = ch.pool;
    const double w = ch.h0 - pool[z].h;  // log weight
    const bool div = -w > options_.max_delta_h;
    ch.n_leapfrog += 1;
    ch.sum_metro += std::exp(std::min(w, 0.0));
    if (div) {
      ch.divergent = true;
      end_subtree(ch, false);
      return;
    }
    if (ch.top >= 1 && ch.stack[static_cast<size_t>(ch.top - 1)].level == 0) {
      // The second leaf of a pair: merged with the first without a node of its own.
      if (!merge_leaf(ch, ch.stack[static_cast<size_t>(ch.top - 1)], z, w)) {
        end_subtree(ch, false);
        return;
      }
    } else {
      // The first leaf of a pair (or the whole subtree at depth 0): its first leaf and its sample.
      Node& n = ch.stack[static_cast<size_t>(ch.top++)];
      n.level = 0;
      pool.set(n.beg, z);
      pool.set(n.sample, z);
      n.log_w = w;
    }
    while (ch.top >= 2 && ch.stack[ch.top - 1].level == ch.stack[ch.top - 2].level) {
      const bool valid = merge(ch, ch.stack[ch.top - 2], ch.stack[ch.top - 1]);
      ch.top -= 1;
      if (!valid) {
        end_subtree(ch, false);
        return;
      }
    }
    if (ch.top == 1 && ch.stack[0].level == ch.d) {
      Node& n = ch.stack[0];
      if (n.level == 0) {  // a one-leaf subtree: its end is its beginning
        pool.set(n.end, n.beg);
        n.rho.assign(pool.p(n.beg), pool.p(n.beg) + d_);
      }
      end_subtree(ch, true);
    }
  }

  /// merge() for two single leaves, `init` on the stack and z just computed (momenta p1, p2):
  /// the three U-turn checks of merge() are then one and the same, (p#1, p#2, rho = p1 + p2), so
  /// it is made once (the same arithmetic, bit for bit).
  bool merge_leaf(Chain& ch, Node& init, int z, double w) {
    Pool& pool = ch.pool;
    const size_t d = static_cast<size_t>(d_);
    const double log_w = log_add_exp(init.log_w, w);
    // Stan's multinomial choice is exp(w - log_w), log_w as just computed (the same operations).
    const double take = inside_multinomial_ ? std::exp(w - log_w) : rules_.inside(w, init.log_w);
    if (ch.rng.uniform() < take) pool.set(init.sample, z);
    const double *p1 = pool.p(init.beg), *p2 = pool.p(z);
    const bool persist = no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, z), p1, p2, d);
    init.rho.resize(d);
    for (size_t j = 0; j < d; ++j) init.rho[j] = p1[j] + p2[j];
    pool.set(init.end, z);
    init.log_w = log_w;
    init.level = 1;
    return persist;
  }

  /// Two finished subtrees of equal size, `init` then `fin` in the direction of extension, into
  /// `init`: the multinomial choice inside and the U-turn checks over the merged subtree and
  /// across its two halves (Stan >= 2.23); `fin` lets go of its leaves. Returns whether the
  /// merged subtree is valid.
  bool merge(Chain& ch, Node& init, Node& fin) {
    const size_t d = static_cast<size_t>(d_);
    const double log_w = log_add_exp(init.log_w, fin.log_w);
    const double take = inside_multinomial_ ? std::exp(fin.log_w - log_w) : rules_.inside(fin.log_w, init.log_w);
    if (ch.rng.uniform() < take) std::swap(init.sample, fin.sample);
    bool persist = no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, fin.end), init.rho.data(), fin.rho.data(), d);
    persist = persist && no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, fin.beg), init.rho.data(), ch.pool.p(fin.beg), d);
    persist = persist && no_u_turn_pass<true>(sharp(ch, init.end), sharp(ch, fin.end), fin.rho.data(), ch.pool.p(init.end), d);
    for (size_t j = 0; j < d; ++j) init.rho[j] += fin.rho[j];
    std::swap(init.end, fin.end);
    init.log_w = log_w;
    init.level += 1;
    release(ch, fin);
    return persist;
  }

  void release(Chain& ch, Node& n) {
    for (int* i : {&n.beg, &n.end, &n.sample}) ch.pool.set(*i, -1);
  }

  /// The subtree of this depth is finished (or failed): merge it into the trajectory, then go
  /// deeper or end the transition.
  void end_subtree(Chain& ch, bool valid) {
    ch.building = false;
    if (!valid) {  // an invalid subtree ends the trajectory and is not used
      finish(ch);
      return;
    }
    Pool& pool = ch.pool;
    const size_t d = static_cast<size_t>(d_);
    Node& sub = ch.stack[0];
    if (ch.forward) {
      std::swap(ch.rho_fwd, sub.rho);
      pool.set(ch.fb, sub.beg);
      pool.set(ch.ff, sub.end);
    } else {
      std::swap(ch.rho_bck, sub.rho);
      pool.set(ch.bf, sub.beg);
      pool.set(ch.bb, sub.end);
    }
    ch.depth += 1;
    // Between the old trajectory and the new subtree (Stan: biased progressive sampling).
    if (ch.rng.uniform() < rules_.top_level(sub.log_w, ch.log_w)) std::swap(ch.sample, sub.sample);
    ch.log_w = log_add_exp(ch.log_w, sub.log_w);
    release(ch, sub);
    ch.top = 0;
    for (size_t j = 0; j < d; ++j) ch.rho[j] = ch.rho_bck[j] + ch.rho_fwd[j];
    // The U-turn criterion over the merged trajectory and across the seam.
    bool persist = !rules_.check_merged || no_u_turn_pass<false>(sharp(ch, ch.bb), sharp(ch, ch.ff), ch.rho.data(), nullptr, d);
    persist = persist && no_u_turn_pass<true>(sharp(ch, ch.bb), sharp(ch, ch.fb), ch.rho_bck.data(), pool.p(ch.fb), d);
    persist = persist && no_u_turn_pass<true>(sharp(ch, ch.bf), sharp(ch, ch.ff), ch.rho_fwd.data(), pool.p(ch.bf), d);
    if (persist && ch.d + 1 < options_.max_depth) {
      begin_depth(ch, ch.d + 1);
    } else {
      finish(ch);
    }
  }

  void finish(Chain& ch) {
    ch.building = false;
    Pool& pool = ch.pool;
    const size_t d = static_cast<size_t>(d_);
    Done& r = ch.done[static_cast<size_t>((ch.done_head + ch.done_count) % static_cast<int64_t>(ch.done.size()))];
    ch.done_count += 1;
    const int s = ch.sample;
    r.x.assign(pool.x(s), pool.x(s) + d);
    r.grad.assign(pool.g(s), pool.g(s) + d);
    r.energy = pool[s].energy;
    r.h = pool[s].h;
    const double accept = ch.sum_metro / static_cast<double>(ch.n_leapfrog);
    r.accept = std::isfinite(accept) ? std::clamp(accept, 0.0, 1.0) : 0.0;
    r.n_leapfrog = ch.n_leapfrog;
    r.depth = ch.depth;
    r.divergent = ch.divergent;
    r.moved = s != ch.start && !std::equal(pool.x(s), pool.x(s) + d, pool.x(ch.start));
    // Every leaf let go but the sample, where the next transition starts.
    for (int64_t t = 0; t < ch.top; ++t) release(ch, ch.stack[static_cast<size_t>(t)]);
    ch.top = 0;
    for (int* end : {&ch.ends[0], &ch.ends[1], &ch.ff, &ch.fb, &ch.bf, &ch.bb}) pool.set(*end, -1);
    pool.move(ch.start, s);
    ch.sample = -1;
  }

  /// The oldest queued transition of every chain, as tensors, to the callback.
  bool hand_over(const StepCallback& on_step) {
    // On the CPU the tensors are made in their final dtype and filled in place (a draw of a cheap
    // target costs less than a dozen tensor conversions); on another device they are moved there.
    const torch::ScalarType xt = single_ ? torch::kFloat32 : torch::kFloat64;
    torch::Tensor x = torch::empty({c_, d_}, torch::TensorOptions().dtype(xt));
    torch::Tensor g = torch::empty({c_, d_}, torch::TensorOptions().dtype(xt));
    torch::Tensor e = torch::empty({c_}, host()), h = torch::empty({c_}, host()), acc = torch::empty({c_}, host());
    torch::Tensor nl = torch::empty({c_}, torch::kInt64), depth = torch::empty({c_}, torch::kInt64);
    torch::Tensor div = torch::empty({c_}, torch::kBool), moved = torch::empty({c_}, torch::kBool);
    double *es = e.data_ptr<double>(), *hs = h.data_ptr<double>(), *as = acc.data_ptr<double>();
    int64_t *ns = nl.data_ptr<int64_t>(), *ds = depth.data_ptr<int64_t>();
    bool *vs = div.data_ptr<bool>(), *ms = moved.data_ptr<bool>();
    const size_t d = static_cast<size_t>(d_);
    int64_t most = 0;
    for (int64_t c = 0; c < c_; ++c) {
      Chain& ch = chains_[c];
      const Done& r = ch.done[static_cast<size_t>(ch.done_head)];
      if (single_) {  // x and dU were float32 values (the target's): exact
        float *xr = x.data_ptr<float>() + c * d_, *gr = g.data_ptr<float>() + c * d_;
        for (size_t j = 0; j < d; ++j) {
          xr[j] = static_cast<float>(r.x[j]);
          gr[j] = static_cast<float>(r.grad[j]);
        }
      } else {
        std::memcpy(x.data_ptr<double>() + c * d_, r.x.data(), d * sizeof(double));
        std::memcpy(g.data_ptr<double>() + c * d_, r.grad.data(), d * sizeof(double));
      }
      es[c] = r.energy;
      hs[c] = r.h;
      as[c] = r.accept;
      ns[c] = r.n_leapfrog;
      ds[c] = r.depth;
      vs[c] = r.divergent;
      ms[c] = r.moved;
      most = std::max(most, r.n_leapfrog);
      ch.done_head = (ch.done_head + 1) % static_cast<int64_t>(ch.done.size());
      ch.done_count -= 1;
    }
    const torch::Device dev = target_.options().device();
    auto there = [&](const torch::Tensor& t) { return dev.is_cpu() ? t : t.to(dev); };
    last.x = x.to(target_.options());
    last.grad = g.to(target_.options());
    last.energy = there(e);
    StepInfo info;
    info.accept_prob = there(acc);
    info.accepted = there(moved);
    info.divergent = there(div);
    info.n_grad_chain = there(nl);
    info.n_grad = most;
    info.tree_depth = there(depth);
    info.energy = there(h);
    return on_step(last, info);
  }

  Target& target_;
  Metric metric64_;      // the metric in float64 on the CPU, for the chains' buffers
  bool elementwise_;     // unit or diagonal: M^{-1} applied in the loops
  Vec minv_, sqrt_minv_;  // its diagonal (ones for the unit metric) and the square roots
  bool single_;          // a float32 target: positions rounded to float
  torch::Tensor x_host_;  // [C, D] in the target's dtype, on the CPU: the positions of a batch of leaves
  const NutsRules& rules_;
  const bool inside_multinomial_;  // rules_.inside is Stan's: merges reuse their log_add_exp
  const NutsOptions& options_;
  const double eps_;
  const int64_t c_, d_;
  std::vector<Chain> chains_;
};

}  // namespace

NutsRules NutsRules::stan() {
  NutsRules r;
  r.top_level = biased_progressive;
  r.inside = multinomial_choice;
  return r;
}

NutsRules NutsRules::multinomial() {
  NutsRules r = stan();
  r.top_level = r.inside;
  return r;
}

Nuts::Nuts(NutsOptions options, NutsRules rules) : options_(options), rules_(std::move(rules)), eps_(options.step_size) {
  TORCH_CHECK(options.max_depth >= 1, "NUTS needs a maximum tree depth of at least 1, got ", options.max_depth);
  TORCH_CHECK(options.step_size >= 0, "NUTS step size must be non-negative");
  TORCH_CHECK(options.lookahead >= 0, "NUTS lookahead must be non-negative, got ", options.lookahead);
  TORCH_CHECK(rules_.top_level && rules_.inside, "NUTS rules need both choices");
}

ChainState Nuts::init(Target& target, const torch::Tensor& x) const {
  torch::NoGradGuard no_grad;
  ChainState s;
  s.x = x.to(target.options()).contiguous();
  auto eg = target.energy_and_grad(s.x);
  s.energy = eg.energy.to(torch::kFloat64);
  s.grad = eg.grad;
  return s;
}

torch::Tensor Nuts::probe_accept(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Metric metric = metric_.to(state.x.options());
  torch::Tensor p = metric.momentum(randn(state.x.sizes(), gen, state.x.options()));
  torch::Tensor h0 = state.energy + metric.kinetic(p);
  const PhasePoint z1 =
      leapfrog(target, metric, {state.x, p, state.grad, state.energy}, torch::full({1, 1}, eps_, state.x.options()), 1);
  torch::Tensor dh = h0 - (z1.energy + metric.kinetic(z1.p));
  return torch::exp(torch::clamp_max(torch::nan_to_num(dh, -kInf, 0.0, -kInf), 0.0));
}

ChainState Nuts::run(Target& target, const ChainState& state, int64_t n, int64_t lookahead, at::Generator& gen,
                     const torch::Tensor& p0, const StepCallback& on_step) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(eps_ > 0, "NUTS needs a positive step size");
  TORCH_CHECK(state.x.dim() == 2 && state.grad.defined(), "NUTS needs a [C, D] state with its gradient");
  if (n <= 0) return state;
  const Metric metric = metric_.to(target.options());
  Engine engine(target, metric, rules_, options_, eps_, state, gen);
  engine.run(n, lookahead, p0, on_step);
  return engine.last.x.defined() ? engine.last : state;
}

std::pair<ChainState, StepInfo> Nuts::transition(Target& target, const ChainState& state, const torch::Tensor& p0,
                                                 at::Generator& gen) {
  TORCH_CHECK(p0.sizes() == state.x.sizes(), "NUTS transition: p0 must be [C, D] as x");
  StepInfo info;
  ChainState next = run(target, state, 1, 1, gen, p0, [&](const ChainState&, const StepInfo& i) {
    info = i;
    return true;
  });
  return {next, info};
}

std::pair<ChainState, StepInfo> Nuts::step(Target& target, const ChainState& state, at::Generator& gen) {
  StepInfo info;
  ChainState next = run(target, state, 1, 1, gen, torch::Tensor(), [&](const ChainState&, const StepInfo& i) {
    info = i;
    return true;
  });
  return {next, info};
}

ChainState Nuts::run_steps(Target& target, ChainState state, int64_t n, at::Generator& gen,
                           const StepCallback& on_step) {
  int64_t lookahead = options_.lookahead;
  if (lookahead == 0) {  // as many as 64, while the queued draws (x and dU) take at most 64 MiB
    const double bytes_per_transition =
        static_cast<double>(state.x.size(0)) * (16.0 * static_cast<double>(state.x.size(1)) + 128.0);
    lookahead = std::clamp<int64_t>(static_cast<int64_t>(double(int64_t{64} << 20) / bytes_per_transition), 1, 64);
  }
  return run(target, state, n, lookahead, gen, torch::Tensor(), on_step);
}

}  // namespace nmcmc
