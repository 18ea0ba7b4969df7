#include "nmcmc/process/gemm.hpp"

#include <cstdlib>
#include <iostream>

namespace nmcmc {

bool warn_gemm_environment() {
  const char* env = std::getenv("NMCMC_GEMM");
  if (env == nullptr || *env == '\0') return false;
  std::cerr << "nmcmc: NMCMC_GEMM=" << env
            << " is no longer read: the GEMM backend is the model's (model.gemm in a config, --gemm on `nmcmc "
               "sample`: auto | onednn | libtorch)\n";
  return true;
}

}  // namespace nmcmc
