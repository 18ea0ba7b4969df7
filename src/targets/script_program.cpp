#include "nmcmc/targets/script_program.hpp"

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

#include "script_program_impl.hpp"

namespace nmcmc {

ScriptProgram::ScriptProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScriptProgram::~ScriptProgram() = default;
int64_t ScriptProgram::size() const { return impl_->n_instr; }

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
