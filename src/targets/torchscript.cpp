#include "nmcmc/targets/torchscript.hpp"

#include "nmcmc/core/finite_hvp.hpp"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/script_program.hpp"

namespace nmcmc {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct ModuleTable {
  std::mutex mutex;
  std::map<std::string, std::string> bytes;  // "memory:N" -> what torch.jit.save wrote
  int64_t next = 1;
};
ModuleTable& module_table() {
  static ModuleTable t;
  return t;
}

/// The first line of a c10::Error without LibTorch's backtrace.
std::string brief(const c10::Error& e) { return e.what_without_backtrace(); }

torch::jit::Module load_module(const std::string& where) {
  try {
    if (where.rfind("memory:", 0) == 0) {
      std::string bytes;
      {
        ModuleTable& t = module_table();
        std::lock_guard<std::mutex> lock(t.mutex);
        auto it = t.bytes.find(where);
        if (it == t.bytes.end()) {
          throw UsageError("torchscript: no module '" + where +
                           "' in this process (in-memory modules exist only in the process that made them; save the "
                           "module with torch.jit.save and give its path)");
        }
        bytes = it->second;
      }
      std::istringstream in(bytes);
      return torch::jit::load(in, torch::kCPU);
    }
    if (!fs::exists(where)) throw UsageError("torchscript: module file '" + where + "' does not exist");
    if (fs::is_directory(where)) throw UsageError("torchscript: module '" + where + "' is a directory, not a file");
    return torch::jit::load(where, torch::kCPU);
  } catch (const c10::Error& e) {
    throw UsageError("torchscript: '" + where +
                     "' is not a TorchScript module (write one with torch.jit.save(torch.jit.script(module), path)): " +
                     brief(e));
  }
}

std::string where_label(const std::string& where) { return "torchscript module '" + where + "'"; }

/// The module's floating-point parameters and buffers to `dtype` on `device`; integer ones (a
/// hierarchical model's group of each observation) only to `device`. (jit::Module::to(dtype)
/// converts every tensor, so group indices became doubles and indexing failed.)
void module_to(torch::jit::Module& m, torch::Device device, torch::ScalarType dtype) {
  auto move = [&](torch::Tensor t) {
    torch::Tensor moved = t.is_floating_point() ? t.to(device, dtype) : t.to(device);
    t.set_data(moved);
  };
  for (const auto& p : m.named_parameters(/*recurse=*/true)) move(p.value);
  for (const auto& b : m.named_buffers(/*recurse=*/true)) move(b.value);
}

int64_t module_dim(const torch::jit::Module& m, const std::string& where) {
  if (!m.hasattr("dim")) return 0;
  torch::IValue v = m.attr("dim");
  if (!v.isInt() || v.toInt() < 1) {
    throw UsageError(where_label(where) + ": attribute 'dim' must be a positive int");
  }
  return v.toInt();
}

std::vector<std::string> module_names(const torch::jit::Module& m, const std::string& where, int64_t dim) {
  if (!m.hasattr("names")) return {};
  torch::IValue v = m.attr("names");
  const std::string bad = where_label(where) + ": attribute 'names' must be a List[str] of " + std::to_string(dim) +
                          " distinct names without commas, quotes or spaces";
  if (!v.isList()) throw UsageError(bad);
  if (v.toListRef().empty()) return {};  // an empty list: no names
  std::vector<std::string> names;
  for (const auto& e : v.toListRef()) {
    if (!e.isString()) throw UsageError(bad);
    std::string s = e.toStringRef();
    if (s.empty() || s.find_first_of(",\"' \t\r\n#") != std::string::npos) throw UsageError(bad + " (got '" + s + "')");
    if (std::find(names.begin(), names.end(), s) != names.end()) throw UsageError(bad + " ('" + s + "' twice)");
    names.push_back(s);
  }
  if (static_cast<int64_t>(names.size()) != dim) throw UsageError(bad + " (got " + std::to_string(names.size()) + ")");
  return names;
}

torch::Tensor vector_attr(const torch::jit::Module& m, const char* key, const std::string& where, int64_t dim) {
  torch::IValue v = m.attr(key);
  torch::Tensor t;
  if (v.isTensor()) {
    t = v.toTensor().detach().to(torch::kCPU, torch::kFloat64).flatten();
  } else if (v.isDoubleList()) {
    t = torch::tensor(v.toDoubleVector(), torch::kFloat64);
  } else {
    throw UsageError(where_label(where) + ": attribute '" + key + "' must be a Tensor or List[float] of length " +
                     std::to_string(dim));
  }
  if (t.numel() != dim || !torch::isfinite(t).all().item<bool>()) {
    throw UsageError(where_label(where) + ": attribute '" + key + "' must hold " + std::to_string(dim) +
                     " finite numbers");
  }
  return t;
}

std::optional<Moments> module_reference(const torch::jit::Module& m, const std::string& where, int64_t dim) {
  const bool has_mean = m.hasattr("ref_mean"), has_sd = m.hasattr("ref_sd");
  if (!has_mean && !has_sd) return std::nullopt;
  if (has_mean != has_sd) throw UsageError(where_label(where) + ": give both 'ref_mean' and 'ref_sd', or neither");
  Moments r{vector_attr(m, "ref_mean", where, dim), vector_attr(m, "ref_sd", where, dim)};
  if (!(r.sd > 0).all().item<bool>()) throw UsageError(where_label(where) + ": 'ref_sd' must be positive");
  return r;
}

/// Every sampler evaluates many chains as one batch [C, D] and takes row i's energy as U(x_i): a
/// module whose value for one row depends on the others (x.mean() over the batch, a batch norm,
/// x.shape[0]) would be sampled silently from something else. The probe batch's energies are
/// compared with each row's alone; they must agree to rounding (a batched matmul may sum in
/// another order).
void check_rows_apart(torch::jit::Module& m, const std::string& label, const torch::Tensor& batch,
                      const torch::Tensor& u_batch) {
  const bool single = batch.scalar_type() == torch::kFloat32 || batch.scalar_type() == torch::kFloat16 ||
                      batch.scalar_type() == torch::kBFloat16;
  const double tol = single ? 1e-3 : 1e-8;
  torch::NoGradGuard no_grad;
  // Every call on the module goes through the plain graph: once the graph executor has built its
  // optimised plan it keeps using it, and 1.13's derivative of softplus with beta != 1 is wrong
  // there (see choose_engine).
  torch::jit::GraphOptimizerEnabledGuard plain(false);
  for (int64_t i = 0; i < batch.size(0); ++i) {
    torch::IValue one;
    try {
      one = m.forward({batch.narrow(0, i, 1).detach()});
    } catch (const std::exception&) {
      continue;  // a row it cannot take alone is a matter for the density (Note [A density may fail])
    }
    if (!one.isTensor() || one.toTensor().numel() != 1) continue;
    const double alone = one.toTensor().to(torch::kFloat64).item<double>();
    const double in_batch = u_batch.detach()[i].to(torch::kFloat64).item<double>();
    if (!std::isfinite(alone) && !std::isfinite(in_batch)) continue;
    if (!(std::abs(alone - in_batch) <= tol * std::max({1.0, std::abs(alone), std::abs(in_batch)}))) {
      throw UsageError(label + ": the energy of a row depends on the other rows of the batch (row " + std::to_string(i) +
                       " of a [" + std::to_string(batch.size(0)) + ", " + std::to_string(batch.size(1)) +
                       "] batch: " + fmt::format("{:.9g}", in_batch) + " in the batch, " + fmt::format("{:.9g}", alone) +
                       " alone). Every sampler runs chains as rows of one batch: reduce over the features only "
                       "(.sum(-1), .mean(-1)), never over the batch (x.mean(), x.sum(), x.shape[0], batch norm)");
    }
  }
}

/// Runs the module on a small batch and turns every way it can be unusable into one message. A
/// density may raise on part of the space (Note [A density may fail]): when the batch raises, single
/// points (zero, then random ones in [-2, 2]^D) are tried, and only a module that raises at all of
/// them is refused.
void check_module(torch::jit::Module& m, const std::string& where, int64_t dim, torch::TensorOptions options) {
  at::Generator gen = make_generator(12345);
  const std::string label = where_label(where);
  const std::string dtype = std::string(c10::toString(options.dtype().toScalarType()));
  torch::Tensor x;
  torch::IValue out;
  std::string first_error;
  int attempt = 0;
  for (; attempt < 22; ++attempt) {
    torch::Tensor probe = attempt == 0   ? torch::rand({3, dim}, gen, torch::kFloat64) * 4.0 - 2.0
                          : attempt == 1 ? torch::zeros({1, dim}, torch::kFloat64)
                                         : torch::rand({1, dim}, gen, torch::kFloat64) * 4.0 - 2.0;
    x = probe.to(options).requires_grad_(true);
    try {
      torch::AutoGradMode grad(true);
      torch::jit::GraphOptimizerEnabledGuard plain(false);  // (see check_rows_apart)
      out = m.forward({x});
      break;
    } catch (const c10::Error& e) {
      if (first_error.empty()) first_error = brief(e);
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
    out = torch::IValue();
  }
  if (out.isNone()) {
    throw UsageError(label + ": forward failed on a [3, " + std::to_string(dim) + "] " + dtype +
                     " batch, at zero and at 20 random points in [-2, 2]^" + std::to_string(dim) + ": " + first_error);
  }
  const int64_t c = x.size(0);
  if (!out.isTensor()) {
    throw UsageError(label + ": forward must return a Tensor U(x) of shape [C]; it returned a " + out.tagKind());
  }
  torch::Tensor u = out.toTensor();
  if (u.dim() != 1 || u.size(0) != c) {
    std::ostringstream shape;
    shape << u.sizes();
    throw UsageError(label + ": forward must map x [C, D] to one value per row, shape [C]; on a [" + std::to_string(c) +
                     ", " + std::to_string(dim) + "] batch it returned shape " + shape.str() +
                     (u.dim() == 2 && u.size(0) == c && u.size(1) == 1 ? " (use .squeeze(-1))" : "") +
                     (u.dim() == 0 ? " (sum over the features only: .sum(-1), not .sum())" : ""));
  }
  if (u.scalar_type() != x.scalar_type()) {
    throw UsageError(label + ": forward returned " + std::string(c10::toString(u.scalar_type())) + " for a " + dtype +
                     " input; return x's dtype");
  }
  if (attempt == 0) check_rows_apart(m, label, x, u);
  torch::Tensor g;
  if (u.requires_grad()) {
    torch::AutoGradMode grad(true);
    g = torch::autograd::grad({u.sum()}, {x}, {}, false, false, /*allow_unused=*/true)[0];
  }
  if (!g.defined()) {
    throw UsageError(label +
                     ": its output does not depend on x differentiably (no gradient reaches x: .detach(), .item(), "
                     "numpy or torch.no_grad() inside forward?); every sampler but rwm needs dU/dx");
  }
}

}  // namespace

std::string register_torchscript_module(const std::string& bytes) {
  ModuleTable& t = module_table();
  std::string key;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    key = "memory:" + std::to_string(t.next++);
    t.bytes[key] = bytes;
  }
  load_module(key);  // UsageError now rather than at first use
  return key;
}

