#include "nmcmc/targets/script_program.hpp"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "nmcmc/core/errors.hpp"

// Note [Native engine]
// A small model's energy written as tensor operations costs LibTorch 2-10 microseconds per
// operation in dispatch and autograd bookkeeping, whatever the arithmetic: posteriordb's eight
// schools, ~25 operations on [4, 10] arrays, took 137 us per batched call of energy and gradient,
// where Stan's compiled gradient takes 2-3 us. This evaluator is the "compiled code" for such
// models. `compile` freezes the module (buffers and attributes become constants, methods are
// inlined), folds what is constant and turns each node of the graph into an instruction; `run`
// executes them on float64 arrays (contiguous, row-major, owned: a view is a copy, there is no
// mutation) and records every operation that depends on x on a tape, which the backward pass
// walks in reverse. Control flow over ints (prim::Loop, prim::If) is executed, not unrolled, so a
// 200-step recursion records 200 steps per call. Arrays and the tape keep their storage from call
// to call: after the first call a run allocates nothing.
// Anything outside the covered operations makes `compile` return nullptr (the module then runs
// on LibTorch); a shape only known at run time that the evaluator does not cover (matmul of 3-d
// arrays) throws NotCovered, on which the target goes back to LibTorch for good. TorchScriptTarget
// checks the compiled program against LibTorch's autograd before using it (make_torchscript_target).

namespace nmcmc {

namespace {

namespace jit = torch::jit;
using Shape = std::vector<int64_t>;
constexpr int kMaxDim = 8;

using NotCovered = ScriptProgram::NotCovered;
/// An operation outside the evaluator, found at compile time.
struct Unsupported {
  std::string why;
};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t k : s) n *= k;
  return n;
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t k = 0; k < s.size(); ++k) t += (k ? ", " : "") + std::to_string(s[k]);
  return t + "]";
}

int64_t wrap_dim(int64_t d, int64_t nd) {
  const int64_t n = std::max<int64_t>(nd, 1);
  if (d < -n || d >= n) throw std::runtime_error("dimension " + std::to_string(d) + " out of range for " + std::to_string(nd) + "-d array");
  return d < 0 ? d + n : d;
}

enum class Op : uint8_t {
  kBin,      // tensor (op) tensor, broadcasting; s0 = alpha
  kBinS,     // tensor (op) scalar register
  kUnary,
  kSoftplus,
  kSum,
  kMean,
  kLogSumExp,
  kSelect,
  kSlice,
  kReshape,   // view, reshape, flatten, squeeze, unsqueeze, contiguous, clone: same values, new shape
  kPermute,   // t, transpose
  kExpand,
  kStack,
  kCat,
  kMatmul,
  kIndexSelect,  // index_select(self, dim, index), index(self, [None, ..., index, ...])
  kFullLike,  // full_like, zeros_like, ones_like: s0 the value
  kScalar,
  kSize,      // aten::size(Tensor, int) / aten::len(Tensor)
  kSizes,     // aten::size(Tensor) -> int[]
  kDim,
  kNumel,
  kListGet,
  kListLen,
  kListConstruct,
  kLoop,
  kIf,
  kRaise,
  kEye,        // eye(n[, m], ...): dtype, layout and device ignored (its values are exact in any)
  kDiagonal,   // diagonal(self, offset, dim1, dim2)
  kCholesky,   // linalg_cholesky(self, upper), cholesky(self, upper)
  kTriSolve,   // linalg_solve_triangular(A, B, upper, left, unitriangular)
  kNop,        // prim::dtype, prim::device: their results only feed arguments the evaluator ignores
};

enum Sub : uint8_t {
  // binary
  kAdd, kSubtract, kRSub, kMul, kDiv, kPow, kRPow,
  // unary
  kNeg, kExp, kLog, kLog1p, kExpm1, kSqrt, kRsqrt, kSigmoid, kLogSigmoid, kTanh, kAbs, kSin, kCos, kRecip, kErf,
  kSquare, kRelu,
  // scalar
  kSAdd, kSSub, kSMul, kSDiv, kSFloorDiv, kSRem, kSNeg, kSLt, kSGt, kSLe, kSGe, kSEq, kSNe, kSNot, kSAnd, kSOr,
  kSDeriveIndex, kSRangeLength, kSCast, kSPow,
};

struct Reg {
  enum Kind : uint8_t { kNone, kInt, kDouble, kBool, kTensor, kIntList, kTensorList, kString, kIndex, kIndexList };
  Kind kind = kNone;
  int64_t i = 0;  // int, bool, tensor id, string index, index array
  double d = 0;
  std::vector<int64_t> list;  // ints; tensor ids; kIndexList: index arrays, -1 for None
};

/// A constant integer tensor (indices into the data, e.g. a hierarchical model's group of each row).
struct IndexArr {
  Shape shape;
  std::vector<int64_t> v;
};

struct Instr;
struct Block {
  std::vector<int> params;
  std::vector<Instr> body;
  std::vector<int> rets;
};
struct Instr {
  Op op;
  uint8_t sub = 0;
  bool int_result = false;  // kScalar: the result is an int (else a double, or a bool for comparisons)
  std::vector<int> in, out;
  std::vector<Block> blocks;
};

struct Arr {
  Shape shape;
  std::vector<double> v, g;
  bool needs = false;  // depends on x
};

/// One recorded operation: enough to run its backward.
struct Rec {
  Op op;
  uint8_t sub;
  int out, a, b;
  double s0, s1;
  int64_t p0, p1, p2;
};

/// Strides (in elements) of a contiguous array of shape `in` aligned to the right of `out`'s
/// dimensions; 0 where `in` is broadcast.
void broadcast_strides(const Shape& in, const Shape& out, int64_t* st) {
  const int64_t nd = static_cast<int64_t>(out.size()), off = nd - static_cast<int64_t>(in.size());
  int64_t s = 1;
  for (int64_t k = nd - 1; k >= 0; --k) {
    const int64_t j = k - off;
    if (j < 0) {
      st[k] = 0;
      continue;
    }
    st[k] = in[j] == 1 && out[k] != 1 ? 0 : s;
    s *= in[j];
  }
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t k = 0; k < nd; ++k) {
    const int64_t da = k + a.size() >= nd ? a[k + a.size() - nd] : 1;
    const int64_t db = k + b.size() >= nd ? b[k + b.size() - nd] : 1;
    if (da != db && da != 1 && db != 1) {
      throw std::runtime_error("shapes " + shape_text(a) + " and " + shape_text(b) + " do not broadcast");
    }
    out[k] = da == 1 ? db : da;
  }
  return out;
}

/// Calls f(o, ia, ib) for every element o of `shape` (row-major) with the offsets that strides sa,
/// sb give.
template <typename F>
void each(const Shape& shape, const int64_t* sa, const int64_t* sb, F&& f) {
  const int nd = static_cast<int>(shape.size());
  const int64_t n = numel_of(shape);
  if (n == 0) return;
  std::array<int64_t, kMaxDim> idx{};
  int64_t ia = 0, ib = 0;
  for (int64_t o = 0; o < n; ++o) {
    f(o, ia, ib);
    for (int k = nd - 1; k >= 0; --k) {
      ia += sa[k];
      ib += sb[k];
      if (++idx[k] < shape[k]) break;
      ia -= sa[k] * shape[k];
      ib -= sb[k] * shape[k];
      idx[k] = 0;
    }
  }
}

/// How an operand of a broadcasting operation lies in its output, seen as R rows of K: every
/// element (kFull), one per column (kTail: the output's trailing dimensions), one per row
/// (kHead: its leading dimensions), or one value (kScalar).
enum Lay : int { kFull = 0, kTail = 1, kHead = 2, kScalar = 3 };

/// The layout of `s` in `out`; `size` is its number of elements. false: none of the four.
bool layout_of(const Shape& s, const Shape& out, Lay& lay, int64_t& size) {
  size = numel_of(s);
  const int64_t n = numel_of(out);
  if (size == n) return lay = kFull, true;
  if (size == 1) return lay = kScalar, true;
  const size_t nd = out.size(), off = nd - s.size();
  size_t first = 0;  // the first dimension of `s` (aligned to out) that is not 1
  while (first < s.size() && s[first] == 1) ++first;
  bool tail = true;
  for (size_t k = first; k < s.size(); ++k) tail = tail && s[k] == out[k + off];
  if (tail) return lay = kTail, true;
  size_t last = s.size();  // one past the last dimension that is not 1
  while (last > 0 && s[last - 1] == 1) --last;
  bool head = true;
  for (size_t k = 0; k < last; ++k) head = head && s[k] == out[k + off];
  for (size_t k = 0; k < off && head; ++k) head = out[k] == 1;
  if (head) return lay = kHead, true;
  return false;
}

template <int L>
inline int64_t lay_index(int64_t o, int64_t r, int64_t j) {
  return L == kFull ? o : L == kTail ? j : L == kHead ? r : 0;
}

template <int LA, int LB, typename F>
void rows_loop(int64_t rows, int64_t cols, F& f) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t o = r * cols + j;
      f(o, lay_index<LA>(o, r, j), lay_index<LB>(o, r, j));
    }
  }
}

template <int LA, typename F>
void rows_loop_b(int lb, int64_t rows, int64_t cols, F& f) {
  switch (lb) {
    case kFull: return rows_loop<LA, kFull>(rows, cols, f);
    case kTail: return rows_loop<LA, kTail>(rows, cols, f);
    case kHead: return rows_loop<LA, kHead>(rows, cols, f);
    default: return rows_loop<LA, kScalar>(rows, cols, f);
  }
}

/// Calls f(o, ia, ib) for every element o of `out` with the offsets of a and b (shapes sa, sb
/// broadcast to out): in two plain loops where the operands' layouts allow, else by `each`.
template <typename F>
void broadcast_each(const Shape& sa, const Shape& sb, const Shape& out, F&& f) {
  const int64_t n = numel_of(out);
  Lay la, lb;
  int64_t na, nb;
  if (layout_of(sa, out, la, na) && layout_of(sb, out, lb, nb)) {
    int64_t cols = -1;
    if (la == kTail) cols = na;
    if (lb == kTail) cols = cols < 0 || cols == nb ? nb : -2;
    if (la == kHead) cols = cols == -1 ? n / na : (cols == n / na ? cols : -2);
    if (lb == kHead) cols = cols == -1 ? n / nb : (cols == n / nb ? cols : -2);
    if (cols == -1) cols = n;  // full and scalar operands only
    if (cols > 0 && n % cols == 0) {
      const int64_t rows = n / cols;
      switch (la) {
        case kFull: return rows_loop_b<kFull>(lb, rows, cols, f);
        case kTail: return rows_loop_b<kTail>(lb, rows, cols, f);
        case kHead: return rows_loop_b<kHead>(lb, rows, cols, f);
        default: return rows_loop_b<kScalar>(lb, rows, cols, f);
      }
    }
  }
  std::array<int64_t, kMaxDim> ta{}, tb{};
  broadcast_strides(sa, out, ta.data());
  broadcast_strides(sb, out, tb.data());
  each(out, ta.data(), tb.data(), f);
}

/// Above this many multiply-adds a matmul goes to LibTorch's BLAS (its call costs a few us).
constexpr int64_t kBlasWork = 8192;

/// The sizes before and after dimension `dim` of a row-major shape: the array as [outer, s[dim], inner].
std::pair<int64_t, int64_t> outer_inner(const Shape& s, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= s[k];
  for (size_t k = dim + 1; k < s.size(); ++k) inner *= s[k];
  return {outer, inner};
}

