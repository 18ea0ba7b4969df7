// The evaluator's compiler: a frozen TorchScript graph to instructions (Note [Native engine],
// script_program.cpp).
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include "script_program_impl.hpp"

namespace nmcmc {

namespace {
/// The covered operations by name: elementwise on tensors, on scalars.
const std::unordered_map<std::string, uint8_t> kUnaryOps = {
    {"aten::neg", kNeg},       {"aten::exp", kExp},       {"aten::log", kLog},         {"aten::log1p", kLog1p},
    {"aten::expm1", kExpm1},   {"aten::sqrt", kSqrt},     {"aten::rsqrt", kRsqrt},     {"aten::sigmoid", kSigmoid},
    {"aten::log_sigmoid", kLogSigmoid}, {"aten::tanh", kTanh}, {"aten::abs", kAbs},    {"aten::sin", kSin},
    {"aten::cos", kCos},       {"aten::reciprocal", kRecip}, {"aten::erf", kErf},      {"aten::square", kSquare},
    {"aten::relu", kRelu}};
const std::unordered_map<std::string, uint8_t> kBinaryOps = {
    {"aten::add", kAdd}, {"aten::sub", kSubtract}, {"aten::rsub", kRSub}, {"aten::mul", kMul},
    {"aten::div", kDiv}, {"aten::pow", kPow}, {"aten::true_divide", kDiv}};
const std::unordered_map<std::string, uint8_t> kScalarOps = {
    {"aten::add", kSAdd},  {"aten::sub", kSSub},  {"aten::mul", kSMul},         {"aten::div", kSDiv},
    {"aten::floordiv", kSFloorDiv}, {"aten::remainder", kSRem}, {"aten::neg", kSNeg},    {"aten::lt", kSLt},
    {"aten::gt", kSGt},    {"aten::le", kSLe},    {"aten::ge", kSGe},           {"aten::eq", kSEq},
    {"aten::ne", kSNe},    {"aten::__not__", kSNot}, {"aten::__and__", kSAnd},  {"aten::__or__", kSOr},
    {"aten::__derive_index", kSDeriveIndex}, {"aten::__range_length", kSRangeLength},
    {"aten::Int", kSCast}, {"aten::Float", kSCast}, {"aten::pow", kSPow}};

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
const Direct kDirectOps[] = {
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
}  // namespace

void ScriptProgram::Impl::constant(const jit::Node* n) {
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

Block ScriptProgram::Impl::compile_block(const jit::Block* b) {
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

Instr ScriptProgram::Impl::compile_node(const jit::Node* n) {
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
  const bool first_tensor = !ins.empty() && is_tensor(ins[0]);
  const bool any_tensor = std::any_of(ins.begin(), ins.end(), [](const jit::Value* v) { return is_tensor(v); });
  if (!any_tensor && !ins.empty() && kScalarOps.count(kind)) {
    for (const jit::Value* v : ins) {
      if (!is_number(v)) throw unsupported();
    }
    const auto ok = n->output()->type()->kind();
    if (ok != c10::TypeKind::IntType && ok != c10::TypeKind::FloatType && ok != c10::TypeKind::BoolType) {
      throw unsupported();
    }
    I.op = Op::kScalar;
    I.sub = kScalarOps.at(kind);
    I.int_result = ok == c10::TypeKind::IntType;
    inputs(ins.size());
    outputs();
    return I;
  }
  if (first_tensor && kUnaryOps.count(kind) && ins.size() == 1) {
    I.op = Op::kUnary, I.sub = kUnaryOps.at(kind);
    inputs(1), outputs();
    return I;
  }
  if (kBinaryOps.count(kind) && ins.size() >= 2 && (is_tensor(ins[0]) || is_tensor(ins[1]))) {
    if (overload.find("mode") != std::string::npos || overload == "out") throw unsupported();
    if (ins.size() > 3) throw unsupported();
    I.sub = kBinaryOps.at(kind);
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
  for (const Direct& e : kDirectOps) {
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

}  // namespace nmcmc