void release_torchscript_module(const std::string& key) {
  ModuleTable& t = module_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.bytes.erase(key);
}

int64_t registered_torchscript_modules() {
  ModuleTable& t = module_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return static_cast<int64_t>(t.bytes.size());
}

TorchScriptTarget::TorchScriptTarget(std::shared_ptr<torch::jit::Module> module, json spec, int64_t dim, bool log_prob,
                                     std::vector<std::string> names, std::optional<Moments> reference,
                                     torch::TensorOptions options, const std::string& engine)
    : Target(options),
      module_(std::move(module)),
      spec_(std::move(spec)),
      dim_(dim),
      log_prob_(log_prob),
      names_(std::move(names)),
      reference_(std::move(reference)) {
  if (engine != "auto" && engine != "native" && engine != "libtorch") {
    throw UsageError("torchscript: 'engine' must be \"auto\", \"native\" or \"libtorch\"");
  }
  module_->eval();
  // compiled before the module is moved to the run's dtype: from its own buffers, in float64
  engine_note_ = choose_engine(engine);
  module_to(*module_, options.device(), options.dtype().toScalarType());
  module_->eval();
}

namespace {
/// |a - b| small against the size of b (both non-finite counts as agreeing: the density's NaN).
bool agrees(const torch::Tensor& a, const torch::Tensor& b, double tol) {
  const torch::Tensor fa = torch::isfinite(a), fb = torch::isfinite(b);
  if (!torch::equal(fa, fb)) return false;
  const torch::Tensor scale = 1.0 + b.abs().where(fb, torch::zeros_like(b)).amax(-1, true);
  return ((a - b).abs().where(fb, torch::zeros_like(b)) <= tol * scale).all().item<bool>();
}
}  // namespace

