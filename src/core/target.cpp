#include "nmcmc/core/target.hpp"

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

torch::Tensor Target::energy(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim(), name(), ": expected x of shape [C, ", dim(), "], got ",
              x.sizes());
  ++n_energy_;
  return compute_energy(x);
}

EnergyGrad Target::energy_and_grad(const torch::Tensor& x, bool create_graph) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim(), name(), ": expected x of shape [C, ", dim(), "], got ",
              x.sizes());
  ++n_energy_;
  ++n_grad_;
  return compute_energy_and_grad(x, create_graph);
}

std::vector<std::string> parameter_labels(const Target& target) {
  std::vector<std::string> names = target.parameter_names();
  if (static_cast<int64_t>(names.size()) == target.dim()) return names;
  names.clear();
  for (int64_t k = 0; k < target.dim(); ++k) names.push_back("x." + std::to_string(k + 1));
  return names;
}

torch::Tensor Target::sample(int64_t, at::Generator&) const {
  throw UsageError("target '" + name() + "' has no exact sampler");
}

EnergyGrad Target::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  return autograd_energy_and_grad([this](const torch::Tensor& y) { return compute_energy(y); }, x, create_graph);
}

EnergyGrad autograd_energy_and_grad(const std::function<torch::Tensor(const torch::Tensor&)>& energy,
                                    const torch::Tensor& x, bool create_graph) {
  torch::AutoGradMode enable(true);
  // A point that is already part of a graph (training) keeps its history so that the
  // gradient stays differentiable with respect to whatever produced it.
  torch::Tensor xr = (create_graph && x.requires_grad()) ? x : x.detach().requires_grad_(true);
  torch::Tensor u = energy(xr);
  torch::Tensor g = torch::autograd::grad({u.sum()}, {xr}, {}, /*retain_graph=*/create_graph,
                                          /*create_graph=*/create_graph)[0];
  if (!create_graph) return {u.detach(), g.detach()};
  return {u, g};
}

}  // namespace nmcmc
