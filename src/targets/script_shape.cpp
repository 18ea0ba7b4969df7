// The evaluator's shape operations: select, slice, reshape and its kin, permute, expand, stack and
// cat, index_select, full_like (Note [Native engine], script_program.cpp).

#include "script_program_impl.hpp"

namespace nmcmc {

void ScriptProgram::Impl::step_index(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_reshape(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_join(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::step_gather(const Instr& I) {
  switch (I.op) {
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
    default:
      return;
  }
}

void ScriptProgram::Impl::permute_copy(Arr& a, Arr& out, int64_t d0, int64_t d1, bool backward) {
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

}  // namespace nmcmc
