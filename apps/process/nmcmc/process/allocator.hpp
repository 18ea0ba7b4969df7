#pragma once
// Note [Allocator policy]
// A training step allocates and frees the same few hundred tensors every step (at Funnel-1's
// batch 128, ~14 MB of activations and gradients of 128 x 512 floats, 256 KB each). glibc's
// malloc serves blocks above its mmap threshold (128 KB at start, raised dynamically to the
// largest block freed) from fresh mappings, and gives the heap's free top back to the system
// whenever it exceeds its trim threshold (twice that): at the end of every step the whole
// step's memory went back to the kernel and the next step faulted it in again, page by page
// (~3500 page faults per step, each followed by the kernel zeroing the page; the first touch
// happens inside whichever kernel writes the new tensor, so the profiler charged it to
// elu_backward, mm and copy_). tune_allocator() fixes both thresholds, so the freed memory
// stays in the heap and is reused, a few per cent off a Funnel-1 training step (bench/nmcmc_bench).
// Blocks above 32 MB are still mapped and unmapped on their own, and up to 512 MB of free heap
// top is kept; the peak memory of a run is unchanged. Called once at the start of the `nmcmc`
// program, the benchmarks and the Python module; NMCMC_MALLOC=default leaves glibc's policy
// (NMCMC_MALLOC=reuse, or unset, is this one; anything else is reported on stderr and ignored).
#include <string>

namespace nmcmc {

struct AllocatorPolicy {
  bool applied = false;  // false: not glibc, or NMCMC_MALLOC=default, or mallopt refused
  std::string message;   // what was done, for `nmcmc info`
};

/// Sets the process's malloc thresholds (Note [Allocator policy]) once; later calls return the
/// first call's outcome. Never throws.
AllocatorPolicy tune_allocator();

}  // namespace nmcmc
