#pragma once
// What run.cpp's run loop and phases.cpp's warm-up in phases share (Note [Warm-up in phases]).
#include <vector>

#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// Every step's positions and energy gradients, as the kernel carries them ([C, D] each, float64
/// on the CPU, in step order).
struct StepRecord {
  std::vector<torch::Tensor> x, grad;
};

/// The run of this process's chains (run_sampler's with one process). With `record`, every step's
/// state goes to it (a UsageError for a kernel that computes no gradients).
SampleResult run_local(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                       const ProgressFn& progress, StepRecord* record = nullptr);

/// run_sampler with options.phases (phases.cpp).
SampleResult run_in_phases(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                           const ProgressFn& progress);

}  // namespace nmcmc
