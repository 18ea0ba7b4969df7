#pragma once
// run_sampler's warm-up in phases (Note [Warm-up in phases], phases.cpp).
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// run_sampler with options.phases, in one process.
SampleResult run_in_phases(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                           const ProgressFn& progress);

}  // namespace nmcmc
