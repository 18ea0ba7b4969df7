#pragma once
// The parts of services/transport.cpp that flow_run.cpp's run through the flow also uses.
#include <utility>
#include <vector>

#include "nmcmc/services/transport.hpp"

namespace nmcmc {

/// The transport's options checked, and its rounds' lengths (Note [Transport warm-up]).
std::vector<int64_t> transport_round_lengths(const RunOptions& options, const TransportOptions& t);

/// The affine map alone with its base estimated from (x, g) (the low-rank-plus-diagonal Fisher
/// estimate; no Adam step), and its held-out loss on those points.
std::pair<FlowTransport, FitReport> transport_affine_estimate(int64_t d, const FitOptions& fit, const torch::Tensor& x,
                                                              const torch::Tensor& g, uint64_t mask_seed,
                                                              uint64_t fit_seed);

/// `--transport flow` (Note [Transport warm-up]): flow_run.cpp.
TransportRun run_flow_transport(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                                uint64_t seed, const ProgressFn& progress);

}  // namespace nmcmc
