#include "nmcmc/kernels/factory.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <fcntl.h>
#include <unistd.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::shared_ptr<Proposal> make_baseline_proposal(const ProposalOptions& o) {
  if (o.step_size && !(*o.step_size > 0 && std::isfinite(*o.step_size))) {
    throw UsageError("--step-size must be positive and finite");
  }
  const double eps = o.step_size.value_or(0.0);  // 0: found by find_reasonable_step_size at the start of the run
  if (o.sampler == SamplerKind::kRwm) return std::make_shared<RandomWalk>(eps);
  if (o.sampler == SamplerKind::kMala) return std::make_shared<Mala>(eps);
  if (o.sampler == SamplerKind::kHmc) {
    if (o.leapfrog < 1) throw UsageError("--leapfrog must be at least 1");
    auto hmc = std::make_shared<Hmc>(eps, o.leapfrog);
    if (!(o.jitter >= 0 && o.jitter < 1)) throw UsageError("--jitter must be in [0, 1)");
    hmc->set_jitter(o.jitter);
    return hmc;
  }
  throw UsageError("sampler " + enum_name(o.sampler) + " is not a baseline proposal (rwm, mala or hmc)");
}

std::unique_ptr<Kernel> make_baseline_kernel(const ProposalOptions& o) {
  if (o.sampler != SamplerKind::kNuts) return std::make_unique<MetropolisHastings>(make_baseline_proposal(o));
  if (o.step_size && !(*o.step_size > 0 && std::isfinite(*o.step_size))) {
    throw UsageError("--step-size must be positive and finite");
  }
  if (o.max_depth < 1 || o.max_depth > 30) throw UsageError("--max-depth must be in [1, 30]");
  return std::make_unique<Nuts>(NutsOptions().set_step_size(o.step_size.value_or(0.0)).set_max_depth(o.max_depth));
}

double default_target_accept(SamplerKind sampler) {
  if (sampler == SamplerKind::kRwm) return 0.234;
  if (sampler == SamplerKind::kMala) return 0.574;
  return 0.8;
}

}  // namespace nmcmc
