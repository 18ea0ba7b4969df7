#pragma once
/// The environment variables nmcmc's program and Python package honour, read here (a process
/// concern) and handed to the library, which reads none:
///   NMCMC_DATA_DIR        the shipped data (set_data_directory)
///   NMCMC_FASHION_MNIST   Fashion-MNIST's files (set_fashion_mnist_directory)
///   WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun's), NMCMC_DIST_TIMEOUT,
///   GLOO_SOCKET_IFNAME    how a process joins a distributed run (dist_options_from_environment)
/// (OPENBLAS_CORETYPE and NMCMC_MALLOC: blas_kernels.hpp, allocator.hpp; the Stan cache:
/// stan_build.hpp.)
#include <optional>
#include <string>

#include "nmcmc/parallel/communicator.hpp"

namespace nmcmc {

/// Hands NMCMC_DATA_DIR and NMCMC_FASHION_MNIST to the library (where set and not empty).
void apply_environment();

/// A distributed run's options from the torchrun variables and NMCMC_DIST_TIMEOUT (seconds);
/// absent WORLD_SIZE: one process. UsageError for malformed ones.
parallel::DistOptions dist_options_from_environment();

/// The variable's value; nullopt where it is unset or empty.
std::optional<std::string> environment_value(const char* name);

}  // namespace nmcmc
