#pragma once
/// A Stan program as a target: `--stan model.stan --data data.json`.
///
/// Note [Stan programs]
/// A Stan program is translated by Stan's own compiler and built, with stan/shim.cpp, against
/// Stan's math library into a shared library behind nmcmc's small C interface
/// (targets/stan_abi.h); this target loads that library and evaluates the log density and its
/// gradient through Stan's reverse-mode autodiff, one row of the batch at a time (split over the
/// cores when the batch costs enough: Note [Stan rows in threads]). The energy is U(x) = -log p(x) on Stan's
/// unconstrained scale, Jacobian included and constants dropped, so x is what Stan's own samplers
/// move and U is -lp__ as Stan defines it. A domain error that Stan raises (a scale that is not
/// positive, a Cholesky factor that fails) is a rejection (Note [A density may fail]), never an
/// error of the run. Training's second derivatives (Hessian-vector products) are central
/// differences of Stan's gradients, as the native engine's are (Note [Native second derivatives]).
///
/// Building the library is a process concern: the program registers a builder with
/// set_stan_builder (the nmcmc command, the Python package and the tests do:
/// apps/process/stan_build.hpp), which compiles on first use and caches by the program's hash.
/// Without a builder a spec must name the built "library".
///
/// Spec: {"name": "stan", "program": "model.stan", "data": "data.json"?, "library": "model.so"?,
///        "seed": 0?, "threads": 0?}  (seed: the transformed data block's random numbers; threads:
///        how many threads a batch's rows may use, 0 = one per core: Note [Stan rows in threads]).
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nmcmc/core/target.hpp"

namespace nmcmc {

class StanLibrary;

/// Builds a Stan program into the shared library that StanTarget loads; returns its path.
/// Errors: DataError for a program that does not compile (the compiler's message, with its line).
using StanBuilder = std::function<std::string(const std::string& program)>;
/// Registers the builder that make_target uses for specs naming a "program" (one per process).
void set_stan_builder(StanBuilder builder);
bool have_stan_builder();

class StanTarget : public Target {
 public:
  /// Loads `library` and reads `data_json` (the JSON text; empty for no data).
  StanTarget(const std::string& library, const std::string& data_json, unsigned seed, nlohmann::json spec,
             torch::TensorOptions options);
  ~StanTarget() override;
  std::string name() const override { return "stan"; }
  int64_t dim() const override { return dim_; }
  nlohmann::json spec() const override { return spec_; }
  /// Stan's unconstrained names (theta.1, tau): what x holds.
  std::vector<std::string> parameter_names() const override { return unconstrained_names_; }

  /// The model's name (the program's file stem).
  std::string model_name() const;
  /// Stan's names of the constrained outputs: parameters, then transformed parameters and
  /// generated quantities as asked ("theta.1", "tau", ...).
  std::vector<std::string> constrained_names(bool transformed, bool generated) const;
  /// The constrained values of x [N, D] as Stan writes them: [N, K] float64, K as the names.
  /// Row i's generated quantities draw from a generator seeded by (seed, first_row + i). A row
  /// whose transformed parameters or generated quantities raise is NaN, and counted in failures.
  torch::Tensor constrain(const torch::Tensor& x, bool transformed, bool generated, uint64_t seed, int64_t first_row = 0,
                          int64_t* failures = nullptr, std::string* first_failure = nullptr) const;
  /// Note [Draws in the model's own parameters]: maps a run's draws [n, C, D], the first of them
  /// draw `first_draw`, to [n, C, K] as constrain() does (all outputs), the generated quantities of
  /// draw i, chain c seeded by the row's index i C + c; failures counted in `failures` (how many,
  /// the first message).
  std::function<torch::Tensor(const torch::Tensor&, int64_t)> draw_mapper(
      uint64_t seed, std::shared_ptr<std::pair<int64_t, std::string>> failures) const;
  /// The unconstrained points [N, D] of constrained parameter values [N, P] (P = the names without
  /// transformed parameters and generated quantities). DataError for values outside the support.
  torch::Tensor unconstrain(const torch::Tensor& constrained) const;
  /// log p at x [N, D] with or without the Jacobian, constants kept or dropped (float64, [N]);
  /// what the ports are checked against.
  torch::Tensor log_density(const torch::Tensor& x, bool jacobian, bool propto) const;

  /// How many evaluations split their rows over threads (Note [Stan rows in threads]).
  int64_t split_calls() const { return split_calls_.load(); }

  /// Rows [N] of log density and gradient [N, D] (float64) at x (any dtype): what the energies use.
  /// A row that raises is NaN; its message goes to *first_failure if that is empty.
  void evaluate(const torch::Tensor& x, torch::Tensor* lp, torch::Tensor* grad, bool jacobian, bool propto,
                std::string* first_failure) const;

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override;

 private:
  std::shared_ptr<StanLibrary> lib_;
  void* model_ = nullptr;
  nlohmann::json spec_;
  int64_t dim_ = 0;
  std::vector<std::string> unconstrained_names_;
  int64_t threads_ = 1;                                // Note [Stan rows in threads]
  mutable std::atomic<double> row_seconds_{0.0};       // a row's cost in one thread (moving average)
  mutable std::atomic<double> split_seconds_{50e-6};   // what a split adds to a call (moving average)
  mutable std::atomic<int64_t> calls_{0};
  mutable std::atomic<int64_t> split_calls_{0};
  friend struct StanEnergyNode;
  EnergyGrad plain_energy_and_grad(const torch::Tensor& x) const;
};

/// The registry's factory for "stan" (builds or loads the library, reads the data).
std::unique_ptr<Target> make_stan_target(const nlohmann::json& spec, torch::TensorOptions options);

}  // namespace nmcmc
