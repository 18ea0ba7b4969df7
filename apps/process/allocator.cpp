#include "nmcmc/process/allocator.hpp"

#include <cstdlib>
#include <cstring>
#include <iostream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nmcmc {

namespace {
constexpr int kMmapThreshold = 32 << 20;   // glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
constexpr int kTrimThreshold = 512 << 20;  // free heap top kept before it is returned

AllocatorPolicy apply() {
  AllocatorPolicy p;
  const char* env = std::getenv("NMCMC_MALLOC");
  if (env != nullptr && std::strcmp(env, "default") == 0) {
    p.message = "glibc's default (NMCMC_MALLOC=default)";
    return p;
  }
  if (env != nullptr && *env != '\0' && std::strcmp(env, "reuse") != 0) {
    std::cerr << "nmcmc: NMCMC_MALLOC=" << env << " is not one of reuse, default; using reuse\n";
  }
#if defined(__GLIBC__)
  // Fixing either threshold turns off glibc's dynamic adjustment of both.
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1) {
    p.applied = true;
    p.message = "heap reuse (mmap threshold 32 MB, trim threshold 512 MB)";
  } else {
    p.message = "glibc's default (mallopt refused the thresholds)";
  }
#else
  p.message = "the C library's default (not glibc)";
#endif
  return p;
}
}  // namespace

AllocatorPolicy tune_allocator() {
  static const AllocatorPolicy policy = apply();
  return policy;
}

}  // namespace nmcmc
