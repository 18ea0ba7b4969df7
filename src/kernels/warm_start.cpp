// Note [Warm starts] (kernels/warm_start.hpp).
#include "nmcmc/kernels/warm_start.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {

json rows_of(const torch::Tensor& m) {  // [R, D] -> [[...], ...]
  const torch::Tensor c = m.to(torch::kFloat64).contiguous();
  json rows = json::array();
  for (int64_t i = 0; i < c.size(0); ++i) {
    const double* p = c[i].data_ptr<double>();
    rows.push_back(std::vector<double>(p, p + c.size(1)));
  }
  return rows;
}

torch::Tensor tensor_of(const json& j, const std::string& what, const std::string& where) {
  try {
    if (j.is_array() && !j.empty() && j.front().is_array()) {
      const int64_t r = static_cast<int64_t>(j.size()), d = static_cast<int64_t>(j.front().size());
      torch::Tensor t = torch::empty({r, d}, torch::kFloat64);
      for (int64_t i = 0; i < r; ++i) {
        const auto row = j[i].get<std::vector<double>>();
        if (static_cast<int64_t>(row.size()) != d) throw UsageError(where + ": " + what + " has rows of different lengths");
        t[i] = torch::tensor(row, torch::kFloat64);
      }
      return t;
    }
    return torch::tensor(j.get<std::vector<double>>(), torch::kFloat64);
  } catch (const json::exception&) {
    throw UsageError(where + ": " + what + " is not a list of numbers");
  }
}

}  // namespace

json WarmStart::record(const SampleResult& r, const std::vector<std::string>& names, const std::string& sampler) {
  if (!r.draws.defined() || r.draws.size(0) == 0 || !(r.step_size > 0)) return nullptr;
  const int64_t d = r.draws.size(2);
  json j = {{"sampler", sampler},
            {"step_size", r.step_size},
            {"names", names},
            {"positions", rows_of(r.draws.select(0, r.draws.size(0) - 1))}};
  if (r.inv_mass.defined()) {
    torch::Tensor m = r.inv_mass.to(torch::kFloat64);
    if (m.dim() == 2 && d > kWarmStartDenseMaxDim) {
      m = m.diagonal().clone();
      j["metric_note"] = fmt::format("the diagonal of a {} metric (dense metrics are kept up to D = {})", r.metric,
                                     kWarmStartDenseMaxDim);
    }
    j["metric"] = m.dim() == 2 ? "dense" : "diag";
    j["inv_mass"] = m.dim() == 2 ? rows_of(m) : json(std::vector<double>(m.data_ptr<double>(), m.data_ptr<double>() + d));
  } else {
    j["metric"] = "unit";
  }
  return j;
}

WarmStart WarmStart::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw UsageError(where + ": no warm start recorded (a completed run of nuts, hmc or mala records one)");
  for (const char* key : {"step_size", "positions", "names"}) {
    if (!j.contains(key)) throw UsageError(fmt::format("{}: the warm start has no \"{}\"", where, key));
  }
  WarmStart w;
  w.sampler = j.value("sampler", "");
  if (!j["step_size"].is_number() || !(j["step_size"].get<double>() > 0) || !std::isfinite(j["step_size"].get<double>())) {
    throw UsageError(where + ": the warm start's step size is not a positive number");
  }
  w.step_size = j["step_size"].get<double>();
  w.positions = tensor_of(j["positions"], "positions", where);
  if (w.positions.dim() != 2) throw UsageError(where + ": the warm start's positions are not a [chains, D] list");
  try {
    w.names = j["names"].get<std::vector<std::string>>();
  } catch (const json::exception&) {
    throw UsageError(where + ": the warm start's names are not a list of strings");
  }
  const int64_t d = w.positions.size(1);
  if (static_cast<int64_t>(w.names.size()) != d) {
    throw UsageError(fmt::format("{}: the warm start has {} names for {} parameters", where, w.names.size(), d));
  }
  if (j.contains("inv_mass") && !j["inv_mass"].is_null()) {
    w.inv_mass = tensor_of(j["inv_mass"], "inv_mass", where);
    const bool ok = (w.inv_mass.dim() == 1 && w.inv_mass.size(0) == d) ||
                    (w.inv_mass.dim() == 2 && w.inv_mass.size(0) == d && w.inv_mass.size(1) == d);
    if (!ok) throw UsageError(fmt::format("{}: the warm start's metric is not [{}] or [{}, {}]", where, d, d, d));
  }
  if (!torch::isfinite(w.positions).all().item<bool>() ||
      (w.inv_mass.defined() && !torch::isfinite(w.inv_mass).all().item<bool>())) {
    throw UsageError(where + ": the warm start holds non-finite numbers");
  }
  return w;
}

WarmStart WarmStart::read(const json& record_or_path) {
  if (!record_or_path.is_string()) return from_json(record_or_path, "warm start");
  namespace fs = std::filesystem;
  fs::path p = record_or_path.get<std::string>();
  if (fs::is_directory(p)) p /= "summary.json";
  std::ifstream in(p);
  if (!in) throw UsageError("warm start: cannot read " + p.string() + " (give a run's output directory or its summary.json)");
  json summary;
  try {
    summary = json::parse(in);
  } catch (const json::exception& e) {
    throw UsageError("warm start: " + p.string() + " is not JSON (" + e.what() + ")");
  }
  if (!summary.is_object() || !summary.contains("adaptation")) {
    throw UsageError("warm start: " + p.string() + " records no adaptation (a completed run of nuts, hmc or mala "
                     "without a transport records one)");
  }
  return from_json(summary["adaptation"], p.string());
}

torch::Tensor WarmStart::apply(Tunable& kernel, const torch::TensorOptions& options, bool dense, bool step) const {
  torch::Tensor m = inv_mass;
  if (m.defined() && m.dim() == 2 && !(dense && kernel.has_dense_metric())) m = m.diagonal().clone();
  if (m.defined()) kernel.set_inv_mass(m.to(options));
  if (step) kernel.set_step_size(step_size);
  return m;
}

void WarmStart::check_model(const Target& target, const std::string& where) const {
  if (dim() != target.dim()) {
    throw UsageError(fmt::format("{}: the warm start is for a model with {} parameters, this target has {}", where, dim(),
                                 target.dim()));
  }
  const std::vector<std::string> labels = parameter_labels(target);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != names[i]) {
      throw UsageError(fmt::format("{}: the warm start is for another model: its parameter {} is '{}', this target's '{}'",
                                   where, i + 1, names[i], labels[i]));
    }
  }
}

}  // namespace nmcmc
