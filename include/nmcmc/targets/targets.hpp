#pragma once
/// The built-in targets: the paper's Gaussians, funnels, the 2-d "moon" illustration and
/// Bayesian logistic regression, plus a registry that builds any of them from a JSON spec.
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nmcmc/core/engine.hpp"
#include "nmcmc/core/target.hpp"

namespace nmcmc {

/// Gaussian N(mean, Sigma) given by a covariance's eigen-decomposition Sigma = Q diag(var) Q^T.
/// Q undefined means axis-aligned. Analytic energy and gradient; exact sampler; true moments.
class GaussianTarget : public Target {
 public:
  /// variances [D] (float64), rotation [D, D] orthogonal or undefined, mean [D] or undefined.
  GaussianTarget(std::string name, nlohmann::json spec, torch::Tensor variances, torch::Tensor rotation,
                 torch::Tensor mean, torch::TensorOptions options);
  std::string name() const override { return name_; }
  int64_t dim() const override { return dim_; }
  nlohmann::json spec() const override { return spec_; }
  bool has_sampler() const override { return true; }
  torch::Tensor sample(int64_t n, at::Generator& gen) const override;
  std::optional<Moments> reference_moments() const override;
  /// Covariance [D, D] float64 (for tests).
  torch::Tensor covariance() const;

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override;

 private:
  torch::Tensor whiten(const torch::Tensor& x) const;  // (x - mean) Q / sd

  std::string name_;
  nlohmann::json spec_;
  int64_t dim_;
  torch::Tensor var64_, rot64_, mean64_;     // float64 CPU copies
  torch::Tensor inv_sd_, rot_, rot_t_, mean_, sd_;  // in the target's options
};

/// Neal's funnel: x0 ~ N(0, sigma^2), x_i | x0 ~ N(0, exp(-x0)), i = 1..d-1.
/// U(x) = x0^2 / (2 sigma^2) + exp(x0) sum_i x_i^2 / 2 - (d - 1) x0 / 2.
class FunnelTarget : public Target {
 public:
  FunnelTarget(int64_t dim, double sigma, torch::TensorOptions options);
  std::string name() const override { return "funnel"; }
  int64_t dim() const override { return dim_; }
  nlohmann::json spec() const override;
  bool has_sampler() const override { return true; }
  torch::Tensor sample(int64_t n, at::Generator& gen) const override;
  /// Analytic: x0 has sd sigma; x_i has mean 0 and sd exp(sigma^2 / 4).
  std::optional<Moments> reference_moments() const override;
  /// exp(x0) is evaluated at min(x0, kExpCap): beyond it the density is ~0 for any sigma <= 10.
  static constexpr double kExpCap = 80.0;

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override;

 private:
  int64_t dim_;
  double sigma_;
};

/// The paper's 2-d illustration: U(x) = x0^2 / 2 + (x1 - x0^2 + 4)^2 / 2.
class MoonTarget : public Target {
 public:
  explicit MoonTarget(torch::TensorOptions options) : Target(options) {}
  std::string name() const override { return "moon"; }
  int64_t dim() const override { return 2; }
  nlohmann::json spec() const override { return {{"name", "moon"}}; }
  bool has_sampler() const override { return true; }
  torch::Tensor sample(int64_t n, at::Generator& gen) const override;
  std::optional<Moments> reference_moments() const override;

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
};

/// A binary classification data set: features [N, F] float64 and labels in {-1, +1} [N].
struct LabelledData {
  torch::Tensor features;
  torch::Tensor labels;
  std::string source;
};

/// Reads a whitespace- or comma-separated numeric table; `label_column` (negative counts from
/// the end) holds exactly two distinct values, mapped smaller -> -1, larger -> +1.
/// Throws DataError with the file, line and column of the first problem.
LabelledData load_labelled_table(const std::string& path, int label_column = -1);

/// Bayesian logistic regression with an N(0, prior_sd^2) prior on an intercept and one weight
/// per standardised feature: U(b) = |b|^2 / (2 prior_sd^2) - sum_n log sigmoid(y_n (b0 + x_n . b)).
/// log sigmoid is computed stably as -softplus(-t).
class LogisticTarget : public Target {
 public:
  LogisticTarget(const LabelledData& data, nlohmann::json spec, double prior_sd,
                 std::optional<Moments> reference, torch::TensorOptions options);
  std::string name() const override { return "logistic"; }
  int64_t dim() const override { return dim_; }
  nlohmann::json spec() const override { return spec_; }
  std::optional<Moments> reference_moments() const override { return reference_; }
  int64_t num_observations() const { return neg_design_.size(0); }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;
  EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const override;

