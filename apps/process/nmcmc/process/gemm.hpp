#pragma once
/// NMCMC_GEMM, which chose the float32 GEMM backend for the whole process until 0.9, is no longer
/// read: the backend is the model's (model.gemm in a config, `nmcmc sample --gemm`; Note
/// [Linear-layer policy]). A process that still has it set is told so, once, on stderr.
namespace nmcmc {

/// Whether NMCMC_GEMM is set (then a one-line notice went to stderr).
bool warn_gemm_environment();

}  // namespace nmcmc
