#pragma once
// The run of one process's chains (run.cpp), which the phased (run_phases.cpp) and the sharded
// (run_sharded.cpp) runs call; not public.
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// All `o.chains` chains in this process: starting points, warm-up, sampling (Note [Thinning]).
SampleResult run_local(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed, const ProgressFn& progress);

}  // namespace nmcmc
