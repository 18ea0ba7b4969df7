#pragma once
// The part of starting_points.cpp the run loop (run.cpp) calls that is not public.
#include <string>

#include "nmcmc/kernels/kernel.hpp"

namespace nmcmc {

/// Note [Starting points that cannot move]: random starting points where no step size moves a
/// chain are drawn again (up to a few rounds); `redrawn` counts them. Returns the points.
torch::Tensor screen_starting_points(Target& target, Kernel& kernel, torch::Tensor x0, const std::string& scheme,
                                     at::Generator& gen, int64_t& redrawn);

}  // namespace nmcmc
