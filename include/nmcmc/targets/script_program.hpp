#pragma once
/// nmcmc's own evaluator for TorchScript energies (Note [Native engine] in script_program.cpp).
///
/// The module's forward graph, frozen (its buffers become constants), compiled to a list of
/// instructions over float64 arrays and run with a reverse-mode tape: energy and gradient for a
/// batch of rows at the cost of the arithmetic, where a LibTorch call pays 100+ microseconds of
/// dispatch and autograd bookkeeping per call whatever the model's size. It covers what
/// posteriordb-style energies are made of (elementwise arithmetic and functions, sums and
/// logsumexp, select/slice/stack/cat, indexing by constant int tensors, views, matmul, loops and
/// ifs over ints); a graph with
/// anything else is not compiled and runs on LibTorch as before.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace torch::jit {
struct Module;
}

namespace nmcmc {

class ScriptProgram {
 public:
  /// Thrown by run() for a shape the evaluator does not cover that only shows at run time (a
  /// matmul of 3-d arrays): the caller runs the module on LibTorch instead.
  struct NotCovered : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  /// Compiles `module`'s forward (x [C, D] -> one value per row, [C]). The module must already be
  /// in float64 and eval mode; it is cloned and frozen, not changed. Returns nullptr, with the
  /// reason in `why_not`, when the graph uses an operation outside the evaluator.
  static std::unique_ptr<ScriptProgram> compile(const torch::jit::Module& module, std::string* why_not);
  ~ScriptProgram();

  /// forward's output for x [c, d] (row-major) into `out` [c], and, when `grad` is non-null, the
  /// gradient of its sum over rows with respect to x into `grad` [c, d]. Thread-safe (one run at a
  /// time). Throws std::runtime_error where the module would raise (its own raise, an index out of
  /// range, shapes that do not broadcast) and DataError when forward's output is not one value per row.
  void run(const double* x, int64_t c, int64_t d, double* out, double* grad) const;

  /// Instructions in the compiled program (loops' bodies counted once).
  int64_t size() const;

 private:
  struct Impl;
  explicit ScriptProgram(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nmcmc