std::string TorchScriptTarget::choose_engine(const std::string& engine) {
  if (engine == "libtorch") return "asked for (engine libtorch)";
  if (!options().device().is_cpu()) return "the run is not on the CPU";
  torch::jit::Module m64 = module_->clone();
  module_to(m64, torch::kCPU, torch::kFloat64);
  m64.eval();
  std::string why;
  std::shared_ptr<ScriptProgram> program = ScriptProgram::compile(m64, &why);
  if (!program) return why;
  // Its results against LibTorch's autograd on the module in float64, at probe points like
  // check_module's (rows where the module raises are left out).
  at::Generator gen = make_generator(271828);
  int agreed = 0;
  for (int probe = 0; probe < 4; ++probe) {
    const int64_t c = probe == 1 ? 1 : 3 + probe;
    const torch::Tensor x = probe == 1 ? torch::zeros({1, dim_}, torch::kFloat64)
                                       : torch::rand({c, dim_}, gen, torch::kFloat64) * (probe == 3 ? 6.0 : 4.0) - (probe == 3 ? 3.0 : 2.0);
    EnergyGrad want;
    try {
      // Eager autograd through the plain graph: the graph executor's optimised plan differentiates
      // with TorchScript's own derivative formulas, and 1.13's is wrong for softplus with beta != 1
      // (NativeEngine.LibTorchEngineDifferentiatesSoftplusRight). Thread-local switch.
      torch::jit::GraphOptimizerEnabledGuard plain(false);
      want = autograd_energy_and_grad(
          [&](const torch::Tensor& y) {
            torch::IValue out = m64.forward({y});
            if (!out.isTensor()) throw std::runtime_error("no tensor");
            return out.toTensor();
          },
          x, false);
      if (want.energy.dim() != 1 || want.energy.size(0) != c || !want.grad.defined()) continue;
    } catch (const std::exception&) {
      continue;
    }
    torch::Tensor u = torch::empty({c}, torch::kFloat64), g = torch::empty({c, dim_}, torch::kFloat64);
    try {
      program->run(x.data_ptr<double>(), c, dim_, u.data_ptr<double>(), g.data_ptr<double>());
    } catch (const std::exception& e) {
      return std::string("its evaluation differs from LibTorch's (it raised: ") + e.what() + ")";
    }
    if (!agrees(u.unsqueeze(1), want.energy.unsqueeze(1), 1e-8) || !agrees(g, want.grad, 1e-8)) {
      return "its results differ from LibTorch's autograd (max energy difference " +
             std::to_string((u - want.energy).abs().nan_to_num(0).max().item<double>()) + ", gradient " +
             std::to_string((g - want.grad).abs().nan_to_num(0).max().item<double>()) + "): please report it";
    }
    ++agreed;
  }
  if (agreed == 0) return "the module raised at every probe point, so its evaluation could not be checked";
  native_ = std::move(program);
  return "";
}

