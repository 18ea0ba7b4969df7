#pragma once
/// Where a previous run of the same model left its adaptation, as the start of the next run.
///
/// Note [Warm starts]
/// A user fits one model to data set after data set (next month's data, another election year).
/// A run of NUTS, HMC or MALA ends with an adapted step size and metric and with its chains in the
/// posterior; the next data set's posterior is usually near. A warm start carries the three over:
/// the new run starts its chains where the old ones ended, with the old step size and metric, and
/// needs only a short warm-up (the step size is adapted again; the metric is kept unless the run
/// asks to re-estimate it over its windows). It belongs to one model: the same dimension and the
/// same parameter names (UsageError otherwise). A run records its warm start in summary.json
/// ("adaptation"); `nmcmc sample --warm-start DIR` and nmcmc.sample(warm_start=run) read it, and
/// `nmcmc train --from` starts the learned sampler's preconditioner warm-up from the model's own.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "nmcmc/core/target.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/kernels/tunable.hpp"

namespace nmcmc {

/// Dense metrics are recorded up to this dimension; above it, their diagonal (a D x D matrix of
/// doubles in JSON outgrows the rest of summary.json: 9 million numbers at D = 3,000).
constexpr int64_t kWarmStartDenseMaxDim = 400;

struct WarmStart {
  std::string sampler;             // the sampler that adapted it (nuts, hmc, mala)
  double step_size = 0;            // the adapted step size (> 0)
  torch::Tensor inv_mass;          // [D] or [D, D] float64; undefined: the unit metric
  torch::Tensor positions;         // [C, D] float64: where the chains ended (the sampler's space)
  std::vector<std::string> names;  // the D parameter labels (parameter_labels)

  /// What a finished run leaves (null where it has nothing to carry: no step size, no draws).
  static nlohmann::json record(const SampleResult& last_run, const std::vector<std::string>& names,
                               const std::string& sampler);
  /// From a record (UsageError naming what is missing or malformed); `where` names its source.
  static WarmStart from_json(const nlohmann::json& j, const std::string& where);
  /// A record, or the path of a run's directory or of its summary.json.
  static WarmStart read(const nlohmann::json& record_or_path);
  /// UsageError unless `target` is the same model: its dimension and parameter labels.
  void check_model(const Target& target, const std::string& where) const;
  /// Gives `kernel` the metric (its diagonal where `dense` is false or the kernel has only a
  /// diagonal one) and, with `step`, the step size. Returns the metric it set (undefined: none).
  torch::Tensor apply(Tunable& kernel, const torch::TensorOptions& options, bool dense = true, bool step = true) const;
  /// "unit", "diag" or "dense": the recorded metric's form.
  std::string metric_kind() const { return !inv_mass.defined() ? "unit" : inv_mass.dim() == 2 ? "dense" : "diag"; }
  int64_t dim() const { return positions.size(1); }
};

}  // namespace nmcmc
