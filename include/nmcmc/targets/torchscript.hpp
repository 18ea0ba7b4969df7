#pragma once
/// A density written by the user in PyTorch: a TorchScript module whose forward maps x [C, D]
/// to the energy U(x) [C] (or, with output "log_prob", to log p(x) [C]).
///
/// Spec: {"name": "torchscript", "module": "energy.pt", "dim": D?, "output": "energy"|"log_prob",
///        "engine": "auto"|"native"|"libtorch"}.
/// The module may carry, as attributes:
///   dim: int                 the dimension (else "dim" is required in the spec)
///   names: List[str]         parameter names for the outputs (else x.1 ... x.D)
///   ref_mean, ref_sd: Tensor [D] (or List[float]): reference moments (then the paper's ESS is reported)
/// Before anything runs the module is checked on a small batch (make_torchscript_target): an
/// exception inside it, a wrong output shape or dtype, or an output that does not depend on x
/// differentiably is a UsageError naming the module. NaN or infinite energies elsewhere are not
/// errors: the kernels reject such proposals and count them as divergences.
///
/// Engine (Note [Native engine], targets/script_program.cpp): with "auto" (the default) energies
/// and gradients that need no graph (sampling, warm-up) run on nmcmc's own evaluator when the
/// module's graph is within it and its results agree with LibTorch's autograd on probe points,
/// in float64 whatever the run's dtype (results rounded to it). Training's differentiable
/// gradients run on it too, as one autograd node whose backward takes Hessian-vector products by
/// central differences of its gradients (Note [Native second derivatives]). "native" makes a module outside the evaluator a UsageError
/// (with the reason); "libtorch" never uses it.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nmcmc/core/target.hpp"

namespace torch::jit {
struct Module;
}

namespace nmcmc {

class ScriptProgram;

class TorchScriptTarget : public Target {
 public:
  /// `module` is moved to `options`' device and dtype. `spec` is the complete spec.
  TorchScriptTarget(std::shared_ptr<torch::jit::Module> module, nlohmann::json spec, int64_t dim, bool log_prob,
                    std::vector<std::string> names, std::optional<Moments> reference, torch::TensorOptions options,
                    const std::string& engine = "auto");
  std::string name() const override { return "torchscript"; }
  int64_t dim() const override { return dim_; }
  nlohmann::json spec() const override { return spec_; }
  std::optional<Moments> reference_moments() const override { return reference_; }
  std::vector<std::string> parameter_names() const override { return names_; }
  /// "native" (nmcmc's evaluator) or "libtorch"; engine_note() says why when it is not native.
  std::string engine() const;
  const std::string& engine_note() const { return engine_note_; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override;

 private:
  std::shared_ptr<torch::jit::Module> module_;
  nlohmann::json spec_;
  int64_t dim_;
  bool log_prob_;
  std::vector<std::string> names_;
  std::optional<Moments> reference_;
  std::shared_ptr<ScriptProgram> native_;
  mutable bool native_off_ = false;  // set when a run meets a shape the evaluator does not cover
  mutable std::string engine_note_;
  friend struct NativeEnergyNode;
  bool use_native(const torch::Tensor& x) const;
  EnergyGrad native_energy(const torch::Tensor& x, bool with_grad) const;
  torch::Tensor libtorch_energy(const torch::Tensor& x) const;
  /// H(x) v by LibTorch's double backward (float64 in and out).
  torch::Tensor exact_hvp(const torch::Tensor& x64, const torch::Tensor& v) const;
  std::string choose_engine(const std::string& engine);
};

/// The registry's factory for "torchscript" (validates the spec, loads and checks the module).
std::unique_ptr<Target> make_torchscript_target(const nlohmann::json& spec, torch::TensorOptions options);

/// Keeps a module loaded from bytes (a module scripted in this process, e.g. by the Python
/// package) and returns the key that a spec's "module" may name instead of a path: "memory:N".
/// The bytes are what torch.jit.save writes. UsageError if they are not a TorchScript module.
std::string register_torchscript_module(const std::string& bytes);
/// Drops a registered module's bytes (targets already made from it keep their own copy; a spec
/// naming the key no longer makes one). The Python package calls it when no object made from the
/// module is left. Unknown keys are ignored.
void release_torchscript_module(const std::string& key);
/// How many modules the table holds (for the tests).
int64_t registered_torchscript_modules();

}  // namespace nmcmc