std::string TorchScriptTarget::engine() const { return native_ && !native_off_ ? "native" : "libtorch"; }

bool TorchScriptTarget::use_native(const torch::Tensor& x) const {
  return native_ && !native_off_ && x.device().is_cpu() && x.dim() == 2 && x.size(1) == dim_;
}

EnergyGrad TorchScriptTarget::native_energy(const torch::Tensor& x, bool with_grad) const {
  const torch::Tensor xd = x.detach().to(torch::kFloat64).contiguous();
  const int64_t c = xd.size(0);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor u = torch::empty({c}, f64), g;
  if (with_grad) g = torch::empty({c, dim_}, f64);
  try {
    native_->run(xd.data_ptr<double>(), c, dim_, u.data_ptr<double>(), with_grad ? g.data_ptr<double>() : nullptr);
  } catch (const ScriptProgram::NotCovered&) {
    throw;
  } catch (const DataError& e) {
    throw DataError(where_label(spec_.at("module").get<std::string>()) + ": " + e.what());
  } catch (const std::runtime_error& e) {
    // the density's own failure at these points (Note [A density may fail]): those rows are rejected
    throw std::runtime_error(where_label(spec_.at("module").get<std::string>()) + ": forward raised: " + e.what());
  }
  if (log_prob_) {
    u.neg_();
    if (with_grad) g.neg_();
  }
  if (x.scalar_type() != torch::kFloat64) {
    u = u.to(x.scalar_type());
    if (with_grad) g = g.to(x.scalar_type());
  }
  return {u, g};
}

