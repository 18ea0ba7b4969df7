#include "nmcmc/process/blas_check.hpp"

#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace nmcmc {

namespace {
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool reference = false;
  while (std::getline(maps, line)) {
    if (line.find("openblas") != std::string::npos) return "openblas";
    if (line.find("libmkl") != std::string::npos) return "mkl";
    if (line.find("blis") != std::string::npos) return "blis";
    if (line.find("atlas") != std::string::npos) return "atlas";
    if (line.find("/blas/libblas.so") != std::string::npos) reference = true;
  }
  return reference ? "reference" : "";
}
}  // namespace

BlasReport check_blas(bool measure) {
  BlasReport report;
  try {
    std::string config = torch::show_config();
    // Official LibTorch builds link MKL statically: no shared library shows in the maps.
    if (config.find("BLAS_INFO=mkl") != std::string::npos) report.library = "mkl (static)";
    if (report.library.empty()) report.library = loaded_blas();
    if (measure) {
      torch::NoGradGuard no_grad;
      auto a = torch::ones({512, 512});
      auto b = torch::ones({512, 512});
      (void)torch::mm(a, b);
      auto t0 = std::chrono::steady_clock::now();
      int reps = 4;
      for (int i = 0; i < reps; ++i) (void)torch::mm(a, b);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      report.gflops = reps * 2.0 * 512 * 512 * 512 / s / 1e9;
    }
    if (report.library == "reference" || report.library.empty() || (measure && report.gflops < 8.0)) {
      report.ok = false;
      std::ostringstream msg;
      msg << "WARNING: LibTorch seems to run on "
          << (report.library.empty() ? "an unidentified BLAS" : report.library + " BLAS");
      if (measure) msg << " (" << report.gflops << " GFLOP/s on a 512x512 sgemm)";
      msg << "; matrix work will be ~30x slower. Install libopenblas0-pthread "
             "(apt-get install libopenblas0-pthread) or select it with update-alternatives.";
      report.message = msg.str();
    }
  } catch (const std::exception& e) {
    report.ok = false;
    report.message = std::string("WARNING: could not check the BLAS: ") + e.what();
  }
  return report;
}

}  // namespace nmcmc
