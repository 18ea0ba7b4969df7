#pragma once
// A NUTS chain's own stream of random numbers: splitmix64 bits, uniforms on [0, 1) and standard
// normals by the ziggurat method (Marsaglia & Tsang 2000, "The Ziggurat Method for Generating
// Random Variables", 128 layers; the layer index and the value from separate bits of one 64-bit
// word, so they are independent). Each chain draws its momentum from its own stream, so a chain's
// draws do not depend on which other chains share its batch (Note [Asynchronous NUTS chains]).
#include <cstdint>

namespace nmcmc::detail {

struct ChainStream {
  uint64_t s = 0;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  /// N(0, 1): one 64-bit word in about 99 % of calls (the rectangle inside a layer), the wedge
  /// and the tail beyond r = 3.4426 by rejection.
  double normal();
};

}  // namespace nmcmc::detail