 private:
  nlohmann::json spec_;
  int64_t dim_;
  double prior_var_;
  torch::Tensor neg_design_;  // [N, D]: minus (a ones column then standardised features) times y_n
  std::optional<Moments> reference_;
};

/// Describes a target and its options, for `nmcmc targets`.
struct TargetInfo {
  std::string name;
  std::string description;
  std::vector<std::pair<std::string, std::string>> options;  // option, meaning/default
  /// Options that name a file: in a config file, a relative one is relative to the config's
  /// directory (resolve_target_paths).
  std::vector<std::string> path_options;
};

/// Builds a target from its spec. The spec's keys have been checked against the TargetInfo's
/// options (and "name"); the factory validates their values (UsageError) and fills in defaults,
/// so that the target's spec() is complete and recreates it.
using TargetFactory = std::function<std::unique_ptr<Target>(const nlohmann::json& spec, torch::TensorOptions options)>;

/// Adds a target to the registry under info.name, so that make_target, the training service,
/// `reproduce`-style configs and everything else that takes a spec can build it by name.
/// Throws UsageError if the name is taken or empty. Thread-safe.
void register_target(TargetInfo info, TargetFactory factory);

/// Every registered target (the built-ins first, then the user's in registration order).
std::vector<TargetInfo> target_catalogue();

/// Makes the relative file names of a target spec (its TargetInfo's path_options, e.g. a
/// TorchScript module) relative to `base_dir`, the directory of the config that holds the spec.
/// Unknown names and non-string values are left for make_target to report.
void resolve_target_paths(nlohmann::json& spec, const std::string& base_dir);

/// The parts of a complete spec that define the density: what a checkpoint's target is compared
/// on (sampling with a model, resuming its training). Left out: a TorchScript module's location
/// (its content is the density) and a Stan program's built library and threads (the library is
/// one build of the program: other compiler flags, another cache or Stan version build another;
/// the threads change no bit). A spec naming only a Stan library keeps it.
nlohmann::json density_of(nlohmann::json spec);

/// Builds a target from a spec such as {"name": "funnel", "dim": 20, "sigma": 3}.
/// Missing options take their defaults; the returned target's spec() is complete.
/// Throws UsageError for unknown names or bad option values, DataError for bad data files.
std::unique_ptr<Target> make_target(const nlohmann::json& spec, torch::TensorOptions options);

/// Note [Native copies]: a TorchScript target's spec told to run on `engine` ("engine": its name);
/// other targets' specs unchanged. UsageError where the spec names another engine, unless
/// `replace` (a spec from a checkpoint, which the run's engine overrides).
void set_target_engine(nlohmann::json& spec, Engine engine, bool replace = false);

/// Where shipped data live: the directory given to set_data_directory, else the source tree's
/// data/, else the installed share/nmcmc/data.
std::string data_directory();
/// Sets the directory data_directory() returns (empty: its own search, as above). `nmcmc` and the
/// Python package pass $NMCMC_DATA_DIR here (apps/process/environment.hpp): the library reads no
/// environment variable.
void set_data_directory(const std::string& directory);

}  // namespace nmcmc
