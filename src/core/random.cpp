#include "nmcmc/core/random.hpp"

#include <ATen/CPUGeneratorImpl.h>

namespace nmcmc {

uint64_t stream_seed(uint64_t seed, int64_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(index);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

at::Generator make_generator(uint64_t seed, const torch::Device& device) {
  if (device.is_cpu()) {
    return at::make_generator<at::CPUGeneratorImpl>(seed);
  }
  // Other devices: clone the device's default generator (reached through the hooks, so this
  // compiles against CPU-only builds too) and reseed the copy; the global one is untouched.
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  return gen;
}

torch::Tensor randn(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options) {
  return torch::randn(shape, gen, options);
}

torch::Tensor rand(at::IntArrayRef shape, at::Generator& gen, const torch::TensorOptions& options) {
  return torch::rand(shape, gen, options);
}

}  // namespace nmcmc