void check_rank(const Shape& s) {
  if (s.size() > kMaxDim) throw NotCovered("arrays of more than 8 dimensions");
}

// Note [Native linear algebra]
// Gaussian-process models factor a kernel matrix per row of x: a [C, n, n] batch of small
// matrices (posteriordb's GPs: n = 11). LibTorch spends its time there in per-call dispatch and
// LAPACK set-up, not arithmetic, so the evaluator does batched matmul, Cholesky, triangular
// solves and diagonals itself, one small dense matrix at a time (row-major, n x n). The
// derivatives are LibTorch's (so the load-time check against its autograd holds to rounding):
// Cholesky A = L L^T: gA = L^-T sym(Phi(L^T gL)) L^-1, Phi the lower triangle with a halved
// diagonal, sym(M) = (M + M^T) / 2 (Murray, "Differentiation of the Cholesky decomposition",
// 2016); X = A^-1 B: gB = A^-T gX, gA = -gB X^T restricted to A's triangle. A matrix that is not
// positive definite raises, as LibTorch does, and the target rejects the rows that raise
// (Note [A density may fail]).

/// A [rows, cols] float64 tensor over raw storage (no copy).
torch::Tensor blob_at(const double* v, int64_t rows, int64_t cols) {
  return torch::from_blob(const_cast<double*>(v), {rows, cols}, torch::kFloat64);
}

/// out (n x m) = a (n x k) b (k x m), or += when `add`.
void mm_kernel(const double* a, const double* b, double* out, int64_t n, int64_t k, int64_t m, bool add) {
  if (n * k * m >= kBlasWork) {
    torch::Tensor o = blob_at(out, n, m);
    if (add) {
      o.addmm_(blob_at(a, n, k), blob_at(b, k, m));
    } else {
      at::mm_out(o, blob_at(a, n, k), blob_at(b, k, m));
    }
    return;
  }
  if (!add) std::fill_n(out, n * m, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double* row = out + i * m;
    for (int64_t j = 0; j < k; ++j) {
      const double aij = a[i * k + j];
      const double* brow = b + j * m;
      for (int64_t l = 0; l < m; ++l) row[l] += aij * brow[l];
    }
  }
}

/// The backward of out = a b: ga += go b^T, gb += a^T go (either may be null).
void mm_kernel_back(const double* a, const double* b, const double* go, double* ga, double* gb, int64_t n, int64_t k,
                    int64_t m) {
  if (n * k * m >= kBlasWork) {
    const torch::Tensor g = blob_at(go, n, m);
    if (ga) blob_at(ga, n, k).addmm_(g, blob_at(b, k, m).t());
    if (gb) blob_at(gb, k, m).addmm_(blob_at(a, n, k).t(), g);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const double* g = go + i * m;
    for (int64_t j = 0; j < k; ++j) {
      const double* brow = b + j * m;
      if (ga) {
        double s = 0;
        for (int64_t l = 0; l < m; ++l) s += g[l] * brow[l];
        ga[i * k + j] += s;
      }
      if (gb) {
        const double aij = a[i * k + j];
        double* gbrow = gb + j * m;
        for (int64_t l = 0; l < m; ++l) gbrow[l] += aij * g[l];
      }
    }
  }
}

/// The lower Cholesky factor l of a (n x n, its lower triangle read); the order of the first
/// leading minor that is not positive definite, or 0.
int64_t cholesky_lower(const double* a, double* l, int64_t n) {
  std::fill_n(l, n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      double s = a[i * n + j];
      for (int64_t q = 0; q < j; ++q) s -= l[i * n + q] * l[j * n + q];
      if (i == j) {
        if (!(s > 0)) return i + 1;  // also NaN
        l[i * n + i] = std::sqrt(s);
      } else {
        l[i * n + j] = s / l[j * n + j];
      }
    }
  }
  return 0;
}

/// x (n x k) = op(a)^-1 b for a triangular a (n x n): op(a) = a^T when `trans`; `upper` says
/// which triangle of a holds it; `unit`: its diagonal is taken as ones. x may alias b.
void tri_solve(const double* a, const double* b, double* x, int64_t n, int64_t k, bool upper, bool trans, bool unit) {
  auto at = [&](int64_t i, int64_t j) { return trans ? a[j * n + i] : a[i * n + j]; };
  const bool up = upper != trans;  // op(a) is upper triangular
  for (int64_t t = 0; t < n; ++t) {
    const int64_t i = up ? n - 1 - t : t;
    for (int64_t c = 0; c < k; ++c) {
      double s = b[i * k + c];
      if (up) {
        for (int64_t j = i + 1; j < n; ++j) s -= at(i, j) * x[j * k + c];
      } else {
        for (int64_t j = 0; j < i; ++j) s -= at(i, j) * x[j * k + c];
      }
      x[i * k + c] = unit ? s : s / at(i, i);
    }
  }
}

/// The batch layout of a batched matrix operation on a ([..., n, k]) and b ([..., k, m]): the
/// batch dimensions must be equal, or one operand a plain matrix shared by every batch entry.
struct MatBatch {
  Shape batch;  // the result's batch dimensions
  int64_t count = 1;
  bool a_shared = false, b_shared = false;
  /// The result's shape: the batch dimensions, then rows x cols.
  Shape result(int64_t rows, int64_t cols) const {
    Shape s = batch;
    s.push_back(rows), s.push_back(cols);
    return s;
  }
};
MatBatch mat_batch(const Shape& sa, const Shape& sb, const char* what) {
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  MatBatch r;
  if (ba == bb) {
    r.batch = ba;
  } else if (ba.empty()) {
    r.batch = bb, r.a_shared = true;
  } else if (bb.empty()) {
    r.batch = ba, r.b_shared = true;
  } else {
    throw NotCovered(std::string(what) + " of " + shape_text(sa) + " and " + shape_text(sb) + " (broadcast batch dimensions)");
  }
  r.count = numel_of(r.batch);
  return r;
}

inline double pow_fwd(double a, double s) {
  if (s == 2.0) return a * a;
  if (s == 1.0) return a;
  if (s == 0.5) return std::sqrt(a);
  if (s == 3.0) return a * a * a;
  if (s == -1.0) return 1.0 / a;
  if (s == -2.0) return 1.0 / (a * a);
  return std::pow(a, s);
}

inline double sigmoid(double a) { return a >= 0 ? 1.0 / (1.0 + std::exp(-a)) : std::exp(a) / (1.0 + std::exp(a)); }

inline double unary_fwd(uint8_t sub, double a) {
  switch (sub) {
    case kNeg: return -a;
    case kExp: return std::exp(a);
    case kLog: return std::log(a);
    case kLog1p: return std::log1p(a);
    case kExpm1: return std::expm1(a);
    case kSqrt: return std::sqrt(a);
    case kRsqrt: return 1.0 / std::sqrt(a);
    case kSigmoid: return sigmoid(a);
    case kLogSigmoid: return std::min(a, 0.0) - std::log1p(std::exp(-std::abs(a)));
    case kTanh: return std::tanh(a);
    case kAbs: return std::abs(a);
    case kSin: return std::sin(a);
    case kCos: return std::cos(a);
    case kRecip: return 1.0 / a;
    case kErf: return std::erf(a);
    case kSquare: return a * a;
    case kRelu: return a > 0 ? a : 0.0;
  }
  return NAN;
}

/// d out / d a times go.
inline double unary_back(uint8_t sub, double a, double out, double go) {
  switch (sub) {
    case kNeg: return -go;
    case kExp: return go * out;
    case kLog: return go / a;
    case kLog1p: return go / (1.0 + a);
    case kExpm1: return go * (out + 1.0);
    case kSqrt: return go / (2.0 * out);
    case kRsqrt: return -0.5 * go * out * out * out;
    case kSigmoid: return go * out * (1.0 - out);
    case kLogSigmoid: return go * sigmoid(-a);
    case kTanh: return go * (1.0 - out * out);
    case kAbs: return a > 0 ? go : a < 0 ? -go : 0.0;
    case kSin: return go * std::cos(a);
    case kCos: return -go * std::sin(a);
    case kRecip: return -go * out * out;
    case kErf: return go * 1.1283791670955126 * std::exp(-a * a);  // 2 / sqrt(pi)
    case kSquare: return 2.0 * a * go;
    case kRelu: return a > 0 ? go : 0.0;
  }
  return NAN;
}

inline double binary_fwd(uint8_t sub, double a, double b, double alpha) {
  switch (sub) {
    case kAdd: return a + alpha * b;
    case kSubtract: return a - alpha * b;
    case kRSub: return b - alpha * a;
    case kMul: return a * b;
    case kDiv: return a / b;
    case kPow: return pow_fwd(a, b);
    case kRPow: return std::pow(b, a);
  }
  return NAN;
}

/// The contributions of go to a's and b's gradients.
inline void binary_back(uint8_t sub, double a, double b, double out, double alpha, double go, double& ga, double& gb) {
  switch (sub) {
    case kAdd: ga = go, gb = alpha * go; return;
    case kSubtract: ga = go, gb = -alpha * go; return;
    case kRSub: ga = -alpha * go, gb = go; return;
    case kMul: ga = go * b, gb = go * a; return;
    case kDiv: ga = go / b, gb = -go * a / (b * b); return;
    case kPow:  // out = a ** b (as LibTorch: no gradient through a zero exponent or a zero base)
      ga = b == 0.0 ? 0.0 : go * b * pow_fwd(a, b - 1.0);
      gb = (a == 0.0 && b >= 0.0) ? 0.0 : go * out * std::log(a);
      return;
    case kRPow:  // out = b ** a, b the scalar base
      ga = (b == 0.0 && a >= 0.0) ? 0.0 : go * out * std::log(b);
      gb = 0.0;
      return;
  }
}

