#pragma once
/// exp in plain arithmetic, so that loops over it vectorise (libm's exp is a call per element):
/// the native passes' (flows/native_flow.cpp, flows/native_step.cpp).
#include <cstdint>
#include <cstring>

namespace nmcmc {
/// exp(x) for |x| <= 700 in plain arithmetic, so that loops over it vectorise (libm's exp is a
/// call per element): x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, the first with
/// trailing zero bits so n ln2_hi is exact), exp(r) by its Taylor polynomial to r^13 (truncation
/// below 3e-17 relative), times 2^n built in the exponent bits. Within 2 ulp of libm's exp
/// (tests compare the pass with LibTorch's at 1e-13).
inline double exp_core(double x) {
  const double n = (x * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;  // round to nearest
  double r = x - n * 0.693147180369123816490;
  r = r - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t bits = (static_cast<int64_t>(n) + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// x within [-700, 700] for exp_core; NaN becomes 0 (callers put the NaN back).
inline double clamp700(double x) { return x != x ? 0.0 : (x < -700.0 ? -700.0 : (x > 700.0 ? 700.0 : x)); }

}  // namespace nmcmc
