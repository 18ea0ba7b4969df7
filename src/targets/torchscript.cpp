#include "nmcmc/targets/torchscript.hpp"

#include <torch/script.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"

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
  for (int attempt = 0; attempt < 22; ++attempt) {
    torch::Tensor probe = attempt == 0   ? torch::rand({3, dim}, gen, torch::kFloat64) * 4.0 - 2.0
                          : attempt == 1 ? torch::zeros({1, dim}, torch::kFloat64)
                                         : torch::rand({1, dim}, gen, torch::kFloat64) * 4.0 - 2.0;
    x = probe.to(options).requires_grad_(true);
    try {
      torch::AutoGradMode grad(true);
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

TorchScriptTarget::TorchScriptTarget(std::shared_ptr<torch::jit::Module> module, json spec, int64_t dim, bool log_prob,
                                     std::vector<std::string> names, std::optional<Moments> reference,
                                     torch::TensorOptions options)
    : Target(options),
      module_(std::move(module)),
      spec_(std::move(spec)),
      dim_(dim),
      log_prob_(log_prob),
      names_(std::move(names)),
      reference_(std::move(reference)) {
  module_->to(options.device(), options.dtype().toScalarType());
  module_->eval();
}

torch::Tensor TorchScriptTarget::compute_energy(const torch::Tensor& x) const {
  torch::IValue out;
  try {
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
  auto target = std::make_unique<TorchScriptTarget>(module, full, dim, log_prob, names, reference, options);
  check_module(*module, where, dim, options);
  return target;
}

}  // namespace nmcmc
