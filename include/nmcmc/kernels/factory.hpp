#pragma once
/// Baseline proposals and kernels by name: rwm, mala, hmc (MetropolisHastings) and nuts.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nmcmc/core/enum_names.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// The samplers by name (the command line's and configs' `sampler`).
enum class SamplerKind { kRwm, kMala, kHmc, kNuts, kLearned };
template <>
struct EnumNames<SamplerKind> {
  static constexpr const char* what = "sampler";
  static std::vector<std::pair<SamplerKind, const char*>> values() {
    return {{SamplerKind::kRwm, "rwm"},
            {SamplerKind::kMala, "mala"},
            {SamplerKind::kHmc, "hmc"},
            {SamplerKind::kNuts, "nuts"},
            {SamplerKind::kLearned, "learned"}};
  }
};
NMCMC_ENUM_JSON(SamplerKind)

/// How to build a baseline proposal or kernel.
struct ProposalOptions {
  SamplerKind sampler = SamplerKind::kHmc;  // rwm | mala | hmc | nuts
  std::optional<double> step_size;  // unset: find a reasonable one (Stan's heuristic)
  int64_t leapfrog = 10;
  double jitter = 0.0;  // HMC per-chain step-size jitter
  ProposalOptions& set_jitter(double j) { jitter = j; return *this; }
  ProposalOptions& set_sampler(SamplerKind s) { sampler = s; return *this; }
  ProposalOptions& set_step_size(std::optional<double> e) { step_size = e; return *this; }
  int64_t max_depth = 10;  // NUTS tree-depth limit
  ProposalOptions& set_leapfrog(int64_t l) { leapfrog = l; return *this; }
  ProposalOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
};
/// Builds rwm / mala / hmc; throws UsageError for nuts and learned (not proposals of this kind).
std::shared_ptr<Proposal> make_baseline_proposal(const ProposalOptions& options);
/// A baseline kernel: NUTS for nuts, else MetropolisHastings over make_baseline_proposal.
std::unique_ptr<Kernel> make_baseline_kernel(const ProposalOptions& options);
/// The default accept-rate target of a sampler (rwm 0.234, mala 0.574, hmc 0.8, others 0.8).
double default_target_accept(SamplerKind sampler);

}  // namespace nmcmc
