// Note [OpenBLAS's kernels]'s rule, once: what the CPU runs, which of OpenBLAS's cores are its SSE-only
// fallback, and the core to use instead. The program (blas_kernels.cpp) and `import nmcmc`
// (blas_choice.cpp, through ctypes, before LibTorch loads) both decide with it.
#include <dlfcn.h>

#include <cctype>
#include <cstring>
#include <set>

#include "nmcmc/process/blas_kernels.hpp"

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

std::string probe_blas_core() {
  // A copy of the BLAS in a link-map namespace of its own: it picks its kernels as it would in
  // this process, and leaves nothing loaded here (dlclose), so OPENBLAS_CORETYPE can still be set.
  void* h = dlmopen(LM_ID_NEWLM, "libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return "";
  auto corename = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_corename"));
  auto config = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_config"));
  std::string core;
  if (corename != nullptr && config != nullptr && std::strstr(config(), "DYNAMIC_ARCH") != nullptr) core = corename();
  dlclose(h);
  return core;
}

}  // namespace nmcmc
