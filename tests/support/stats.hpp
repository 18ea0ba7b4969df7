#pragma once
// Statistical helpers for the invariance tests.
//
// Note [Invariance tests]
// N independent chains start at exact draws of a known target, take k steps of a kernel, and
// are whitened to what must be N(0, I) draws if the kernel leaves the target invariant. We
// then run Kolmogorov-Smirnov tests on every coordinate, on random unit projections and on
// |z|^2 against chi-square(D). The family-wise false-fail rate is kFamilyAlpha = 1e-6 per
// kernel/target case, split evenly over the m sub-tests (Bonferroni). With N = 20000 chains
// and m <= 100 sub-tests, each sub-test rejects at a KS distance of about
// sqrt(ln(2m / 1e-6) / (2N)) ~= 0.022: a location error of ~0.055 sd or a scale error of
// ~9 % in any tested direction is detected with near certainty. Deliberately broken kernels
// must fail the same tests (they do, with p-values far below the threshold).
#include <torch/torch.h>

#include <memory>
#include <string>

#include "nmcmc/flows/learned.hpp"
#include "nmcmc/images/conv_sampler.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc::test_support {

constexpr double kFamilyAlpha = 1e-6;

/// Where the device-taking tests put their targets and chains: NMCMC_TEST_DEVICE ("cpu", the
/// default, "cuda" or "cuda:N"; a CUDA name on a machine without CUDA fails the test run). The
/// baseline and NUTS invariance tests and their power checks take it (docs/tests.md).
torch::TensorOptions device_options(torch::Dtype dtype);

/// A run's moments against known ones, each judged by its own standard error: every parameter's
/// mean within z MCSEs of the true mean and its sd within z MCSEs of the sd (R's posterior
/// package's mcse_mean and mcse_sd; diagnostics/ess.hpp). About 6e-7 false fails per check at
/// z = 5 (normal approximation). draws [S, C, D], mean and sd [D]. Returns "" when every check
/// passes, else what failed.
std::string moments_within(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd, double z = 5.0);

/// Asymptotic Kolmogorov-Smirnov p-value of sorted-or-not uniform values u [n] against U(0, 1).
double ks_uniform_pvalue(const torch::Tensor& u);

/// What an invariance test found. A kernel passes when the chains keep the target's law AND they
/// move: a kernel that rejects every proposal leaves exact draws exact, so the law alone cannot
/// catch it. The power tests of broken kernels check distribution_passes() (with moves() true), so
/// that they fail for the law, not because the chains froze.
struct InvarianceReport {
  double min_p = 1.0;
  int n_tests = 0;
  std::string worst;  // which sub-test gave min_p
  double accept = NAN;  // mean accept probability over chains and steps
  double moved = NAN;   // fraction of chains whose final state differs from their start
  bool distribution_passes() const { return min_p >= kFamilyAlpha / n_tests; }
  bool moves() const { return accept > 0.05 && accept < 0.99 && moved > 0.2; }
  bool passes() const { return distribution_passes() && moves(); }
  std::string describe() const;
};

/// Tests z [N, D] (float64) against N(0, I): coordinates, `projections` random directions, |z|^2.
InvarianceReport normal_tests(const torch::Tensor& z, int projections, uint64_t seed);

/// Starts n chains at exact draws of `target`, runs k MH steps with `proposal`, returns x [n, D].
torch::Tensor run_from_exact(Target& target, std::shared_ptr<Proposal> proposal, int64_t n, int64_t k, uint64_t seed);

/// The same with any kernel (e.g. NUTS).
torch::Tensor run_from_exact(Target& target, Kernel& kernel, int64_t n, int64_t k, uint64_t seed);

/// The end states and how the chains moved: the mean accept probability over chains and steps
/// and the fraction of chains that left their start.
struct ExactRun {
  torch::Tensor x;
  double accept = 0, moved = 0;
};
ExactRun run_from_exact_with_moves(Target& target, Kernel& kernel, int64_t n, int64_t k, uint64_t seed);

/// Whitens draws of a Gaussian target with covariance `cov` and mean `mean` (Cholesky).
torch::Tensor whiten_gaussian(const torch::Tensor& x, const torch::Tensor& mean, const torch::Tensor& cov);
/// Whitens draws of a built-in Gaussian or funnel target given by its spec (what the invariance
/// tests test against N(0, I)).
torch::Tensor whiten_known(const nlohmann::json& spec, Target& target, const torch::Tensor& x);
/// Maps funnel draws to N(0, I): z0 = x0 / sigma, z_i = x_i exp(x0 / 2).
torch::Tensor whiten_funnel(const torch::Tensor& x, double sigma);

/// A float64 learned sampler built from `options` whose every parameter but log eps (the
/// zero-initialised output layers included) is perturbed by N(0, (scale / sqrt(fan))^2).
LearnedSampler perturbed_sampler(const LearnedOptions& options, uint64_t seed, double scale = 0.3);

/// The same for the convolutional sampler (fan = the weight's input size).
ConvSampler perturbed_conv_sampler(const ConvSamplerOptions& options, uint64_t seed, double scale = 0.3);

/// Central finite-difference gradient of target.energy at x [C, D] (float64).
torch::Tensor finite_difference_grad(Target& target, const torch::Tensor& x, double h = 1e-6);

}  // namespace nmcmc::test_support
