#pragma once
/// What warm-up tunes, written once for kernels and proposals alike.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "nmcmc/kernels/metric.hpp"

namespace nmcmc {

/// The step size and the metric that warm-up adapts (dual averaging; Stan's windows). A kernel
/// (Kernel) and an uncalibrated proposal (Proposal) are both Tunable; a class built around another
/// forwards all of it by deriving from TuningFrom.
class Tunable {
 public:
  virtual ~Tunable() = default;
  virtual std::string name() const = 0;
  /// The step size, for reports (0 when there is none).
  virtual double step_size() const { return 0.0; }
  /// Whether warm-up may tune the step size with set_step_size(). A sampler whose step size is
  /// learned or fixed says no, and run_sampler refuses (or, left to itself, skips) adaptation.
  virtual bool has_tunable_step_size() const { return false; }
  /// Sets the step size (every chain's); throws where there is none to tune (never a silent no-op).
  virtual void set_step_size(double eps);
  /// Whether each chain may have a step size of its own (set_step_sizes), as Stan adapts each
  /// chain's (Note [A step size per chain], kernels/adaptation.hpp).
  virtual bool has_per_chain_step_size() const { return false; }
  /// Sets each chain's step size ([C]); throws where the kernel has one step size for all.
  virtual void set_step_sizes(const std::vector<double>& eps);
  /// Each chain's step size when set apart by set_step_sizes, else empty (one for all: step_size()).
  virtual std::vector<double> step_sizes() const { return {}; }
  /// Whether warm-up may adapt the metric with set_metric().
  virtual bool has_metric() const { return false; }
  /// Whether the metric may be other than diagonal (dense [D, D], low-rank plus diagonal).
  virtual bool has_dense_metric() const { return false; }
  /// Sets the metric (in the target's dtype and device); throws where there is none to adapt.
  virtual void set_metric(const Metric& metric);
  /// set_metric(Metric(inv_mass)): [D] (diagonal) or [D, D] (dense); undefined: the unit metric.
  void set_inv_mass(const torch::Tensor& inv_mass) { set_metric(inv_mass.defined() ? Metric(inv_mass) : Metric()); }
};

/// `Base` (Kernel or Proposal) whose tuning is another Tunable's, `tuned()`: MetropolisHastings
/// over its proposal, a transported kernel over its kernel.
template <class Base>
class TuningFrom : public Base {
 public:
  double step_size() const override { return tuned().step_size(); }
  bool has_tunable_step_size() const override { return tuned().has_tunable_step_size(); }
  void set_step_size(double eps) override { tuned().set_step_size(eps); }
  bool has_per_chain_step_size() const override { return tuned().has_per_chain_step_size(); }
  void set_step_sizes(const std::vector<double>& eps) override { tuned().set_step_sizes(eps); }
  std::vector<double> step_sizes() const override { return tuned().step_sizes(); }
  bool has_metric() const override { return tuned().has_metric(); }
  bool has_dense_metric() const override { return tuned().has_dense_metric(); }
  void set_metric(const Metric& metric) override { tuned().set_metric(metric); }

 protected:
  virtual Tunable& tuned() const = 0;
};

}  // namespace nmcmc
