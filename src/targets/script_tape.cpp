// The evaluator's backward pass: the tape walked in reverse (Note [Native engine],
// script_program.cpp).

#include "script_program_impl.hpp"

namespace nmcmc {

void ScriptProgram::Impl::backward(int out_id) {
  for (int64_t k = n_const; k < top; ++k) {
    Arr& a = arrs[k];
    if (a.needs) a.g.assign(a.v.size(), 0.0);
  }
  std::fill(arrs[out_id].g.begin(), arrs[out_id].g.end(), 1.0);
  for (auto it = tape.rbegin(); it != tape.rend(); ++it) back_step(*it);
}

void ScriptProgram::Impl::back_step(const Rec& r) {
  switch (r.op) {
    case Op::kBin:
    case Op::kBinS:
    case Op::kUnary:
    case Op::kSoftplus:
      return back_elementwise(r);
    case Op::kSum:
    case Op::kMean:
    case Op::kLogSumExp:
    case Op::kSelect:
    case Op::kSlice:
    case Op::kReshape:
    case Op::kIndexSelect:
    case Op::kPermute:
    case Op::kExpand:
    case Op::kStack:
    case Op::kCat:
      return back_reduce_shape(r);
    case Op::kMatmul:
    case Op::kDiagonal:
    case Op::kCholesky:
    case Op::kTriSolve:
      return back_linear_algebra(r);
    default:
      return;
  }
}

void ScriptProgram::Impl::back_elementwise(const Rec& r) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::back_reduce_shape(const Rec& r) {
  Arr& out = arrs[r.out];
  switch (r.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::back_linear_algebra(const Rec& r) {
  Arr& out = arrs[r.out];
  switch (r.op) {
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

}  // namespace nmcmc
