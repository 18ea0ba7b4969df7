#pragma once
/// Note [OpenBLAS's kernels]
/// A DYNAMIC_ARCH OpenBLAS (Debian's libopenblas0-pthread) picks its kernels when it loads, from
/// the CPU's family and model. A model newer than the library falls back to its most generic
/// kernels: OpenBLAS 0.3.21 (Debian 12) runs Intel's Emerald Rapids (family 6, model 207, with
/// AVX-512 and AVX512-BF16) on "Prescott", SSE3 kernels, and every GEMM runs ~3x slower than it
/// should (Funnel-1's training step at batch 1024: 1.58 s, 0.52 s with the AVX-512 kernels). The choice is made before main() and only the
/// environment (OPENBLAS_CORETYPE, read when the library loads) overrides it. So where OpenBLAS
/// took one of its SSE-only cores on a CPU that runs AVX or wider, the program executes itself
/// again, once, with OPENBLAS_CORETYPE set to the best core the CPU's instructions run; the new
/// process keeps NMCMC_BLAS_CORE_FROM (what OpenBLAS had picked) for `nmcmc --version` to report.
/// A user's own OPENBLAS_CORETYPE is always left as it is (set it to keep OpenBLAS's choice).
/// The Python package decides with the same rule before it loads LibTorch (blas_choice.cpp, called
/// through ctypes by python/nmcmc/__init__.py), probing OpenBLAS's pick in a link-map namespace of
/// its own instead of a second start.
#include <string>

namespace nmcmc {

/// What the CPU can run, as far as OpenBLAS's kernel families go.
struct CpuVectorSupport {
  bool avx = false, avx2_fma = false, avx512 = false /* F, BW, VL, DQ */, avx512_bf16 = false;
};
/// This CPU's (GCC's __builtin_cpu_supports, which also checks that the OS saves the registers).
CpuVectorSupport cpu_vector_support();

/// The OPENBLAS_CORETYPE to use instead of `loaded` (OpenBLAS's core name, as
/// openblas_get_corename() gives it) on a CPU with `cpu`: only where `loaded` is one of OpenBLAS's
/// SSE-only cores (its fallback for a CPU it does not know) and the CPU runs AVX or wider; "" for
/// a core OpenBLAS chose for a CPU it recognised, and for a name this function does not know.
std::string better_blas_core(const std::string& loaded, const CpuVectorSupport& cpu);

/// The core a DYNAMIC_ARCH OpenBLAS (libblas.so.3) picks on this CPU when it loads, probed in a
/// link-map namespace of its own (dlmopen) so that nothing stays loaded; "" where there is none.
std::string probe_blas_core();

struct BlasKernels {
  std::string loaded;      // OpenBLAS's kernels now ("" when the BLAS is not a DYNAMIC_ARCH OpenBLAS)
  std::string better;      // better_blas_core(loaded, this CPU), "" if none
  std::string chosen_over; // NMCMC_BLAS_CORE_FROM: the kernels OpenBLAS had picked before nmcmc chose
  std::string describe() const;  // one line for `nmcmc --version`
};
/// The loaded OpenBLAS's kernels and whether this CPU runs better ones.
BlasKernels blas_kernels();

/// Note [OpenBLAS's kernels]: re-executes this program (/proc/self/exe, the same argv) with
/// OPENBLAS_CORETYPE set where OpenBLAS took kernels weaker than the CPU runs and the environment
/// does not set OPENBLAS_CORETYPE. Call first thing in main(). Returns where there is nothing to
/// do, or where the exec failed (then nothing changed).
void use_best_blas_kernels(char** argv);

}  // namespace nmcmc
