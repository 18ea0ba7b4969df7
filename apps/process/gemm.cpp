#include "nmcmc/process/gemm.hpp"

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace nmcmc {

GemmBackend apply_gemm_environment() {
  GemmBackend backend = GemmBackend::kAuto;
  const char* env = std::getenv("NMCMC_GEMM");
  if (env != nullptr && std::strcmp(env, "openblas") == 0) {
    backend = GemmBackend::kLibTorch;
  } else if (env != nullptr && std::strcmp(env, "onednn") == 0) {
    backend = GemmBackend::kOneDnn;
  } else if (env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0) {
    std::cerr << "nmcmc: NMCMC_GEMM=" << env << " is not one of auto, onednn, openblas; using auto\n";
  }
  set_gemm_backend(backend);
  return backend;
}

}  // namespace nmcmc
