#pragma once
// The evaluator's parts (Note [Native engine], script_program.cpp): its instruction set, arrays,
// tape records and the array kernels shared by the compiler, the interpreter and the tape.
#include <torch/script.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/targets/script_program.hpp"

namespace nmcmc {
namespace script {

namespace jit = torch::jit;
using Shape = std::vector<int64_t>;
constexpr int kMaxDim = 8;

using NotCovered = ScriptProgram::NotCovered;
/// An operation outside the evaluator, found at compile time.
struct Unsupported {
  std::string why;
};

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t k : s) n *= k;
  return n;
}

inline std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t k = 0; k < s.size(); ++k) t += (k ? ", " : "") + std::to_string(s[k]);
  return t + "]";
}

inline int64_t wrap_dim(int64_t d, int64_t nd) {
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
inline void broadcast_strides(const Shape& in, const Shape& out, int64_t* st) {
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

inline Shape broadcast_shape(const Shape& a, const Shape& b) {
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
inline void each(const Shape& shape, const int64_t* sa, const int64_t* sb, F&& f) {
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
inline bool layout_of(const Shape& s, const Shape& out, Lay& lay, int64_t& size) {
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
inline void rows_loop(int64_t rows, int64_t cols, F& f) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t o = r * cols + j;
      f(o, lay_index<LA>(o, r, j), lay_index<LB>(o, r, j));
    }
  }
}

template <int LA, typename F>
inline void rows_loop_b(int lb, int64_t rows, int64_t cols, F& f) {
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
inline void broadcast_each(const Shape& sa, const Shape& sb, const Shape& out, F&& f) {
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
inline std::pair<int64_t, int64_t> outer_inner(const Shape& s, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= s[k];
  for (size_t k = dim + 1; k < s.size(); ++k) inner *= s[k];
  return {outer, inner};
}

inline void check_rank(const Shape& s) {
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
inline torch::Tensor blob_at(const double* v, int64_t rows, int64_t cols) {
  return torch::from_blob(const_cast<double*>(v), {rows, cols}, torch::kFloat64);
}

/// out (n x m) = a (n x k) b (k x m), or += when `add`.
inline void mm_kernel(const double* a, const double* b, double* out, int64_t n, int64_t k, int64_t m, bool add) {
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
inline void mm_kernel_back(const double* a, const double* b, const double* go, double* ga, double* gb, int64_t n, int64_t k,
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
inline int64_t cholesky_lower(const double* a, double* l, int64_t n) {
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
inline void tri_solve(const double* a, const double* b, double* x, int64_t n, int64_t k, bool upper, bool trans, bool unit) {
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
inline MatBatch mat_batch(const Shape& sa, const Shape& sb, const char* what) {
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
inline void with_unary(uint8_t sub, Body&& body) {
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
inline void with_unary_back(uint8_t sub, Body&& body) {
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
inline void with_binary(uint8_t sub, double alpha, Body&& body) {
  switch (sub) {
#define NMCMC_BINARY(S) \
  case S: return body([alpha](double a, double b) { return binary_fwd(S, a, b, alpha); });
    NMCMC_BINARY(kAdd) NMCMC_BINARY(kSubtract) NMCMC_BINARY(kRSub) NMCMC_BINARY(kMul) NMCMC_BINARY(kDiv)
    NMCMC_BINARY(kPow) NMCMC_BINARY(kRPow)
#undef NMCMC_BINARY
  }
}
template <typename Body>
inline void with_binary_back(uint8_t sub, double alpha, Body&& body) {
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

inline int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw std::runtime_error("integer division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}


}  // namespace script
}  // namespace nmcmc
