#pragma once
/// The Target interface: an unnormalised density p(x) = exp(-U(x)) / Z over a batch of chains.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nmcmc {

/// Reference moments of a target, used by ESS computations. Both [D], float64, CPU.
struct Moments {
  torch::Tensor mean;
  torch::Tensor sd;
};

/// Energy and gradient of a batch: energy [C], grad [C, D], in the target's dtype.
struct EnergyGrad {
  torch::Tensor energy;
  torch::Tensor grad;
};

/// A target density, batched over chains (x is [C, D]).
///
/// Note [A density may fail]
/// A user's density may raise on part of the space (a Cholesky factorisation of a kernel matrix
/// that is not numerically positive definite, a solver that does not converge), as Stan models
/// routinely do. energy() and energy_and_grad() then evaluate the batch row by row, and each row
/// that raises gets a NaN energy and gradient: the kernels reject it as they reject any
/// non-finite proposal (counted as a divergence), starting points that fail are drawn again,
/// and training leaves such rows out (Note [Non-finite rows in training]). nmcmc's own usage,
/// data and I/O errors and running out of memory still end the run. density_failures() counts
/// the rows that raised and first_density_failure() keeps the first message, for the summary.
///
/// Subclasses implement compute_energy (and may override compute_energy_and_grad with an
/// analytic gradient). Every public evaluation is counted: energy_evals() and grad_evals()
/// count evaluations per chain, so a call on a [C, D] batch counts once. That makes ESS per
/// gradient exact: a kernel reports the difference of the counters over a step.
class Target {
 public:
  explicit Target(torch::TensorOptions options) : options_(options) {}
  virtual ~Target() = default;
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  /// Short name, e.g. "funnel".
  virtual std::string name() const = 0;
  /// Dimension D.
  virtual int64_t dim() const = 0;
  /// The specification that recreates this target through make_target().
  virtual nlohmann::json spec() const = 0;

  /// U(x) for x [C, D] -> [C]. Counts one energy evaluation.
  torch::Tensor energy(const torch::Tensor& x);
  /// U(x) and dU/dx. With create_graph the result stays differentiable (double backward).
  /// Counts one energy and one gradient evaluation.
  EnergyGrad energy_and_grad(const torch::Tensor& x, bool create_graph = false);

  /// Whether sample() draws exact independent samples.
  virtual bool has_sampler() const { return false; }
  /// n exact draws [n, D] in the target's dtype and device. Throws if has_sampler() is false.
  virtual torch::Tensor sample(int64_t n, at::Generator& gen) const;
  /// True or reference mean and standard deviation, if known.
  virtual std::optional<Moments> reference_moments() const { return std::nullopt; }
  /// Names of the D parameters, if the target has them (empty: outputs say x.1 ... x.D).
  virtual std::vector<std::string> parameter_names() const { return {}; }

  const torch::TensorOptions& options() const { return options_; }
  int64_t energy_evals() const { return n_energy_; }
  int64_t grad_evals() const { return n_grad_; }
  void reset_counters() { n_energy_ = 0; n_grad_ = 0; }
  /// Rows at which the density raised so far (Note [A density may fail]), and the first message.
  int64_t density_failures() const { return n_failed_; }
  const std::string& first_density_failure() const { return first_failure_; }

 protected:
  /// U(x) for x [C, D] -> [C]; must be differentiable in x with torch ops.
  virtual torch::Tensor compute_energy(const torch::Tensor& x) const = 0;
  /// Default: autograd through compute_energy. Analytic overrides must stay differentiable
  /// when create_graph is true (write them with torch ops on x).
  virtual EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const;

  torch::TensorOptions options_;

 private:
  void note_failure(const std::string& message);
  int64_t n_energy_ = 0;
  int64_t n_grad_ = 0;
  int64_t n_failed_ = 0;
  std::string first_failure_;
};

/// The D labels of a target's parameters in outputs: its parameter_names(), else x.1 ... x.D.
std::vector<std::string> parameter_labels(const Target& target);

/// Autograd gradient of an energy function, shared by Target's default and tests.
EnergyGrad autograd_energy_and_grad(const std::function<torch::Tensor(const torch::Tensor&)>& energy,
                                    const torch::Tensor& x, bool create_graph);

}  // namespace nmcmc
