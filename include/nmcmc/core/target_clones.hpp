#pragma once
/// NMCMC_CLONES: the function is compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the
/// build's baseline, the best of them chosen when the library loads (GCC's target_clones). The
/// build itself targets the baseline x86-64, since the machines it runs on differ; loops that
/// should vectorise wider carry this (nn/activations.cpp, flows/native_flow.cpp).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NMCMC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NMCMC_CLONES
#endif
