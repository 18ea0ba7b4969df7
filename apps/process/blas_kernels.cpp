#include "nmcmc/process/blas_kernels.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>

namespace nmcmc {

namespace {
/// Whether `name` is one of OpenBLAS's x86 cores whose kernels use SSE only (its fallback for a CPU
/// it does not know is Prescott); case-insensitive.
bool sse_only_core(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::set<std::string> sse_only = {"prescott", "core2",     "penryn",     "dunnington", "nehalem",
                                                 "atom",     "katmai",    "coppermine", "northwood",  "banias",
                                                 "athlon",   "opteron",   "opteron_sse3", "barcelona", "bobcat",
                                                 "nano"};
  return sse_only.count(name) > 0;
}

template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}
}  // namespace

CpuVectorSupport cpu_vector_support() {
  CpuVectorSupport s;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  s.avx = __builtin_cpu_supports("avx");
  s.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  s.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  s.avx512_bf16 = s.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return s;
}

std::string better_blas_core(const std::string& loaded, const CpuVectorSupport& cpu) {
  // Only OpenBLAS's SSE-only fallback is replaced: a CPU it recognised (Haswell, Zen, ...) keeps
  // the kernels it chose for it, even where wider ones would run (an AMD Zen 4 with AVX-512).
  if (!sse_only_core(loaded)) return "";
  if (cpu.avx512) return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  if (cpu.avx) return "SandyBridge";
  return "";
}

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
