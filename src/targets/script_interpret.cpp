// The evaluator's interpreter: runs the instructions on float64 arrays, recording what depends on x
// on the tape (Note [Native engine], script_program.cpp). The shape operations: script_shape.cpp.

#include "script_program_impl.hpp"

namespace nmcmc {

void ScriptProgram::Impl::step(const Instr& I) {
  switch (I.op) {
    case Op::kBin:
    case Op::kBinS:
    case Op::kUnary:
    case Op::kSoftplus:
      return step_elementwise(I);
    case Op::kSum:
    case Op::kMean:
    case Op::kLogSumExp:
      return step_reduce(I);
    case Op::kSelect:
    case Op::kSlice:
      return step_index(I);
    case Op::kReshape:
    case Op::kPermute:
    case Op::kExpand:
      return step_reshape(I);
    case Op::kStack:
    case Op::kCat:
      return step_join(I);
    case Op::kMatmul:
    case Op::kEye:
    case Op::kDiagonal:
    case Op::kCholesky:
    case Op::kTriSolve:
      return step_linear_algebra(I);
    case Op::kIndexSelect:
    case Op::kFullLike:
      return step_gather(I);
    case Op::kNop:
    case Op::kScalar:
    case Op::kSize:
    case Op::kSizes:
    case Op::kDim:
    case Op::kNumel:
    case Op::kListGet:
    case Op::kListLen:
    case Op::kListConstruct:
    case Op::kLoop:
    case Op::kIf:
    case Op::kRaise:
      return step_control(I);
  }
}

void ScriptProgram::Impl::step_elementwise(const Instr& I) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_reduce(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_linear_algebra(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_control(const Instr& I) {
  switch (I.op) {
    case Op::kNop:
      return;
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
    default:
      return;
  }
}

void ScriptProgram::Impl::scalar_op(const Instr& I) {
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

}  // namespace nmcmc
