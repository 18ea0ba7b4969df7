#pragma once
/// The float32 GEMM backend as the environment asks for it (NMCMC_GEMM=auto|onednn|openblas):
/// read by the program, the benchmarks and the Python module at start, never by the library.
#include "nmcmc/nn/onednn_gemm.hpp"

namespace nmcmc {

/// Parses NMCMC_GEMM (unset or empty: auto; anything else is reported on stderr once and
/// taken as auto) and sets the backend with set_gemm_backend; returns what was set.
GemmBackend apply_gemm_environment();

}  // namespace nmcmc