// The per-element functions with their switch hoisted out of the loops: body(f) is instantiated
// once per operation, f inlined.
template <typename Body>
void with_unary(uint8_t sub, Body&& body) {
  switch (sub) {
#define NMCMC_UNARY(S) \
  case S: return body([](double a) { return unary_fwd(S, a); });
    NMCMC_UNARY(kNeg) NMCMC_UNARY(kExp) NMCMC_UNARY(kLog) NMCMC_UNARY(kLog1p) NMCMC_UNARY(kExpm1) NMCMC_UNARY(kSqrt)
    NMCMC_UNARY(kRsqrt) NMCMC_UNARY(kSigmoid) NMCMC_UNARY(kLogSigmoid) NMCMC_UNARY(kTanh) NMCMC_UNARY(kAbs)
    NMCMC_UNARY(kSin) NMCMC_UNARY(kCos) NMCMC_UNARY(kRecip) NMCMC_UNARY(kErf) NMCMC_UNARY(kSquare) NMCMC_UNARY(kRelu)
#undef NMCMC_UNARY
  }
}
template <typename Body>
void with_unary_back(uint8_t sub, Body&& body) {
  switch (sub) {
#define NMCMC_UNARY(S) \
  case S: return body([](double a, double out, double go) { return unary_back(S, a, out, go); });
    NMCMC_UNARY(kNeg) NMCMC_UNARY(kExp) NMCMC_UNARY(kLog) NMCMC_UNARY(kLog1p) NMCMC_UNARY(kExpm1) NMCMC_UNARY(kSqrt)
    NMCMC_UNARY(kRsqrt) NMCMC_UNARY(kSigmoid) NMCMC_UNARY(kLogSigmoid) NMCMC_UNARY(kTanh) NMCMC_UNARY(kAbs)
    NMCMC_UNARY(kSin) NMCMC_UNARY(kCos) NMCMC_UNARY(kRecip) NMCMC_UNARY(kErf) NMCMC_UNARY(kSquare) NMCMC_UNARY(kRelu)
#undef NMCMC_UNARY
  }
}
template <typename Body>
void with_binary(uint8_t sub, double alpha, Body&& body) {
  switch (sub) {
#define NMCMC_BINARY(S) \
  case S: return body([alpha](double a, double b) { return binary_fwd(S, a, b, alpha); });
    NMCMC_BINARY(kAdd) NMCMC_BINARY(kSubtract) NMCMC_BINARY(kRSub) NMCMC_BINARY(kMul) NMCMC_BINARY(kDiv)
    NMCMC_BINARY(kPow) NMCMC_BINARY(kRPow)
#undef NMCMC_BINARY
  }
}
template <typename Body>
void with_binary_back(uint8_t sub, double alpha, Body&& body) {
  switch (sub) {
#define NMCMC_BINARY(S)                                                                            \
  case S:                                                                                          \
    return body([alpha](double a, double b, double out, double go, double& ga, double& gb) { \
      binary_back(S, a, b, out, alpha, go, ga, gb);                                                \
    });
    NMCMC_BINARY(kAdd) NMCMC_BINARY(kSubtract) NMCMC_BINARY(kRSub) NMCMC_BINARY(kMul) NMCMC_BINARY(kDiv)
    NMCMC_BINARY(kPow) NMCMC_BINARY(kRPow)
#undef NMCMC_BINARY
  }
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw std::runtime_error("integer division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

struct ScriptProgram::Impl {
  Block main;
  int x_reg = -1, out_reg = -1;
  std::vector<Reg> regs;
  std::vector<std::string> strings;
  std::vector<IndexArr> indices;
  std::deque<Arr> arrs;  // references stay valid as it grows
  int64_t n_const = 0, top = 0;
  std::vector<Rec> tape;
  std::vector<int64_t> extra;  // the inputs of stack and cat records, diagonal's offsets
  std::vector<double> scratch;  // the backward's work space (Cholesky, triangular solves)
  int64_t n_instr = 0;
  mutable std::mutex mutex;

  // ---- compiling ----
  std::unordered_map<const jit::Value*, int> reg_of;

  int def(const jit::Value* v) {
    const int r = static_cast<int>(regs.size());
    regs.emplace_back();
    reg_of[v] = r;
    return r;
  }
  int use(const jit::Value* v) {
    auto it = reg_of.find(v);
    if (it == reg_of.end()) throw Unsupported{"a value defined outside the graph (%" + v->debugName() + ")"};
    return it->second;
  }

  /// Stores a constant int tensor as an index array; returns its number.
  int64_t add_index(const torch::Tensor& tensor) {
    const torch::Tensor t = tensor.to(torch::kInt64).contiguous();
    IndexArr a;
    a.shape = t.sizes().vec();
    check_rank_compile(a.shape);
    a.v.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    indices.push_back(std::move(a));
    return static_cast<int64_t>(indices.size()) - 1;
  }

  void constant(const jit::Node* n) {
    const jit::Value* v = n->output();
    c10::optional<c10::IValue> iv = jit::toIValue(v);
    if (!iv) throw Unsupported{"a constant of type " + v->type()->str()};
    Reg& r = regs[def(v)];
    if (iv->isTensor()) {
      torch::Tensor t = iv->toTensor();
      if (!t.device().is_cpu()) throw Unsupported{"a constant tensor not on the CPU"};
      if (t.scalar_type() == torch::kInt64 || t.scalar_type() == torch::kInt32) {
        r.kind = Reg::kIndex;
        r.i = add_index(t);
        return;
      }
      if (t.scalar_type() != torch::kFloat64) {
        throw Unsupported{"a constant " + std::string(c10::toString(t.scalar_type())) + " tensor (float64 arrays and int64 indices are covered)"};
      }
      t = t.contiguous();
      Arr a;
      a.shape = t.sizes().vec();
      check_rank_compile(a.shape);
      a.v.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      r.kind = Reg::kTensor;
      r.i = static_cast<int64_t>(arrs.size());
      arrs.push_back(std::move(a));
    } else if (iv->isInt()) {
      r.kind = Reg::kInt, r.i = iv->toInt();
    } else if (iv->isDouble()) {
      r.kind = Reg::kDouble, r.d = iv->toDouble();
    } else if (iv->isBool()) {
      r.kind = Reg::kBool, r.i = iv->toBool();
    } else if (iv->isNone() || iv->isDevice()) {  // a device only reaches arguments the evaluator ignores
      r.kind = Reg::kNone;
    } else if (iv->isIntList()) {
      r.kind = Reg::kIntList, r.list = iv->toIntVector();
    } else if (iv->isList()) {  // a folded index list (x[:, idx]): None or constant int tensors
      r.kind = Reg::kIndexList;
      for (const c10::IValue& e : iv->toListRef()) {
        if (e.isNone()) {
          r.list.push_back(-1);
          continue;
        }
        if (!e.isTensor() || (e.toTensor().scalar_type() != torch::kInt64 && e.toTensor().scalar_type() != torch::kInt32)) {
          throw Unsupported{"a constant list of type " + v->type()->str()};
        }
        r.list.push_back(add_index(e.toTensor()));
      }
    } else if (iv->isString()) {
      r.kind = Reg::kString, r.i = static_cast<int64_t>(strings.size());
      strings.push_back(iv->toStringRef());
    } else {
      throw Unsupported{"a constant of type " + v->type()->str()};
    }
  }
  static void check_rank_compile(const Shape& s) {
    if (s.size() > kMaxDim) throw Unsupported{"a constant of more than 8 dimensions"};
  }

  static bool is_tensor(const jit::Value* v) { return v->type()->kind() == c10::TypeKind::TensorType; }
  static bool is_number(const jit::Value* v) {
    const auto k = v->type()->kind();
    return k == c10::TypeKind::IntType || k == c10::TypeKind::FloatType || k == c10::TypeKind::NumberType ||
           k == c10::TypeKind::BoolType;
  }
  /// An input that must be the constant None (dtype, layout, device, ... arguments).
  static void none_only(const jit::Value* v, const std::string& what) {
    c10::optional<c10::IValue> iv = jit::toIValue(v);
    if (!iv || !iv->isNone()) throw Unsupported{what + " with a " + v->type()->str() + " argument other than None"};
  }

  Block compile_block(const jit::Block* b) {
    Block out;
    for (const jit::Value* p : b->inputs()) out.params.push_back(def(p));
    for (const jit::Node* n : b->nodes()) {
      if (n->kind() == c10::prim::Constant) {
        constant(n);
        continue;
      }
      out.body.push_back(compile_node(n));
      ++n_instr;
    }
    for (const jit::Value* r : b->outputs()) out.rets.push_back(use(r));
    return out;
  }

  Instr compile_node(const jit::Node* n) {
    const std::string kind = n->kind().toQualString();
    const c10::FunctionSchema* schema = n->maybeSchema();
    const std::string overload = schema ? schema->overload_name() : "";
    const std::string name = kind + (overload.empty() ? "" : "." + overload);
    auto ins = n->inputs();
    Instr I;
    auto inputs = [&](size_t k) {
      for (size_t j = 0; j < k && j < ins.size(); ++j) I.in.push_back(use(ins[j]));
    };
    auto outputs = [&] {
      for (const jit::Value* o : n->outputs()) I.out.push_back(def(o));
    };
    auto unsupported = [&]() -> Unsupported { return Unsupported{name}; };
    if (kind.rfind("aten::", 0) == 0 && !kind.empty() && kind.back() == '_' && kind != "aten::__derive_index") {
      throw Unsupported{name + " (an in-place operation)"};
    }
    static const std::unordered_map<std::string, uint8_t> unary = {
        {"aten::neg", kNeg},       {"aten::exp", kExp},       {"aten::log", kLog},         {"aten::log1p", kLog1p},
        {"aten::expm1", kExpm1},   {"aten::sqrt", kSqrt},     {"aten::rsqrt", kRsqrt},     {"aten::sigmoid", kSigmoid},
        {"aten::log_sigmoid", kLogSigmoid}, {"aten::tanh", kTanh}, {"aten::abs", kAbs},    {"aten::sin", kSin},
        {"aten::cos", kCos},       {"aten::reciprocal", kRecip}, {"aten::erf", kErf},      {"aten::square", kSquare},
        {"aten::relu", kRelu}};
    static const std::unordered_map<std::string, uint8_t> binary = {
        {"aten::add", kAdd}, {"aten::sub", kSubtract}, {"aten::rsub", kRSub}, {"aten::mul", kMul},
        {"aten::div", kDiv}, {"aten::pow", kPow}, {"aten::true_divide", kDiv}};
    static const std::unordered_map<std::string, uint8_t> scalar = {
        {"aten::add", kSAdd},  {"aten::sub", kSSub},  {"aten::mul", kSMul},         {"aten::div", kSDiv},
        {"aten::floordiv", kSFloorDiv}, {"aten::remainder", kSRem}, {"aten::neg", kSNeg},    {"aten::lt", kSLt},
        {"aten::gt", kSGt},    {"aten::le", kSLe},    {"aten::ge", kSGe},           {"aten::eq", kSEq},
        {"aten::ne", kSNe},    {"aten::__not__", kSNot}, {"aten::__and__", kSAnd},  {"aten::__or__", kSOr},
        {"aten::__derive_index", kSDeriveIndex}, {"aten::__range_length", kSRangeLength},
        {"aten::Int", kSCast}, {"aten::Float", kSCast}, {"aten::pow", kSPow}};

    const bool first_tensor = !ins.empty() && is_tensor(ins[0]);
    const bool any_tensor = std::any_of(ins.begin(), ins.end(), [](const jit::Value* v) { return is_tensor(v); });
    if (!any_tensor && !ins.empty() && scalar.count(kind)) {
      for (const jit::Value* v : ins) {
        if (!is_number(v)) throw unsupported();
      }
      const auto ok = n->output()->type()->kind();
      if (ok != c10::TypeKind::IntType && ok != c10::TypeKind::FloatType && ok != c10::TypeKind::BoolType) {
        throw unsupported();
      }
      I.op = Op::kScalar;
      I.sub = scalar.at(kind);
      I.int_result = ok == c10::TypeKind::IntType;
      inputs(ins.size());
      outputs();
      return I;
    }
    if (first_tensor && unary.count(kind) && ins.size() == 1) {
      I.op = Op::kUnary, I.sub = unary.at(kind);
      inputs(1), outputs();
      return I;
    }
    if (binary.count(kind) && ins.size() >= 2 && (is_tensor(ins[0]) || is_tensor(ins[1]))) {
      if (overload.find("mode") != std::string::npos || overload == "out") throw unsupported();
      if (ins.size() > 3) throw unsupported();
      I.sub = binary.at(kind);
      if (is_tensor(ins[0]) && is_tensor(ins[1])) {
        I.op = Op::kBin;
        inputs(ins.size());  // self, other[, alpha]
      } else if (is_tensor(ins[0]) && is_number(ins[1])) {
        I.op = Op::kBinS;
        inputs(ins.size());
      } else if (kind == "aten::pow" && is_number(ins[0]) && is_tensor(ins[1])) {
        I.op = Op::kBinS, I.sub = kRPow;
        I.in = {use(ins[1]), use(ins[0])};  // the tensor first, then the scalar base
      } else {
        throw unsupported();
      }
      outputs();
      return I;
    }
    // Operations whose instruction is their inputs as they come (or the first `take` of them).
    struct Direct {
      const char* kind;
      const char* overload;  // nullptr: any
      int arity;             // -1: any
      bool tensor_first;     // the first input must be a tensor
      Op op;
      uint8_t sub;
      int take;  // -1: all inputs
    };
    static const Direct direct[] = {
        {"aten::softplus", nullptr, 3, false, Op::kSoftplus, 0, 3},
        {"aten::logsumexp", nullptr, 3, false, Op::kLogSumExp, 0, 3},
        {"aten::select", "int", -1, false, Op::kSelect, 0, 3},
        {"aten::slice", "Tensor", -1, false, Op::kSlice, 0, 5},
        {"aten::t", nullptr, 1, false, Op::kPermute, 0, -1},
        {"aten::transpose", "int", -1, false, Op::kPermute, 0, -1},
        {"aten::expand", nullptr, 3, false, Op::kExpand, 0, 2},
        {"aten::expand_as", nullptr, 2, false, Op::kExpand, 1, 2},
        {"aten::stack", nullptr, 2, false, Op::kStack, 0, 2},
        {"aten::cat", nullptr, 2, false, Op::kCat, 0, 2},
        {"aten::matmul", nullptr, 2, false, Op::kMatmul, 0, 2},
        {"aten::mm", nullptr, 2, false, Op::kMatmul, 0, 2},
        {"aten::mv", nullptr, 2, false, Op::kMatmul, 0, 2},
        {"aten::dot", nullptr, 2, false, Op::kMatmul, 0, 2},
        {"aten::size", "int", -1, false, Op::kSize, 0, 2},
        {"aten::size", nullptr, 1, false, Op::kSizes, 0, 1},
        {"aten::len", "Tensor", -1, false, Op::kSize, 0, 1},
        {"aten::dim", nullptr, -1, true, Op::kDim, 0, 1},
        {"aten::numel", nullptr, -1, true, Op::kNumel, 0, 1},
        {"aten::len", "t", -1, false, Op::kListLen, 0, 1},
        {"aten::index_select", nullptr, 3, false, Op::kIndexSelect, 0, 3},
        {"aten::index", "Tensor", 2, false, Op::kIndexSelect, 1, 2},
        {"aten::linalg_cholesky", nullptr, 2, true, Op::kCholesky, 0, 2},
        {"aten::cholesky", nullptr, 2, true, Op::kCholesky, 0, 2},
        {"aten::linalg_solve_triangular", nullptr, 5, false, Op::kTriSolve, 0, 5},
        {"aten::diagonal", "", 4, true, Op::kDiagonal, 0, 4},
        {"aten::eye", "", 5, false, Op::kEye, 0, 1},
        {"aten::eye", "m", 6, false, Op::kEye, 1, 2},
        {"prim::dtype", nullptr, 1, true, Op::kNop, 0, 0},
        {"prim::device", nullptr, 1, true, Op::kNop, 0, 0},
    };
    for (const Direct& e : direct) {
      if (kind != e.kind || (e.overload && overload != e.overload)) continue;
      if ((e.arity >= 0 && static_cast<int>(ins.size()) != e.arity) || (e.tensor_first && !first_tensor)) continue;
      I.op = e.op, I.sub = e.sub;
      inputs(e.take < 0 ? ins.size() : static_cast<size_t>(e.take));
      outputs();
      return I;
    }
    if ((kind == "aten::sum" || kind == "aten::mean") && first_tensor) {
      I.op = kind == "aten::sum" ? Op::kSum : Op::kMean;
      if (ins.size() == 2) {  // sum(self, dtype): everything
        none_only(ins[1], name);
        I.in = {use(ins[0])};
      } else if (ins.size() == 4 && ins[1]->type()->kind() == c10::TypeKind::ListType) {
        none_only(ins[3], name);
        I.in = {use(ins[0]), use(ins[1]), use(ins[2])};
      } else {
        throw unsupported();
      }
      outputs();
      return I;
    }
    if (first_tensor && (kind == "aten::view" || kind == "aten::reshape" || kind == "aten::flatten" ||
                         kind == "aten::squeeze" || kind == "aten::unsqueeze" || kind == "aten::contiguous" ||
                         kind == "aten::clone" || kind == "aten::view_as" || kind == "aten::reshape_as")) {
      if ((kind == "aten::view" || kind == "aten::reshape") && ins[1]->type()->kind() != c10::TypeKind::ListType) {
        throw unsupported();  // view(dtype)
      }
      if (kind == "aten::clone" && ins.size() > 1) none_only(ins[1], name);
      I.op = Op::kReshape;
      I.sub = kind == "aten::view" || kind == "aten::reshape" ? 1
              : kind == "aten::flatten"                        ? 2
              : kind == "aten::squeeze"                        ? (ins.size() == 1 ? 3 : 4)
              : kind == "aten::unsqueeze"                      ? 5
              : kind == "aten::view_as" || kind == "aten::reshape_as" ? 6
                                                               : 0;
      if (kind == "aten::contiguous" || kind == "aten::clone") {
        I.in = {use(ins[0])};
      } else {
        inputs(ins.size());
      }
      outputs();
      return I;
    }
    if (kind == "aten::full_like" || kind == "aten::zeros_like" || kind == "aten::ones_like") {
      const size_t first_opt = kind == "aten::full_like" ? 2 : 1;
      for (size_t j = first_opt; j < ins.size(); ++j) none_only(ins[j], name);
      I.op = Op::kFullLike;
      I.sub = kind == "aten::full_like" ? 2 : kind == "aten::ones_like" ? 1 : 0;
      inputs(first_opt), outputs();
      return I;
    }
    if (kind == "aten::__getitem__" && overload == "t" && ins[0]->type()->cast<c10::ListType>() &&
        ins[0]->type()->cast<c10::ListType>()->getElementType()->kind() == c10::TypeKind::IntType) {
      I.op = Op::kListGet, inputs(2), outputs();
      return I;
    }
    if (kind == "prim::ListConstruct") {
      auto lt = n->output()->type()->cast<c10::ListType>();
      auto opt = lt ? lt->getElementType()->cast<c10::OptionalType>() : nullptr;
      if (opt && opt->getElementType()->kind() == c10::TypeKind::TensorType) {  // x[:, idx]'s indices
        I.op = Op::kListConstruct, I.sub = 2;
        inputs(ins.size()), outputs();
        return I;
      }
      const auto ek = lt ? lt->getElementType()->kind() : c10::TypeKind::AnyType;
      if (ek != c10::TypeKind::IntType && ek != c10::TypeKind::TensorType) throw Unsupported{name + " of " + n->output()->type()->str()};
      I.op = Op::kListConstruct, I.sub = ek == c10::TypeKind::TensorType;
      inputs(ins.size()), outputs();
      return I;
    }
    if (kind == "prim::Loop") {
      I.op = Op::kLoop;
      inputs(ins.size());
      outputs();
      I.blocks.push_back(compile_block(n->blocks()[0]));
      return I;
    }
    if (kind == "prim::If") {
      I.op = Op::kIf;
      inputs(1);
      outputs();
      I.blocks.push_back(compile_block(n->blocks()[0]));
      I.blocks.push_back(compile_block(n->blocks()[1]));
      return I;
    }
    if (kind == "prim::RaiseException") {
      I.op = Op::kRaise, inputs(1), outputs();
      return I;
    }
    throw unsupported();
  }

  // ---- running ----
  int fresh(const Shape& shape, bool needs) {
    check_rank(shape);
    if (top == static_cast<int64_t>(arrs.size())) arrs.emplace_back();
    Arr& a = arrs[top];
    a.shape = shape;
    a.v.resize(numel_of(shape));
    a.needs = needs;
    return static_cast<int>(top++);
  }
  Arr& arr(int id) { return arrs[id]; }
  const Reg& R(int r) const { return regs[r]; }
  int tensor_in(const Instr& I, size_t k) const {
    const Reg& r = regs[I.in[k]];
    if (r.kind != Reg::kTensor) throw std::runtime_error("expected a tensor");
    return static_cast<int>(r.i);
  }
  double number(int reg) const {
    const Reg& r = regs[reg];
    if (r.kind == Reg::kDouble) return r.d;
    if (r.kind == Reg::kInt || r.kind == Reg::kBool) return static_cast<double>(r.i);
    throw std::runtime_error("expected a number");
  }
  int64_t integer(int reg) const {
    const Reg& r = regs[reg];
    if (r.kind == Reg::kInt || r.kind == Reg::kBool) return r.i;
    throw std::runtime_error("expected an int");
  }
  bool optional_int(int reg, int64_t& v) const {
    if (regs[reg].kind == Reg::kNone) return false;
    v = integer(reg);
    return true;
  }
  void set_tensor(int reg, int id) {
    Reg& r = regs[reg];
    r.kind = Reg::kTensor, r.i = id;
  }
  void set_int(int reg, int64_t v) {
    Reg& r = regs[reg];
    r.kind = Reg::kInt, r.i = v;
  }
  void record(Op op, uint8_t sub, int out, int a, int b, double s0 = 0, double s1 = 0, int64_t p0 = 0, int64_t p1 = 0,
              int64_t p2 = 0) {
    tape.push_back(Rec{op, sub, out, a, b, s0, s1, p0, p1, p2});
  }

  /// Bit k set: dimension k is reduced.
  uint64_t reduce_mask(const Instr& I, int64_t nd) const {
    if (I.in.size() == 1) return nd == 0 ? 0 : (uint64_t{1} << nd) - 1;
    const Reg& dims = regs[I.in[1]];
    if (dims.kind != Reg::kIntList) throw std::runtime_error("expected a list of dimensions");
    if (dims.list.empty()) return nd == 0 ? 0 : (uint64_t{1} << nd) - 1;
    uint64_t m = 0;
    for (int64_t d : dims.list) m |= uint64_t{1} << wrap_dim(d, nd);
    return m;
  }

  void exec(const std::vector<Instr>& body) {
    for (const Instr& I : body) step(I);
  }

  void step(const Instr& I) {
    switch (I.op) {
      case Op::kBin: {
        const int ia = tensor_in(I, 0), ib = tensor_in(I, 1);
        const double alpha = I.in.size() > 2 ? number(I.in[2]) : 1.0;
        const Shape shape = broadcast_shape(arr(ia).shape, arr(ib).shape);
        const int o = fresh(shape, arr(ia).needs || arr(ib).needs);
        const Arr &a = arr(ia), &b = arr(ib);
        Arr& out = arr(o);
        const uint8_t sub = I.sub;
        with_binary(sub, alpha, [&](auto f) {
          const size_t nk = out.v.size();
          double* ov = out.v.data();
          const double *av = a.v.data(), *bv = b.v.data();
          if (a.shape == b.shape) {
            for (size_t k = 0; k < nk; ++k) ov[k] = f(av[k], bv[k]);
          } else if (b.v.size() == 1 && a.shape == shape) {
            const double b0 = bv[0];
            for (size_t k = 0; k < nk; ++k) ov[k] = f(av[k], b0);
          } else if (a.v.size() == 1 && b.shape == shape) {
            const double a0 = av[0];
            for (size_t k = 0; k < nk; ++k) ov[k] = f(a0, bv[k]);
          } else {
            broadcast_each(a.shape, b.shape, shape, [&](int64_t k, int64_t ja, int64_t jb) { ov[k] = f(av[ja], bv[jb]); });
          }
        });
        if (out.needs) record(Op::kBin, sub, o, ia, ib, alpha);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kBinS: {
        const int ia = tensor_in(I, 0);
        const double s = number(I.in[1]);
        const double alpha = I.in.size() > 2 ? number(I.in[2]) : 1.0;
        const int o = fresh(arr(ia).shape, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        const uint8_t sub = I.sub;
        if (sub == kPow && s == 2.0) {
          for (size_t k = 0; k < out.v.size(); ++k) out.v[k] = a.v[k] * a.v[k];
        } else {
          with_binary(sub, alpha, [&](auto f) {
            for (size_t k = 0; k < out.v.size(); ++k) out.v[k] = f(a.v[k], s);
          });
        }
        if (out.needs) record(Op::kBinS, sub, o, ia, -1, s, alpha);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kUnary: {
        const int ia = tensor_in(I, 0);
        const int o = fresh(arr(ia).shape, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        const uint8_t sub = I.sub;
        with_unary(sub, [&](auto f) {
          for (size_t k = 0; k < out.v.size(); ++k) out.v[k] = f(a.v[k]);
        });
        if (out.needs) record(Op::kUnary, sub, o, ia, -1);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kSoftplus: {
        const int ia = tensor_in(I, 0);
        const double beta = number(I.in[1]), threshold = number(I.in[2]);
        const int o = fresh(arr(ia).shape, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        for (size_t k = 0; k < out.v.size(); ++k) {
          const double z = a.v[k] * beta;
          out.v[k] = z > threshold ? a.v[k] : std::log1p(std::exp(z)) / beta;
        }
        if (out.needs) record(Op::kSoftplus, 0, o, ia, -1, beta, threshold);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kSum:
      case Op::kMean:
      case Op::kLogSumExp: {
        const int ia = tensor_in(I, 0);
        const Shape in_shape = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(in_shape.size());
        const uint64_t mask = reduce_mask(I, nd);
        const bool keep = I.in.size() > 2 && integer(I.in[2]) != 0;
        Shape kept(in_shape), out_shape;
        int64_t count = 1;
        for (int64_t k = 0; k < nd; ++k) {
          if (mask >> k & 1) {
            count *= in_shape[k];
            kept[k] = 1;
            if (keep) out_shape.push_back(1);
          } else {
            out_shape.push_back(in_shape[k]);
          }
        }
        const int o = fresh(out_shape, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        std::array<int64_t, kMaxDim> sa{}, so{};
        broadcast_strides(in_shape, in_shape, sa.data());
        broadcast_strides(kept, in_shape, so.data());
        if (I.op == Op::kLogSumExp) {
          std::fill(out.v.begin(), out.v.end(), -INFINITY);
          each(in_shape, sa.data(), so.data(), [&](int64_t, int64_t j, int64_t k) { out.v[k] = std::max(out.v[k], a.v[j]); });
          std::vector<double> sum(out.v.size(), 0.0);
          each(in_shape, sa.data(), so.data(), [&](int64_t, int64_t j, int64_t k) {
            if (std::isfinite(out.v[k])) sum[k] += std::exp(a.v[j] - out.v[k]);
          });
          for (size_t k = 0; k < out.v.size(); ++k) {
            if (std::isfinite(out.v[k])) out.v[k] += std::log(sum[k]);
          }
        } else {
          std::fill(out.v.begin(), out.v.end(), 0.0);
          if (mask == 0) {
            out.v = a.v;
          } else if (nd == 2 && mask == 2) {  // the common case: rows summed
            const int64_t r = in_shape[0], c = in_shape[1];
            for (int64_t i = 0; i < r; ++i) {
              double s = 0;
              for (int64_t j = 0; j < c; ++j) s += a.v[i * c + j];
              out.v[i] = s;
            }
          } else {
            each(in_shape, sa.data(), so.data(), [&](int64_t, int64_t j, int64_t k) { out.v[k] += a.v[j]; });
          }
          if (I.op == Op::kMean) {
            for (double& v : out.v) v /= static_cast<double>(count);
          }
        }
        if (out.needs) record(I.op, 0, o, ia, -1, static_cast<double>(count), 0, static_cast<int64_t>(mask));
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kSelect: {
        const int ia = tensor_in(I, 0);
        const Shape& s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        if (nd == 0) throw std::runtime_error("select() on a 0-d array");
        const int64_t dim = wrap_dim(integer(I.in[1]), nd);
        int64_t idx = integer(I.in[2]);
        if (idx < -s[dim] || idx >= s[dim]) {
          throw std::runtime_error("index " + std::to_string(idx) + " is out of bounds for dimension " +
                                   std::to_string(dim) + " with size " + std::to_string(s[dim]));
        }
        if (idx < 0) idx += s[dim];
        Shape os(s);
        os.erase(os.begin() + dim);
        const auto [outer, inner] = outer_inner(s, dim);
        const int64_t n = s[dim];
        const int o = fresh(os, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        for (int64_t i = 0; i < outer; ++i) {
          std::copy_n(a.v.data() + (i * n + idx) * inner, inner, out.v.data() + i * inner);
        }
        if (out.needs) record(Op::kSelect, 0, o, ia, -1, 0, 0, dim, idx);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kSlice: {
        const int ia = tensor_in(I, 0);
        const Shape& s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        if (nd == 0) throw std::runtime_error("slice() on a 0-d array");
        const int64_t dim = wrap_dim(integer(I.in[1]), nd);
        const int64_t n = s[dim];
        int64_t start = 0, end = n, step = integer(I.in[4]);
        if (step <= 0) throw std::runtime_error("slice step must be positive");
        if (optional_int(I.in[2], start) && start < 0) start += n;
        if (optional_int(I.in[3], end) && end < 0) end += n;
        start = std::clamp<int64_t>(start, 0, n);
        end = std::clamp<int64_t>(end, start, n);
        const int64_t len = (end - start + step - 1) / step;
        Shape os(s);
        os[dim] = len;
        const auto [outer, inner] = outer_inner(s, dim);
        const int o = fresh(os, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        for (int64_t i = 0; i < outer; ++i) {
          for (int64_t m = 0; m < len; ++m) {
            std::copy_n(a.v.data() + (i * n + start + m * step) * inner, inner, out.v.data() + (i * len + m) * inner);
          }
        }
        if (out.needs) record(Op::kSlice, 0, o, ia, -1, 0, 0, dim, start, step);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kReshape: {
        const int ia = tensor_in(I, 0);
        const Shape s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        const int64_t total = numel_of(s);
        Shape os;
        switch (I.sub) {
          case 0:  // contiguous, clone
            os = s;
            break;
          case 1: {  // view, reshape
            const Reg& r = regs[I.in[1]];
            if (r.kind != Reg::kIntList) throw std::runtime_error("expected a shape");
            os = r.list;
            int64_t known = 1, infer = -1;
            for (size_t k = 0; k < os.size(); ++k) {
              if (os[k] == -1) {
                if (infer >= 0) throw std::runtime_error("only one dimension can be inferred");
                infer = static_cast<int64_t>(k);
              } else {
                known *= os[k];
              }
            }
            if (infer >= 0) {
              if (known == 0 || total % known != 0) throw std::runtime_error("shape " + shape_text(os) + " is invalid for input of size " + std::to_string(total));
              os[infer] = total / known;
            }
            break;
          }
          case 2: {  // flatten(start, end)
            if (nd == 0) {
              os = {1};
              break;
            }
            const int64_t a = wrap_dim(integer(I.in[1]), nd), b = wrap_dim(integer(I.in[2]), nd);
            if (a > b) throw std::runtime_error("flatten() has start_dim > end_dim");
            for (int64_t k = 0; k < a; ++k) os.push_back(s[k]);
            int64_t m = 1;
            for (int64_t k = a; k <= b; ++k) m *= s[k];
            os.push_back(m);
            for (int64_t k = b + 1; k < nd; ++k) os.push_back(s[k]);
            break;
          }
          case 3:  // squeeze()
            for (int64_t k : s) {
              if (k != 1) os.push_back(k);
            }
            break;
          case 4: {  // squeeze(dim)
            os = s;
            if (nd > 0) {
              const int64_t d = wrap_dim(integer(I.in[1]), nd);
              if (s[d] == 1) os.erase(os.begin() + d);
            }
            break;
          }
          case 5: {  // unsqueeze(dim)
            const int64_t d = wrap_dim(integer(I.in[1]), nd + 1);
            os = s;
            os.insert(os.begin() + d, 1);
            break;
          }
          case 6:  // view_as, reshape_as
            os = arr(tensor_in(I, 1)).shape;
            break;
        }
        if (numel_of(os) != total) throw std::runtime_error("shape " + shape_text(os) + " is invalid for input of size " + std::to_string(total));
        const int o = fresh(os, arr(ia).needs);
        arr(o).v = arr(ia).v;
        if (arr(o).needs) record(Op::kReshape, 0, o, ia, -1);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kPermute: {
        const int ia = tensor_in(I, 0);
        const Shape s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        int64_t d0 = 0, d1 = 1;
        if (I.in.size() == 1) {  // t()
          if (nd > 2) throw std::runtime_error("t() expects an array of at most 2 dimensions");
          if (nd < 2) d0 = d1 = 0;
        } else {
          d0 = wrap_dim(integer(I.in[1]), nd), d1 = wrap_dim(integer(I.in[2]), nd);
        }
        Shape os(s);
        std::swap(os[d0], os[d1]);
        const int o = fresh(os, arr(ia).needs);
        permute_copy(arr(ia), arr(o), d0, d1, false);
        if (arr(o).needs) record(Op::kPermute, 0, o, ia, -1, 0, 0, d0, d1);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kExpand: {
        const int ia = tensor_in(I, 0);
        const Shape s = arr(ia).shape;
        Shape want;
        if (I.sub == 1) {
          want = arr(tensor_in(I, 1)).shape;
        } else {
          const Reg& r = regs[I.in[1]];
          if (r.kind != Reg::kIntList) throw std::runtime_error("expected a shape");
          want = r.list;
        }
        if (want.size() < s.size()) throw std::runtime_error("expand() to fewer dimensions");
        const size_t off = want.size() - s.size();
        for (size_t k = 0; k < want.size(); ++k) {
          if (k >= off && want[k] == -1) want[k] = s[k - off];
          if (k >= off && s[k - off] != 1 && s[k - off] != want[k]) {
            throw std::runtime_error("cannot expand " + shape_text(s) + " to " + shape_text(want));
          }
          if (want[k] < 0) throw std::runtime_error("expand() with a negative size");
        }
        const int o = fresh(want, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        std::array<int64_t, kMaxDim> sa{}, so{};
        broadcast_strides(s, want, sa.data());
        broadcast_strides(want, want, so.data());
        each(want, sa.data(), so.data(), [&](int64_t k, int64_t j, int64_t) { out.v[k] = a.v[j]; });
        if (out.needs) record(Op::kExpand, 0, o, ia, -1);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kStack:
      case Op::kCat: {
        const Reg& list = regs[I.in[0]];
        if (list.kind != Reg::kTensorList || list.list.empty()) throw std::runtime_error("expected a non-empty list of tensors");
        const Shape s0 = arr(static_cast<int>(list.list[0])).shape;
        const bool stack = I.op == Op::kStack;
        const int64_t nd = static_cast<int64_t>(s0.size());
        const int64_t dim = wrap_dim(integer(I.in[1]), stack ? nd + 1 : nd);
        bool needs = false;
        int64_t total = 0;
        for (int64_t id : list.list) {
          const Shape& s = arr(static_cast<int>(id)).shape;
          needs = needs || arr(static_cast<int>(id)).needs;
          bool same = s.size() == s0.size();
          for (int64_t k = 0; same && k < nd; ++k) same = s[k] == s0[k] || (!stack && k == dim);
          if (!same) throw std::runtime_error(std::string(stack ? "stack" : "cat") + "() of arrays of shapes " + shape_text(s0) + " and " + shape_text(s));
          total += stack ? 1 : s[dim];
        }
        Shape os(s0);
        if (stack) {
          os.insert(os.begin() + dim, total);
        } else {
          os[dim] = total;
        }
        const auto [outer, inner] = outer_inner(os, dim);
        const int o = fresh(os, needs);
        Arr& out = arr(o);
        int64_t at = 0;
        for (int64_t id : list.list) {
          const Arr& a = arr(static_cast<int>(id));
          const int64_t len = stack ? 1 : a.shape[dim];
          for (int64_t i = 0; i < outer; ++i) {
            std::copy_n(a.v.data() + i * len * inner, len * inner, out.v.data() + (i * total + at) * inner);
          }
          at += len;
        }
        if (needs) {
          record(I.op, 0, o, -1, -1, 0, 0, static_cast<int64_t>(extra.size()), static_cast<int64_t>(list.list.size()), dim);
          extra.insert(extra.end(), list.list.begin(), list.list.end());
        }
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kMatmul: {
        const int ia = tensor_in(I, 0), ib = tensor_in(I, 1);
        const Shape sa = arr(ia).shape, sb = arr(ib).shape;
        if (sa.empty() || sb.empty()) throw NotCovered("matmul of " + shape_text(sa) + " and " + shape_text(sb));
        if (sa.size() > 2 || sb.size() > 2) {  // batched: [..., n, k] @ [..., k, m]
          if (sa.size() < 2 || sb.size() < 2) throw NotCovered("matmul of " + shape_text(sa) + " and " + shape_text(sb));
          const int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
          if (sb[sb.size() - 2] != k) throw std::runtime_error("matmul of " + shape_text(sa) + " and " + shape_text(sb) + ": sizes differ");
          const MatBatch mb = mat_batch(sa, sb, "matmul");
          const int o = fresh(mb.result(n, m), arr(ia).needs || arr(ib).needs);
          const Arr &a = arr(ia), &b = arr(ib);
          Arr& out = arr(o);
          for (int64_t q = 0; q < mb.count; ++q) {
            mm_kernel(a.v.data() + (mb.a_shared ? 0 : q * n * k), b.v.data() + (mb.b_shared ? 0 : q * k * m),
                      out.v.data() + q * n * m, n, k, m, false);
          }
          if (out.needs) {
            record(Op::kMatmul, static_cast<uint8_t>((mb.a_shared ? 1 : 0) | (mb.b_shared ? 2 : 0)), o, ia, ib,
                   static_cast<double>(mb.count), 0, n, k, m);
          }
          set_tensor(I.out[0], o);
          return;
        }
        const int64_t n = sa.size() == 2 ? sa[0] : 1, k = sa.back();
        const int64_t kb = sb[0], m = sb.size() == 2 ? sb[1] : 1;
        if (k != kb) throw std::runtime_error("matmul of " + shape_text(sa) + " and " + shape_text(sb) + ": sizes differ");
        Shape os;
        if (sa.size() == 2) os.push_back(n);
        if (sb.size() == 2) os.push_back(m);
        const int o = fresh(os, arr(ia).needs || arr(ib).needs);
        const Arr &a = arr(ia), &b = arr(ib);
        Arr& out = arr(o);
        mm_kernel(a.v.data(), b.v.data(), out.v.data(), n, k, m, false);
        if (out.needs) record(Op::kMatmul, 0, o, ia, ib, 1.0, 0, n, k, m);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kEye: {
        const int64_t n = integer(I.in[0]), m = I.sub ? integer(I.in[1]) : n;
        if (n < 0 || m < 0) throw std::runtime_error("eye: negative size");
        const int o = fresh({n, m}, false);
        Arr& out = arr(o);
        std::fill(out.v.begin(), out.v.end(), 0.0);
        for (int64_t i = 0; i < std::min(n, m); ++i) out.v[i * m + i] = 1.0;
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kNop:
        return;
      case Op::kDiagonal: {
        const int ia = tensor_in(I, 0);
        const Shape s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        if (nd < 2) throw std::runtime_error("diagonal of a " + std::to_string(nd) + "-d array");
        const int64_t off = integer(I.in[1]), d1 = wrap_dim(integer(I.in[2]), nd), d2 = wrap_dim(integer(I.in[3]), nd);
        if (d1 == d2) throw std::runtime_error("diagonal: dim1 and dim2 are the same");
        const int64_t len = std::max<int64_t>(0, off >= 0 ? std::min(s[d1], s[d2] - off) : std::min(s[d1] + off, s[d2]));
        std::array<int64_t, kMaxDim> st{};
        for (int64_t k = nd - 1, acc = 1; k >= 0; --k) st[k] = acc, acc *= s[k];
        Shape os, rest_st;
        for (int64_t k = 0; k < nd; ++k) {
          if (k != d1 && k != d2) os.push_back(s[k]), rest_st.push_back(st[k]);
        }
        os.push_back(len);
        rest_st.push_back(st[d1] + st[d2]);
        const int64_t base = len == 0 ? 0 : (off >= 0 ? off * st[d2] : -off * st[d1]);
        const int o = fresh(os, arr(ia).needs);
        Arr& out = arr(o);
        const Arr& a = arr(ia);
        const int64_t at0 = static_cast<int64_t>(extra.size());
        std::array<int64_t, kMaxDim> zero{};
        each(os, rest_st.data(), zero.data(), [&](int64_t k, int64_t j, int64_t) {
          out.v[k] = a.v[base + j];
          if (out.needs) extra.push_back(base + j);
        });
        if (out.needs) record(Op::kDiagonal, 0, o, ia, -1, 0, 0, at0, static_cast<int64_t>(out.v.size()));
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kCholesky: {
        const int ia = tensor_in(I, 0);
        const bool upper = I.in.size() > 1 && regs[I.in[1]].kind != Reg::kNone && integer(I.in[1]) != 0;
        const Shape s = arr(ia).shape;
        if (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2]) {
          throw std::runtime_error("linalg.cholesky: the input must be (batches of) square matrices, not " + shape_text(s));
        }
        const int64_t n = s.back(), count = numel_of(s) / std::max<int64_t>(1, n * n);
        const int o = fresh(s, arr(ia).needs);
        Arr& out = arr(o);
        const Arr& a = arr(ia);
        for (int64_t q = 0; q < count; ++q) {
          double* l = out.v.data() + q * n * n;
          const int64_t minor = cholesky_lower(a.v.data() + q * n * n, l, n);
          if (minor) {
            throw std::runtime_error("linalg.cholesky: (batch element " + std::to_string(q) +
                                     "): the input is not positive-definite (the leading minor of order " +
                                     std::to_string(minor) + " is not positive-definite)");
          }
          if (upper) {
            for (int64_t i = 0; i < n; ++i) {
              for (int64_t j = 0; j < i; ++j) std::swap(l[i * n + j], l[j * n + i]);
            }
          }
        }
        if (out.needs) record(Op::kCholesky, upper ? 1 : 0, o, ia, -1, 0, 0, n, count);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kTriSolve: {
        const int ia = tensor_in(I, 0), ib = tensor_in(I, 1);
        const bool upper = integer(I.in[2]) != 0, left = integer(I.in[3]) != 0, unit = integer(I.in[4]) != 0;
        if (!left) throw NotCovered("linalg_solve_triangular with left=False");
        const Shape sa = arr(ia).shape, sb = arr(ib).shape;
        if (sa.size() < 2 || sb.size() < 2 || sa[sa.size() - 1] != sa[sa.size() - 2] || sb[sb.size() - 2] != sa.back()) {
          throw std::runtime_error("linalg.solve_triangular: shapes " + shape_text(sa) + " and " + shape_text(sb) + " do not fit");
        }
        const int64_t n = sa.back(), k = sb.back();
        const MatBatch mb = mat_batch(sa, sb, "linalg_solve_triangular");
        const int o = fresh(mb.result(n, k), arr(ia).needs || arr(ib).needs);
        const Arr &a = arr(ia), &b = arr(ib);
        Arr& out = arr(o);
        for (int64_t q = 0; q < mb.count; ++q) {
          tri_solve(a.v.data() + (mb.a_shared ? 0 : q * n * n), b.v.data() + (mb.b_shared ? 0 : q * n * k),
                    out.v.data() + q * n * k, n, k, upper, false, unit);
        }
        if (out.needs) {
          record(Op::kTriSolve,
                 static_cast<uint8_t>((upper ? 1 : 0) | (unit ? 2 : 0) | (mb.a_shared ? 4 : 0) | (mb.b_shared ? 8 : 0)),
                 o, ia, ib, 0, 0, n, k, mb.count);
        }
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kIndexSelect: {
        const int ia = tensor_in(I, 0);
        const Shape s = arr(ia).shape;
        const int64_t nd = static_cast<int64_t>(s.size());
        int64_t dim = 0, which = -1;
        if (I.sub == 0) {
          dim = wrap_dim(integer(I.in[1]), nd);
          const Reg& r = regs[I.in[2]];
          if (r.kind != Reg::kIndex) throw NotCovered("index_select with an index that is not a constant int tensor");
          which = r.i;
          if (indices[which].shape.size() > 1) throw std::runtime_error("index_select(): index must be 0-d or 1-d");
        } else {
          const Reg& r = regs[I.in[1]];
          if (r.kind != Reg::kIndexList) throw NotCovered("indexing by tensors that are not constant int tensors");
          for (size_t k = 0; k < r.list.size(); ++k) {
            if (r.list[k] < 0) continue;
            if (which >= 0) throw NotCovered("indexing by more than one index tensor");
            which = r.list[k], dim = static_cast<int64_t>(k);
          }
          if (which < 0 || dim >= nd) throw std::runtime_error("index(): too many indices for the array");
        }
        const IndexArr& idx = indices[which];
        const int64_t n = s[dim], len = static_cast<int64_t>(idx.v.size());
        for (int64_t j : idx.v) {
          if (j < -n || j >= n) {
            throw std::runtime_error("index " + std::to_string(j) + " is out of bounds for dimension " + std::to_string(dim) +
                                     " with size " + std::to_string(n));
          }
        }
        Shape os(s.begin(), s.begin() + dim);
        if (I.sub == 0) {
          os.push_back(len);
        } else {
          os.insert(os.end(), idx.shape.begin(), idx.shape.end());
        }
        os.insert(os.end(), s.begin() + dim + 1, s.end());
        const auto [outer, inner] = outer_inner(s, dim);
        const int o = fresh(os, arr(ia).needs);
        const Arr& a = arr(ia);
        Arr& out = arr(o);
        for (int64_t i = 0; i < outer; ++i) {
          for (int64_t m = 0; m < len; ++m) {
            const int64_t j = idx.v[m] < 0 ? idx.v[m] + n : idx.v[m];
            std::copy_n(a.v.data() + (i * n + j) * inner, inner, out.v.data() + (i * len + m) * inner);
          }
        }
        if (out.needs) record(Op::kIndexSelect, 0, o, ia, -1, 0, 0, dim, which);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kFullLike: {
        const int ia = tensor_in(I, 0);
        const double v = I.sub == 2 ? number(I.in[1]) : I.sub == 1 ? 1.0 : 0.0;
        const int o = fresh(arr(ia).shape, false);
        std::fill(arr(o).v.begin(), arr(o).v.end(), v);
        set_tensor(I.out[0], o);
        return;
      }
      case Op::kScalar:
        scalar_op(I);
        return;
      case Op::kSize: {
        const Shape& s = arr(tensor_in(I, 0)).shape;
        if (s.empty()) throw std::runtime_error("size() of a 0-d array");
        const int64_t d = I.in.size() > 1 ? wrap_dim(integer(I.in[1]), static_cast<int64_t>(s.size())) : 0;
        set_int(I.out[0], s[d]);
        return;
      }
      case Op::kSizes: {
        Reg& r = regs[I.out[0]];
        r.kind = Reg::kIntList;
        r.list = arr(tensor_in(I, 0)).shape;
        return;
      }
      case Op::kDim:
        set_int(I.out[0], static_cast<int64_t>(arr(tensor_in(I, 0)).shape.size()));
        return;
      case Op::kNumel:
        set_int(I.out[0], static_cast<int64_t>(arr(tensor_in(I, 0)).v.size()));
        return;
      case Op::kListGet: {
        const Reg& l = regs[I.in[0]];
        int64_t k = integer(I.in[1]);
        const int64_t n = static_cast<int64_t>(l.list.size());
        if (k < -n || k >= n) throw std::runtime_error("list index out of range");
        set_int(I.out[0], l.list[k < 0 ? k + n : k]);
        return;
      }
      case Op::kListLen:
        set_int(I.out[0], static_cast<int64_t>(regs[I.in[0]].list.size()));
        return;
      case Op::kListConstruct: {
        if (I.sub == 2) {  // optional index arrays: -1 for None
          Reg& r = regs[I.out[0]];
          r.kind = Reg::kIndexList;
          r.list.resize(I.in.size());
          for (size_t k = 0; k < I.in.size(); ++k) {
            const Reg& e = regs[I.in[k]];
            if (e.kind == Reg::kNone) {
              r.list[k] = -1;
            } else if (e.kind == Reg::kIndex) {
              r.list[k] = e.i;
            } else {
              throw NotCovered("indexing by a float or boolean tensor");
            }
          }
          return;
        }
        Reg& r = regs[I.out[0]];
        r.kind = I.sub ? Reg::kTensorList : Reg::kIntList;
        r.list.resize(I.in.size());
        for (size_t k = 0; k < I.in.size(); ++k) r.list[k] = I.sub ? tensor_in(I, k) : integer(I.in[k]);
        return;
      }
      case Op::kLoop: {
        const Block& b = I.blocks[0];
        const int64_t max_trips = integer(I.in[0]);
        bool cond = integer(I.in[1]) != 0;
        const size_t carried = I.in.size() - 2;
        for (size_t k = 0; k < carried; ++k) regs[b.params[k + 1]] = regs[I.in[k + 2]];
        std::vector<Reg> next(carried);  // through a copy: the body may return its parameters swapped
        for (int64_t trip = 0; cond && trip < max_trips; ++trip) {
          set_int(b.params[0], trip);
          exec(b.body);
          cond = integer(b.rets[0]) != 0;
          for (size_t k = 0; k < carried; ++k) next[k] = regs[b.rets[k + 1]];
          for (size_t k = 0; k < carried; ++k) regs[b.params[k + 1]] = next[k];
        }
        for (size_t k = 0; k < carried; ++k) regs[I.out[k]] = regs[b.params[k + 1]];
        return;
      }
      case Op::kIf: {
        const Block& b = I.blocks[integer(I.in[0]) != 0 ? 0 : 1];
        exec(b.body);
        for (size_t k = 0; k < I.out.size(); ++k) regs[I.out[k]] = regs[b.rets[k]];
        return;
      }
      case Op::kRaise: {
        const Reg& r = regs[I.in[0]];
        throw std::runtime_error("Exception: " + (r.kind == Reg::kString ? strings[r.i] : std::string("raised in forward")));
      }
    }
  }

  void permute_copy(Arr& a, Arr& out, int64_t d0, int64_t d1, bool backward) {
    // out = a with dimensions d0 and d1 swapped; backward: a.g += (out.g with them swapped back)
    const Shape& s = a.shape;
    std::array<int64_t, kMaxDim> sa{}, sp{}, so{};
    broadcast_strides(s, s, sa.data());
    sp = sa;
    std::swap(sp[d0], sp[d1]);
    broadcast_strides(out.shape, out.shape, so.data());
    if (!backward) {
      each(out.shape, sp.data(), so.data(), [&](int64_t, int64_t j, int64_t k) { out.v[k] = a.v[j]; });
    } else {
      each(out.shape, sp.data(), so.data(), [&](int64_t, int64_t j, int64_t k) { a.g[j] += out.g[k]; });
    }
  }

  void scalar_op(const Instr& I) {
    Reg& out = regs[I.out[0]];
    const bool any_double = std::any_of(I.in.begin(), I.in.end(), [&](int r) { return regs[r].kind == Reg::kDouble; });
    auto a_int = [&] { return integer(I.in[0]); };
    auto b_int = [&] { return integer(I.in[1]); };
    auto a_num = [&] { return number(I.in[0]); };
    auto b_num = [&] { return number(I.in[1]); };
    auto set_bool = [&](bool v) { out.kind = Reg::kBool, out.i = v; };
    auto set_num = [&](double v) {
      if (I.int_result) {
        out.kind = Reg::kInt, out.i = static_cast<int64_t>(v);
      } else {
        out.kind = Reg::kDouble, out.d = v;
      }
    };
    const bool ints = !any_double && I.int_result;
    switch (I.sub) {
      case kSAdd: ints ? set_int(I.out[0], a_int() + b_int()) : set_num(a_num() + b_num()); return;
      case kSSub: ints ? set_int(I.out[0], a_int() - b_int()) : set_num(a_num() - b_num()); return;
      case kSMul: ints ? set_int(I.out[0], a_int() * b_int()) : set_num(a_num() * b_num()); return;
      case kSDiv: set_num(a_num() / b_num()); return;
      case kSFloorDiv: ints ? set_int(I.out[0], floor_div(a_int(), b_int())) : set_num(std::floor(a_num() / b_num())); return;
      case kSRem:
        if (ints) {
          const int64_t b = b_int();
          set_int(I.out[0], a_int() - b * floor_div(a_int(), b));
        } else {
          const double a = a_num(), b = b_num();
          set_num(a - b * std::floor(a / b));
        }
        return;
      case kSNeg: ints ? set_int(I.out[0], -a_int()) : set_num(-a_num()); return;
      case kSLt: set_bool(a_num() < b_num()); return;
      case kSGt: set_bool(a_num() > b_num()); return;
      case kSLe: set_bool(a_num() <= b_num()); return;
      case kSGe: set_bool(a_num() >= b_num()); return;
      case kSEq: set_bool(a_num() == b_num()); return;
      case kSNe: set_bool(a_num() != b_num()); return;
      case kSNot: set_bool(a_int() == 0); return;
      case kSAnd: set_bool(a_int() != 0 && b_int() != 0); return;
      case kSOr: set_bool(a_int() != 0 || b_int() != 0); return;
      case kSDeriveIndex: set_int(I.out[0], integer(I.in[1]) + integer(I.in[0]) * integer(I.in[2])); return;
      case kSRangeLength: {
        const int64_t lo = integer(I.in[0]), hi = integer(I.in[1]), st = integer(I.in[2]);
        if (st == 0) throw std::runtime_error("range() step must not be zero");
        int64_t n = 0;
        if (st > 0 && lo < hi) n = (hi - lo + st - 1) / st;
        if (st < 0 && lo > hi) n = (lo - hi - st - 1) / (-st);
        set_int(I.out[0], n);
        return;
      }
      case kSCast: set_num(a_num()); return;
      case kSPow: set_num(std::pow(a_num(), b_num())); return;
    }
    throw std::runtime_error("scalar operation");
  }

  // ---- backward ----
  void backward(int out_id) {
    for (int64_t k = n_const; k < top; ++k) {
      Arr& a = arrs[k];
      if (a.needs) a.g.assign(a.v.size(), 0.0);
    }
    std::fill(arrs[out_id].g.begin(), arrs[out_id].g.end(), 1.0);
    for (auto it = tape.rbegin(); it != tape.rend(); ++it) back_step(*it);
  }

  void back_step(const Rec& r) {
    Arr& out = arrs[r.out];
    switch (r.op) {
      case Op::kBin: {
        Arr &a = arrs[r.a], &b = arrs[r.b];
        const bool na = a.needs, nb = b.needs;
        const double alpha = r.s0;
        with_binary_back(r.sub, alpha, [&](auto fb) {
          double ga = 0, gb = 0;
          if (a.shape == b.shape) {
            for (size_t k = 0; k < out.v.size(); ++k) {
              fb(a.v[k], b.v[k], out.v[k], out.g[k], ga, gb);
              if (na) a.g[k] += ga;
              if (nb) b.g[k] += gb;
            }
          } else {
            broadcast_each(a.shape, b.shape, out.shape, [&](int64_t k, int64_t ja, int64_t jb) {
              fb(a.v[ja], b.v[jb], out.v[k], out.g[k], ga, gb);
              if (na) a.g[ja] += ga;
              if (nb) b.g[jb] += gb;
            });
          }
        });
        return;
      }
      case Op::kBinS: {
        Arr& a = arrs[r.a];
        const double s = r.s0, alpha = r.s1;
        const size_t nk = out.v.size();
        switch (r.sub) {
          case kAdd:
          case kSubtract:
            for (size_t k = 0; k < nk; ++k) a.g[k] += out.g[k];
            break;
          case kRSub:
            for (size_t k = 0; k < nk; ++k) a.g[k] -= alpha * out.g[k];
            break;
          case kMul:
            for (size_t k = 0; k < nk; ++k) a.g[k] += out.g[k] * s;
            break;
          case kDiv:
            for (size_t k = 0; k < nk; ++k) a.g[k] += out.g[k] / s;
            break;
          case kPow:
            if (s == 2.0) {
              for (size_t k = 0; k < nk; ++k) a.g[k] += out.g[k] * 2.0 * a.v[k];
            } else if (s != 0.0) {
              for (size_t k = 0; k < nk; ++k) a.g[k] += out.g[k] * s * pow_fwd(a.v[k], s - 1.0);
            }
            break;
          case kRPow:
            for (size_t k = 0; k < nk; ++k) a.g[k] += (s == 0.0 && a.v[k] >= 0.0) ? 0.0 : out.g[k] * out.v[k] * std::log(s);
            break;
        }
        return;
      }
      case Op::kUnary: {
        Arr& a = arrs[r.a];
        with_unary_back(r.sub, [&](auto fb) {
          for (size_t k = 0; k < out.v.size(); ++k) a.g[k] += fb(a.v[k], out.v[k], out.g[k]);
        });
        return;
      }
      case Op::kSoftplus: {
        Arr& a = arrs[r.a];
        const double beta = r.s0, threshold = r.s1;
        for (size_t k = 0; k < out.v.size(); ++k) {
          const double z = a.v[k] * beta;
          a.g[k] += z > threshold ? out.g[k] : out.g[k] * sigmoid(z);
        }
        return;
      }
      case Op::kSum:
      case Op::kMean:
      case Op::kLogSumExp: {
        Arr& a = arrs[r.a];
        const Shape& s = a.shape;
        const uint64_t mask = static_cast<uint64_t>(r.p0);
        Shape kept(s);
        for (size_t k = 0; k < s.size(); ++k) {
          if (mask >> k & 1) kept[k] = 1;
        }
        std::array<int64_t, kMaxDim> sa{}, so{};
        broadcast_strides(s, s, sa.data());
        broadcast_strides(kept, s, so.data());
        if (r.op == Op::kLogSumExp) {
          each(s, sa.data(), so.data(), [&](int64_t, int64_t j, int64_t k) {
            if (std::isfinite(out.v[k])) a.g[j] += out.g[k] * std::exp(a.v[j] - out.v[k]);
          });
        } else {
          const double scale = r.op == Op::kMean ? 1.0 / r.s0 : 1.0;
          each(s, sa.data(), so.data(), [&](int64_t, int64_t j, int64_t k) { a.g[j] += out.g[k] * scale; });
        }
        return;
      }
      case Op::kSelect:
      case Op::kSlice: {
        Arr& a = arrs[r.a];
        const Shape& s = a.shape;
        const int64_t dim = r.p0;
        const auto [outer, inner] = outer_inner(s, dim);
        const int64_t n = s[dim];
        const int64_t len = r.op == Op::kSelect ? 1 : out.shape[dim];
        const int64_t start = r.p1, step = r.op == Op::kSelect ? 1 : r.p2;
        for (int64_t i = 0; i < outer; ++i) {
          for (int64_t m = 0; m < len; ++m) {
            double* dst = a.g.data() + (i * n + start + m * step) * inner;
            const double* src = out.g.data() + (i * len + m) * inner;
            for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
          }
        }
        return;
      }
      case Op::kReshape: {
        Arr& a = arrs[r.a];
        for (size_t k = 0; k < a.g.size(); ++k) a.g[k] += out.g[k];
        return;
      }
      case Op::kIndexSelect: {
        Arr& a = arrs[r.a];
        const IndexArr& idx = indices[r.p1];
        const int64_t dim = r.p0, n = a.shape[dim], len = static_cast<int64_t>(idx.v.size());
        const auto [outer, inner] = outer_inner(a.shape, dim);
        for (int64_t i = 0; i < outer; ++i) {
          for (int64_t m = 0; m < len; ++m) {
            const int64_t j = idx.v[m] < 0 ? idx.v[m] + n : idx.v[m];
            double* dst = a.g.data() + (i * n + j) * inner;
            const double* src = out.g.data() + (i * len + m) * inner;
            for (int64_t q = 0; q < inner; ++q) dst[q] += src[q];
          }
        }
        return;
      }
      case Op::kPermute:
        permute_copy(arrs[r.a], out, r.p0, r.p1, true);
        return;
      case Op::kExpand: {
        Arr& a = arrs[r.a];
        std::array<int64_t, kMaxDim> sa{}, so{};
        broadcast_strides(a.shape, out.shape, sa.data());
        broadcast_strides(out.shape, out.shape, so.data());
        each(out.shape, sa.data(), so.data(), [&](int64_t k, int64_t j, int64_t) { a.g[j] += out.g[k]; });
        return;
      }
      case Op::kStack:
      case Op::kCat: {
        const int64_t dim = r.p2;
        const Shape& os = out.shape;
        const auto [outer, inner] = outer_inner(os, dim);
        const int64_t total = os[dim];
        int64_t at = 0;
        for (int64_t q = 0; q < r.p1; ++q) {
          Arr& a = arrs[extra[r.p0 + q]];
          const int64_t len = r.op == Op::kStack ? 1 : a.shape[dim];
          if (a.needs) {
            for (int64_t i = 0; i < outer; ++i) {
              const double* src = out.g.data() + (i * total + at) * inner;
              double* dst = a.g.data() + i * len * inner;
              for (int64_t j = 0; j < len * inner; ++j) dst[j] += src[j];
            }
          }
          at += len;
        }
        return;
      }
      case Op::kMatmul: {
        Arr &a = arrs[r.a], &b = arrs[r.b];
        const int64_t n = r.p0, k = r.p1, m = r.p2, count = std::max<int64_t>(1, static_cast<int64_t>(r.s0));
        const bool a_shared = r.sub & 1, b_shared = r.sub & 2;
        for (int64_t q = 0; q < count; ++q) {
          const int64_t oa = a_shared ? 0 : q * n * k, ob = b_shared ? 0 : q * k * m;
          mm_kernel_back(a.v.data() + oa, b.v.data() + ob, out.g.data() + q * n * m, a.needs ? a.g.data() + oa : nullptr,
                         b.needs ? b.g.data() + ob : nullptr, n, k, m);
        }
        return;
      }
      case Op::kDiagonal: {
        Arr& a = arrs[r.a];
        const int64_t* at = extra.data() + r.p0;
        for (int64_t k = 0; k < r.p1; ++k) a.g[at[k]] += out.g[k];
        return;
      }
      case Op::kCholesky: {
        Arr& a = arrs[r.a];
        if (!a.needs) return;
        const int64_t n = r.p0, nn = n * n;
        scratch.resize(5 * nn);
        double *l = scratch.data(), *gl = l + nn, *g = gl + nn, *y = g + nn, *z = y + nn;
        for (int64_t q = 0; q < r.p1; ++q) {
          const double *lv = out.v.data() + q * nn, *lg = out.g.data() + q * nn;
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              l[i * n + j] = r.sub ? lv[j * n + i] : lv[i * n + j];  // upper: U = L^T
              gl[i * n + j] = r.sub ? lg[j * n + i] : lg[i * n + j];
            }
          }
          // g = sym(Phi(tril(L^T gL)))
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j <= i; ++j) {
              double t = 0;
              for (int64_t p = i; p < n; ++p) t += l[p * n + i] * gl[p * n + j];
              g[i * n + j] = g[j * n + i] = 0.5 * t;
            }
          }
          tri_solve(l, g, y, n, n, false, true, false);  // y = L^-T g
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) g[i * n + j] = y[j * n + i];
          }
          tri_solve(l, g, z, n, n, false, true, false);  // z = L^-T y^T = (y L^-1)^T
          double* ga = a.g.data() + q * nn;
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) ga[i * n + j] += z[j * n + i];
          }
        }
        return;
      }
      case Op::kTriSolve: {
        Arr &a = arrs[r.a], &b = arrs[r.b];
        const int64_t n = r.p0, k = r.p1, count = r.p2;
        const bool upper = r.sub & 1, unit = r.sub & 2, a_shared = r.sub & 4, b_shared = r.sub & 8;
        scratch.resize(n * k);
        double* y = scratch.data();
        for (int64_t q = 0; q < count; ++q) {
          const double* av = a.v.data() + (a_shared ? 0 : q * n * n);
          const double *xv = out.v.data() + q * n * k, *gx = out.g.data() + q * n * k;
          tri_solve(av, gx, y, n, k, upper, true, unit);  // gB = A^-T gX
          if (b.needs) {
            double* gb = b.g.data() + (b_shared ? 0 : q * n * k);
            for (int64_t e = 0; e < n * k; ++e) gb[e] += y[e];
          }
          if (a.needs) {  // gA = -gB X^T on A's triangle
            double* ga = a.g.data() + (a_shared ? 0 : q * n * n);
            for (int64_t i = 0; i < n; ++i) {
              const int64_t j0 = upper ? (unit ? i + 1 : i) : 0, j1 = upper ? n : (unit ? i : i + 1);
              for (int64_t j = j0; j < j1; ++j) {
                double t = 0;
                for (int64_t c = 0; c < k; ++c) t += y[i * k + c] * xv[j * k + c];
                ga[i * n + j] -= t;
              }
            }
          }
        }
        return;
      }
      default:
        return;
    }
  }
};

ScriptProgram::ScriptProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScriptProgram::~ScriptProgram() = default;
int64_t ScriptProgram::size() const { return impl_->n_instr; }

std::unique_ptr<ScriptProgram> ScriptProgram::compile(const torch::jit::Module& module, std::string* why_not) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<ScriptProgram> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  std::shared_ptr<jit::Graph> graph;
  try {
    // Freezing prepares a graph for inference: it drops detach() (a no-op there) and the like,
    // which change the gradient. A module that stops gradients in any way stays on LibTorch.
    std::shared_ptr<jit::Graph> plain = module.get_method("forward").graph()->copy();
    jit::Inline(*plain);
    std::string stops;
    std::function<void(const jit::Block*)> scan = [&](const jit::Block* b) {
      for (const jit::Node* n : b->nodes()) {
        const std::string k = n->kind().toQualString();
        if (k == "aten::detach" || k == "aten::detach_" || k == "aten::requires_grad_" || k == "aten::set_grad_enabled" ||
            k == "prim::Enter" || k == "prim::Exit" || k == "aten::stop_gradient") {
          stops = k;
        }
        for (const jit::Block* sub : n->blocks()) scan(sub);
      }
    };
    scan(plain->block());
    if (!stops.empty()) return fail("uses " + stops + " (it changes the gradient), which nmcmc's evaluator does not cover");
    jit::Module frozen = jit::freeze(module, c10::nullopt, /*optimize_numerics=*/false);
    graph = frozen.get_method("forward").graph()->copy();
    jit::Inline(*graph);
    jit::ConstantPropagation(graph);
    jit::EliminateDeadCode(graph);
  } catch (const c10::Error& e) {
    return fail(std::string("freezing the module failed: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(std::string("freezing the module failed: ") + e.what());
  }
  auto impl = std::make_unique<Impl>();
  if (graph->inputs().size() != 2 || !Impl::is_tensor(graph->inputs()[1])) return fail("forward is not forward(self, x: Tensor)");
  if (graph->outputs().size() != 1 || !Impl::is_tensor(graph->outputs()[0])) return fail("forward does not return one Tensor");
  try {
    impl->def(graph->inputs()[0]);  // self: unused once frozen
    impl->x_reg = impl->def(graph->inputs()[1]);
    Block main;
    for (const jit::Node* n : graph->nodes()) {
      if (n->kind() == c10::prim::Constant) {
        impl->constant(n);
      } else {
        main.body.push_back(impl->compile_node(n));
        ++impl->n_instr;
      }
    }
    impl->out_reg = impl->use(graph->outputs()[0]);
    impl->main = std::move(main);
  } catch (const Unsupported& u) {
    return fail("uses " + u.why + ", which nmcmc's evaluator does not cover");
  } catch (const c10::Error& e) {
    return fail(std::string("compiling failed: ") + e.what_without_backtrace());
  }
  impl->n_const = static_cast<int64_t>(impl->arrs.size());
  impl->reg_of.clear();
  return std::unique_ptr<ScriptProgram>(new ScriptProgram(std::move(impl)));
}

void ScriptProgram::run(const double* x, int64_t c, int64_t d, double* out, double* grad) const {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> lock(p.mutex);
  p.top = p.n_const;
  p.tape.clear();
  p.extra.clear();
  const int xid = p.fresh({c, d}, true);
  std::copy_n(x, c * d, p.arrs[xid].v.data());
  p.set_tensor(p.x_reg, xid);
  p.exec(p.main.body);
  const Reg& r = p.regs[p.out_reg];
  if (r.kind != Reg::kTensor) throw DataError("forward returned no Tensor");
  const Arr& o = p.arrs[r.i];
  if (o.shape.size() != 1 || o.shape[0] != c) {
    throw DataError("forward returned shape " + shape_text(o.shape) + " for a batch of " + std::to_string(c) + " rows");
  }
  std::copy(o.v.begin(), o.v.end(), out);
  if (!grad) return;
  if (!o.needs) {
    std::fill_n(grad, c * d, 0.0);
    return;
  }
  p.backward(static_cast<int>(r.i));
  std::copy(p.arrs[xid].g.begin(), p.arrs[xid].g.end(), grad);
}

}  // namespace nmcmc