// U and dU as one autograd node whose backward takes H v by central differences of native
// gradients (Note [Native second derivatives], core/finite_hvp.hpp); where dU(x) is finite but a
// side's energy or the difference is not (a step left the support: log's gradient is finite on the
// wrong side of zero, its energy is not) the batch is done exactly by LibTorch's double backward.
struct NativeEnergyNode : torch::autograd::Function<NativeEnergyNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                int64_t self) {
    const auto* t = reinterpret_cast<const TorchScriptTarget*>(self);
    EnergyGrad eg = t->native_energy(x, true);
    ctx->save_for_backward({x, eg.grad});
    ctx->saved_data["target"] = self;
    return {eg.energy, eg.grad};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list upstream) {
    const auto* t = reinterpret_cast<const TorchScriptTarget*>(ctx->saved_data["target"].toInt());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach(), g = saved[1].detach();
    torch::Tensor x_bar = torch::zeros(x.sizes(), x.options().dtype(torch::kFloat64));
    if (upstream[0].defined()) x_bar += upstream[0].to(torch::kFloat64).unsqueeze(1) * g.to(torch::kFloat64);
    if (upstream[1].defined()) {
      const torch::Tensor v = upstream[1].to(torch::kFloat64);
      const torch::Tensor x64 = x.to(torch::kFloat64);
      torch::Tensor hv, finite;
      bool exact = false;
      try {
        const auto energy_grad = [t](const torch::Tensor& points) {
          const EnergyGrad both = t->native_energy(points, true);
          return std::make_pair(both.energy, both.grad);
        };
        hv = central_difference_hvp(energy_grad, x64, v, &finite);
        exact = (~finite & torch::isfinite(g).all(1)).any().item<bool>();
      } catch (const std::exception&) {
        exact = true;  // a point beside x raised: LibTorch's double backward instead
      }
      if (exact) hv = t->exact_hvp(x64, v);
      x_bar += hv;
    }
    return {x_bar.to(x.scalar_type()), torch::Tensor()};
  }
};

torch::Tensor TorchScriptTarget::exact_hvp(const torch::Tensor& x64, const torch::Tensor& v) const {
  torch::AutoGradMode enable(true);
  torch::Tensor xr = x64.to(options().dtype()).detach().requires_grad_(true);
  EnergyGrad eg = autograd_energy_and_grad([this](const torch::Tensor& y) { return libtorch_energy(y); }, xr, true);
  torch::Tensor hv = torch::autograd::grad({(eg.grad * v.to(eg.grad.scalar_type())).sum()}, {xr}, {}, false, false, true)[0];
  return hv.defined() ? hv.to(torch::kFloat64).detach() : torch::zeros_like(x64);
}

EnergyGrad TorchScriptTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  if (use_native(x)) {
    try {
      // without a graph to extend (no create_graph, or x is no function of anything) plain values do
      if (!create_graph || !x.requires_grad() || !torch::GradMode::is_enabled()) return native_energy(x, true);
      auto out = NativeEnergyNode::apply(x, reinterpret_cast<int64_t>(this));
      return {out[0], out[1]};
    } catch (const ScriptProgram::NotCovered& e) {
      native_off_ = true;
      engine_note_ = std::string("met ") + e.what() + " at run time";
    }
  }
  return Target::compute_energy_and_grad(x, create_graph);
}

