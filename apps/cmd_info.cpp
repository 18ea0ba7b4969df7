// `nmcmc info`, `nmcmc targets` and `nmcmc stan-syntax`.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "nmcmc/process/blas_check.hpp"
#include "nmcmc/process/stan_build.hpp"
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

Command add_stan_syntax_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("stan-syntax",
                                 "print a Stan program as Stan 2.21 reads it: the translation --stan applies before "
                                 "compiling (docs/stan.md), e.g. for rstan");
  auto program = std::make_shared<std::string>();
  cmd->add_option("program", *program, "the Stan program (.stan)")->required();
  return {cmd, [program] {
            std::ifstream in(*program);
            if (!in) throw ExitError(fmt::format("{}: cannot be read", *program), kExitUsage);
            std::ostringstream text;
            text << in.rdbuf();
            std::cout << translate_stan_syntax(text.str(), *program);
            return 0;
          }};
}

}  // namespace nmcmc::cli
