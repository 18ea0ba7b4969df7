// The C entry point of `import nmcmc`'s choice of OpenBLAS's kernels (Note [OpenBLAS's kernels]):
// python/nmcmc/__init__.py loads this small library (no LibTorch, no BLAS linked) with ctypes
// before it imports torch, and sets OPENBLAS_CORETYPE from the answer. No child process: the BLAS's
// own pick is probed in a link-map namespace of its own (probe_blas_core).
#include <cstdlib>
#include <string>

#include "nmcmc/process/blas_kernels.hpp"

/// "CORE\tLOADED" where OpenBLAS would load its SSE-only fallback LOADED on a CPU that runs CORE's
/// kernels and OPENBLAS_CORETYPE is unset; "" otherwise.
extern "C" __attribute__((visibility("default"))) const char* nmcmc_blas_choice() {
  static std::string answer;
  answer.clear();
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set != nullptr && *set != '\0') return answer.c_str();
  const std::string loaded = nmcmc::probe_blas_core();
  const std::string better = nmcmc::better_blas_core(loaded, nmcmc::cpu_vector_support());
  if (!better.empty()) answer = better + "\t" + loaded;
  return answer.c_str();
}
