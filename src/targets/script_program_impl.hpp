#pragma once
// ScriptProgram's state: the compiled program, its registers and arrays, the tape (Note [Native
// engine], script_program.cpp). Compiling: script_compile.cpp; running: script_interpret.cpp; the
// backward pass: script_tape.cpp.
#include <deque>
#include <mutex>
#include <unordered_map>

#include "script_ops.hpp"

namespace nmcmc {

using namespace script;  // this header is private to the evaluator's four files

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

  void constant(const jit::Node* n);
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

  Block compile_block(const jit::Block* b);

  Instr compile_node(const jit::Node* n);

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

  void step(const Instr& I);
  // the operations by kind (script_interpret.cpp)
  void step_elementwise(const Instr& I);
  void step_reduce(const Instr& I);
  void step_index(const Instr& I);
  void step_reshape(const Instr& I);
  void step_join(const Instr& I);
  void step_linear_algebra(const Instr& I);
  void step_gather(const Instr& I);
  void step_control(const Instr& I);

  void permute_copy(Arr& a, Arr& out, int64_t d0, int64_t d1, bool backward);

  void scalar_op(const Instr& I);

  // ---- backward ----
  void backward(int out_id);

  void back_step(const Rec& r);
  // the backward of each kind (script_tape.cpp)
  void back_elementwise(const Rec& r);
  void back_reduce_shape(const Rec& r);
  void back_linear_algebra(const Rec& r);
};

}  // namespace nmcmc
