#pragma once
/// Baseline proposals and kernels by name: rwm, mala, hmc (MetropolisHastings) and nuts.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// How to build a baseline proposal or kernel.
struct ProposalOptions {
  std::string sampler = "hmc";  // rwm | mala | hmc | nuts
  std::optional<double> step_size;  // unset: find a reasonable one (Stan's heuristic)
  int64_t leapfrog = 10;
  double jitter = 0.0;  // HMC per-chain step-size jitter
  ProposalOptions& set_jitter(double j) { jitter = j; return *this; }
  ProposalOptions& set_sampler(std::string s) { sampler = std::move(s); return *this; }
  ProposalOptions& set_step_size(std::optional<double> e) { step_size = e; return *this; }
  int64_t max_depth = 10;  // NUTS tree-depth limit
  ProposalOptions& set_leapfrog(int64_t l) { leapfrog = l; return *this; }
  ProposalOptions& set_max_depth(int64_t d) { max_depth = d; return *this; }
};
/// Builds rwm / mala / hmc; throws UsageError for anything else.
std::shared_ptr<Proposal> make_baseline_proposal(const ProposalOptions& options);
/// A baseline kernel: NUTS for "nuts", else MetropolisHastings over make_baseline_proposal.
std::unique_ptr<Kernel> make_baseline_kernel(const ProposalOptions& options);
/// The default accept-rate target of a sampler (rwm 0.234, mala 0.574, hmc 0.8, others 0.8).
double default_target_accept(const std::string& sampler);

}  // namespace nmcmc
