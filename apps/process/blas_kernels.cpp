#include "nmcmc/process/blas_kernels.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>

namespace nmcmc {

namespace {
/// OpenBLAS's x86 core names by the widest vector instructions their kernels use: 3 AVX-512,
/// 2 AVX2 with FMA, 1 AVX, 0 SSE only. Lower case; names not listed are not ranked.
int core_rank(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, int> ranks = {
      {"sapphirerapids", 3}, {"cooperlake", 3}, {"skylakex", 3},
      {"haswell", 2}, {"zen", 2}, {"excavator", 2},
      {"sandybridge", 1}, {"bulldozer", 1}, {"piledriver", 1}, {"steamroller", 1},
      {"prescott", 0}, {"core2", 0}, {"penryn", 0}, {"dunnington", 0}, {"nehalem", 0}, {"atom", 0},
      {"katmai", 0}, {"coppermine", 0}, {"northwood", 0}, {"banias", 0}, {"athlon", 0}, {"opteron", 0},
      {"opteron_sse3", 0}, {"barcelona", 0}, {"bobcat", 0}, {"nano", 0}};
  auto it = ranks.find(name);
  return it == ranks.end() ? -1 : it->second;
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
  if (core_rank(loaded) != 0) return "";
  const int have = 0;
  std::string best;
  int rank = -1;
  if (cpu.avx512) {
    best = cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
    rank = 3;
  } else if (cpu.avx2_fma) {
    best = "Haswell";
    rank = 2;
  } else if (cpu.avx) {
    best = "SandyBridge";
    rank = 1;
  }
  return rank > have ? best : "";
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
