#include "nmcmc/core/tensor_options.hpp"

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

torch::TensorOptions parse_tensor_options(const std::string& dtype, const std::string& device) {
  torch::ScalarType st;
  if (dtype == "float32") st = torch::kFloat32;
  else if (dtype == "float64") st = torch::kFloat64;
  else throw UsageError("dtype must be float32 or float64, got '" + dtype + "'");
  torch::Device dev(torch::kCPU);
  try {
    dev = torch::Device(device);
  } catch (const std::exception&) {
    throw UsageError("device must be cpu, cuda or cuda:N, got '" + device + "'");
  }
  if (dev.is_cuda() && !torch::cuda::is_available()) {
    throw UsageError("device " + device + ": this LibTorch build or machine has no CUDA device");
  }
  return torch::TensorOptions().dtype(st).device(dev);
}

}  // namespace nmcmc
