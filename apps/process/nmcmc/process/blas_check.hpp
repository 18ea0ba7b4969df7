#pragma once
/// Start-up check that LibTorch is not running on the reference BLAS.
#include <string>

namespace nmcmc {

struct BlasReport {
  bool ok = true;          // false: reference BLAS (or an unknown, slow one)
  std::string library;     // what was found ("openblas", "mkl", "reference", ...)
  double gflops = 0.0;     // measured sgemm throughput (0 if not measured)
  std::string message;     // a warning to show when !ok
};

/// Inspects the loaded BLAS (build config and /proc/self/maps) and, if `measure`, times a
/// 512x512 float32 matmul. Never throws.
BlasReport check_blas(bool measure);

}  // namespace nmcmc