torch::Tensor TorchScriptTarget::compute_energy(const torch::Tensor& x) const {
  if (use_native(x)) {
    try {
      if (!(x.requires_grad() && torch::GradMode::is_enabled())) return native_energy(x, false).energy;
      return NativeEnergyNode::apply(x, reinterpret_cast<int64_t>(this))[0];  // differentiable (training)
    } catch (const ScriptProgram::NotCovered& e) {
      native_off_ = true;
      engine_note_ = std::string("met ") + e.what() + " at run time";
    }
  }
  return libtorch_energy(x);
}

torch::Tensor TorchScriptTarget::libtorch_energy(const torch::Tensor& x) const {
  torch::IValue out;
  try {
    // The plain graph, differentiated by eager autograd: see choose_engine (a wrong softplus derivative)
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    out = module_->forward({x});
  } catch (const c10::Error& e) {
    // the density's own failure at these points (Note [A density may fail]): those rows are rejected
    throw std::runtime_error(where_label(spec_.at("module").get<std::string>()) + ": forward raised: " + brief(e));
  }
  if (!out.isTensor()) throw DataError(where_label(spec_.at("module").get<std::string>()) + ": forward returned no Tensor");
  torch::Tensor u = out.toTensor();
  if (u.dim() != 1 || u.size(0) != x.size(0) || u.scalar_type() != x.scalar_type()) {
    throw DataError(where_label(spec_.at("module").get<std::string>()) +
                    ": forward returned a wrong shape or dtype for a batch of " + std::to_string(x.size(0)));
  }
  return log_prob_ ? -u : u;
}

std::unique_ptr<Target> make_torchscript_target(const json& spec, torch::TensorOptions options) {
  if (!spec.contains("module") || !spec["module"].is_string() || spec["module"].get<std::string>().empty()) {
    throw UsageError("torchscript: give the module file (--module energy.pt, or \"module\" in the target spec)");
  }
  std::string where = spec["module"].get<std::string>();
  if (where.rfind("memory:", 0) != 0) {
    std::error_code ec;
    fs::path abs = fs::absolute(where, ec);
    if (!ec) where = abs.lexically_normal().string();
  }
  bool log_prob = false;
  if (spec.contains("output")) {
    if (!spec["output"].is_string() ||
        (spec["output"].get<std::string>() != "energy" && spec["output"].get<std::string>() != "log_prob")) {
      throw UsageError("torchscript: 'output' must be \"energy\" (forward returns U(x)) or \"log_prob\" (log p(x))");
    }
    log_prob = spec["output"].get<std::string>() == "log_prob";
  }
  auto module = std::make_shared<torch::jit::Module>(load_module(where));
  int64_t dim = module_dim(*module, where);
  if (spec.contains("dim")) {
    const json& v = spec["dim"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) throw UsageError("torchscript: 'dim' must be a positive integer");
    if (dim > 0 && v.get<int64_t>() != dim) {
      throw UsageError(where_label(where) + " has dim " + std::to_string(dim) + " but the spec says " + v.dump());
    }
    dim = v.get<int64_t>();
  }
  if (dim == 0) {
    throw UsageError(where_label(where) + " has no 'dim' attribute: give the dimension (--dim D, or \"dim\" in the spec)");
  }
  auto names = module_names(*module, where, dim);
  auto reference = module_reference(*module, where, dim);
  json full = {{"name", "torchscript"}, {"module", where}, {"dim", dim}, {"output", log_prob ? "log_prob" : "energy"}};
  std::string engine = "auto";
  if (spec.contains("engine")) {
    if (!spec["engine"].is_string()) throw UsageError("torchscript: 'engine' must be \"auto\", \"native\" or \"libtorch\"");
    engine = spec["engine"].get<std::string>();
    full["engine"] = engine;
  }
  auto target = std::make_unique<TorchScriptTarget>(module, full, dim, log_prob, names, reference, options, engine);
  check_module(*module, where, dim, options);
  if (engine == "native" && target->engine() != "native") {
    throw UsageError(where_label(where) + " cannot run on nmcmc's evaluator (engine native): " + target->engine_note());
  }
  return target;
}

}  // namespace nmcmc
