#include "nmcmc/process/blas_kernels.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace nmcmc {

namespace {
template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}
}  // namespace

BlasKernels blas_kernels() {
  BlasKernels k;
  auto corename = blas_symbol<char* (*)()>("openblas_get_corename");
  auto config = blas_symbol<char* (*)()>("openblas_get_config");
  if (corename != nullptr && config != nullptr && std::strstr(config(), "DYNAMIC_ARCH") != nullptr) {
    k.loaded = corename();
    k.better = better_blas_core(k.loaded, cpu_vector_support());
  }
  if (const char* from = std::getenv("NMCMC_BLAS_CORE_FROM")) k.chosen_over = from;
  return k;
}

std::string BlasKernels::describe() const {
  if (loaded.empty()) return "not a DYNAMIC_ARCH OpenBLAS";
  std::string s = loaded;
  if (!chosen_over.empty()) s += " (chosen by nmcmc over " + chosen_over + ", OpenBLAS's pick for this CPU)";
  if (!better.empty()) s += " (this CPU runs " + better + ": OPENBLAS_CORETYPE=" + better + ")";
  return s;
}

void use_best_blas_kernels(char** argv) {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set != nullptr && *set != '\0') return;  // the user's (or an earlier exec's) choice
  const BlasKernels k = blas_kernels();
  if (k.better.empty() || argv == nullptr || argv[0] == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", k.better.c_str(), 1);
  ::setenv("NMCMC_BLAS_CORE_FROM", k.loaded.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_CORETYPE");  // the exec failed: go on as we were
  ::unsetenv("NMCMC_BLAS_CORE_FROM");
}

}  // namespace nmcmc
