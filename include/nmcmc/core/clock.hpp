#pragma once
/// The wall clock every measured duration reads (steady: never set back).
#include <chrono>

namespace nmcmc {

using Clock = std::chrono::steady_clock;

/// Seconds from t0 to now.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace nmcmc
