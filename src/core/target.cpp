#include "nmcmc/core/target.hpp"

#include <new>
#include <sstream>

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

namespace {
/// Runs `f`; an exception that is the density's own failure (anything but nmcmc's usage, data and
/// I/O errors and running out of memory) is handed to `failed` with its message.
template <typename F, typename G>
auto or_on_failure(F&& f, G&& failed) -> decltype(f()) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const DataError&) {
    throw;
  } catch (const IoError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const c10::Error& e) {
    return failed(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return failed(e.what());
  }
}
}  // namespace

void Target::note_failure(const std::string& message) {
  ++n_failed_;
  if (!first_failure_.empty()) return;
  // TorchScript's messages carry a traceback; the line that says what was raised is the one to keep.
  std::string keep, line;
  std::istringstream in(message);
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (keep.empty() || line.find("Error") != std::string::npos || line.find("Exception") != std::string::npos) keep = line;
  }
  const size_t start = keep.find_first_not_of(" \t");
  first_failure_ = keep.empty() ? "(no message)" : keep.substr(start, 500);
}

torch::Tensor Target::energy(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim(), name(), ": expected x of shape [C, ", dim(), "], got ",
              x.sizes());
  ++n_energy_;
  return or_on_failure([&] { return compute_energy(x); },
                       [&](const std::string&) {
                         // Note [A density may fail]: row by row, the rows that fail are NaN.
                         std::vector<torch::Tensor> rows;
                         for (int64_t i = 0; i < x.size(0); ++i) {
                           const torch::Tensor xi = x.narrow(0, i, 1);
                           rows.push_back(or_on_failure([&] { return compute_energy(xi); },
                                                        [&](const std::string& why) {
                                                          note_failure(why);
                                                          return torch::full({1}, NAN, options_.device(x.device()));
                                                        }));
                         }
                         return torch::cat(rows);
                       });
}

EnergyGrad Target::energy_and_grad(const torch::Tensor& x, bool create_graph) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim(), name(), ": expected x of shape [C, ", dim(), "], got ",
              x.sizes());
  ++n_energy_;
  ++n_grad_;
  return or_on_failure([&] { return compute_energy_and_grad(x, create_graph); },
                       [&](const std::string&) {
                         // Note [A density may fail]: row by row, the rows that fail are NaN.
                         std::vector<torch::Tensor> energies, grads;
                         for (int64_t i = 0; i < x.size(0); ++i) {
                           const torch::Tensor xi = x.narrow(0, i, 1);
                           EnergyGrad eg = or_on_failure([&] { return compute_energy_and_grad(xi, create_graph); },
                                                         [&](const std::string& why) {
                                                           note_failure(why);
                                                           const auto o = options_.device(x.device());
                                                           return EnergyGrad{torch::full({1}, NAN, o),
                                                                             torch::full({1, dim()}, NAN, o)};
                                                         });
                           energies.push_back(eg.energy.reshape({1}));
                           grads.push_back(eg.grad.reshape({1, dim()}));
                         }
                         return EnergyGrad{torch::cat(energies), torch::cat(grads)};
                       });
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
