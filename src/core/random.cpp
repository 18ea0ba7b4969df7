#include "nmcmc/core/random.hpp"

#include <ATen/CPUGeneratorImpl.h>

namespace nmcmc {

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
