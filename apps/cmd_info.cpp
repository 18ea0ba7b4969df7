// `nmcmc info` and `nmcmc targets`.
#include <fmt/format.h>

#include <iostream>

#include "cli.hpp"
#include "nmcmc/process/blas_check.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/nn/onednn_gemm.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc::cli {

Command add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "versions, BLAS check, devices");
  return {cmd, [] {
            std::cout << version_text(/*measure_blas=*/true) << "\n";
            std::cout << "CUDA available: " << (torch::cuda::is_available() ? "yes" : "no") << "\n";
            std::cout << "bfloat16 GEMMs: "
                      << (cpu_has_fast_bf16_matmul()
                              ? "fast (AMX-BF16 through oneDNN): learned samplers with model.matmul = auto sample with them "
                                    "(and train with them with model.matmul = bfloat16)"
                              : "no AMX-BF16 here: model.matmul = auto multiplies in float32")
                      << "\n";
            std::cout << "float32 GEMMs: "
                      << (onednn_gemm_available()
                              ? "oneDNN with reordered weights where LibTorch and the BLAS run one thread "
                                "(OPENBLAS_NUM_THREADS=1), LibTorch's BLAS otherwise (model.gemm = auto; onednn or libtorch forces either)"
                              : "LibTorch's BLAS (this build has no oneDNN: libdnnl-dev)")
                      << "\n";
            std::cout << "data directory: " << data_directory() << "\n";
            auto report = check_blas(false);
            if (!report.ok) std::cerr << report.message << "\n";
            return 0;
          }};
}

Command add_targets_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("targets", "list the built-in targets and their options");
  return {cmd, [] {
            for (const auto& t : target_catalogue()) {
              std::cout << fmt::format("{:<12} {}\n", t.name, t.description);
              for (const auto& [opt, meaning] : t.options) std::cout << fmt::format("{:<14} {:<14} {}\n", "", opt, meaning);
            }
            std::cout << "\nExamples:\n"
                         "  nmcmc sample --target funnel --dim 20 --sigma 3 --sampler hmc\n"
                         "  nmcmc sample --target logistic --dataset german --sampler hmc --adapt-mass\n"
                         "  nmcmc sample --target-json '{\"name\":\"gaussian\",\"scales\":[1,10]}'\n";
            return 0;
          }};
}

}  // namespace nmcmc::cli
