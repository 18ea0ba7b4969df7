#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/targets/torchscript.hpp"

#ifndef NMCMC_SOURCE_DATA_DIR
#define NMCMC_SOURCE_DATA_DIR ""
#endif
#ifndef NMCMC_INSTALL_DATA_DIR
#define NMCMC_INSTALL_DATA_DIR ""
#endif

namespace nmcmc {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string data_directory() {
  if (const char* env = std::getenv("NMCMC_DATA_DIR"); env && *env) return env;
  for (const char* dir : {NMCMC_SOURCE_DATA_DIR, NMCMC_INSTALL_DATA_DIR}) {
    if (*dir && fs::exists(fs::path(dir) / "uci")) return dir;
  }
  return "data";
}

namespace {

int64_t get_int(const json& spec, const char* key, int64_t fallback, int64_t min_value) {
  if (!spec.contains(key)) return fallback;
  const json& v = spec[key];
  if (!v.is_number_integer() && !(v.is_number() && std::floor(v.get<double>()) == v.get<double>())) {
    throw UsageError(std::string("target option '") + key + "' must be an integer");
  }
  int64_t value = v.get<int64_t>();
  if (value < min_value) {
    throw UsageError(std::string("target option '") + key + "' must be at least " + std::to_string(min_value));
  }
  return value;
}

double get_positive(const json& spec, const char* key, double fallback) {
  if (!spec.contains(key)) return fallback;
  if (!spec[key].is_number()) throw UsageError(std::string("target option '") + key + "' must be a number");
  double value = spec[key].get<double>();
  if (!(value > 0) || !std::isfinite(value)) throw UsageError(std::string("target option '") + key + "' must be positive and finite, got " + spec[key].dump());
  return value;
}

std::optional<Moments> load_reference(const std::string& dataset, int64_t dim) {
  fs::path file = fs::path(data_directory()) / "reference" / (dataset + ".json");
  std::ifstream in(file);
  if (!in) return std::nullopt;
  json j;
  try {
    in >> j;
    auto mean = j.at("mean").get<std::vector<double>>();
    auto sd = j.at("sd").get<std::vector<double>>();
    if (static_cast<int64_t>(mean.size()) != dim || static_cast<int64_t>(sd.size()) != dim) {
      throw DataError("wrong dimension");
    }
    return Moments{torch::tensor(mean, torch::kFloat64), torch::tensor(sd, torch::kFloat64)};
  } catch (const std::exception& e) {
    throw DataError("malformed reference file '" + file.string() + "': " + e.what());
  }
}

std::unique_ptr<Target> make_logistic(const json& spec, torch::TensorOptions options) {
  json full = {{"name", "logistic"}};
  const double prior_sd = get_positive(spec, "prior_sd", 10.0);
  full["prior_sd"] = prior_sd;
  if (spec.contains("dataset") == spec.contains("file")) {
    throw UsageError("logistic: give exactly one of 'dataset' (german, australian, heart) or 'file'");
  }
  if (spec.contains("dataset")) {
    if (!spec["dataset"].is_string()) throw UsageError("logistic: 'dataset' must be a name");
    const std::string name = spec["dataset"].get<std::string>();
    static const std::map<std::string, std::string> files = {
        {"german", "german.data-numeric"}, {"australian", "australian.dat"}, {"heart", "heart.dat"}};
    auto it = files.find(name);
    if (it == files.end()) throw UsageError("logistic: unknown dataset '" + name + "' (german, australian, heart)");
    full["dataset"] = name;
    LabelledData data = load_labelled_table((fs::path(data_directory()) / "uci" / it->second).string(), -1);
    auto reference = prior_sd == 10.0 ? load_reference(name, data.features.size(1) + 1) : std::nullopt;
    return std::make_unique<LogisticTarget>(data, full, prior_sd, reference, options);
  }
  if (!spec["file"].is_string()) throw UsageError("logistic: 'file' must be a path");
  const int label_column = static_cast<int>(spec.contains("label_column") ? spec["label_column"].get<int64_t>() : -1);
  full["file"] = spec["file"];
  full["label_column"] = label_column;
  LabelledData data = load_labelled_table(spec["file"].get<std::string>(), label_column);
  return std::make_unique<LogisticTarget>(data, full, prior_sd, std::nullopt, options);
}



std::unique_ptr<Target> make_icg(const json& spec, torch::TensorOptions options) {
  int64_t d = get_int(spec, "dim", 50, 2);
  return std::make_unique<GaussianTarget>("icg", json{{"name", "icg"}, {"dim", d}},
                                          torch::logspace(-2, 2, d, 10.0, torch::kFloat64), torch::Tensor(),
                                          torch::Tensor(), options);
}

std::unique_ptr<Target> make_scg(const json&, torch::TensorOptions options) {
  const double pi = std::acos(-1.0);
  const double c = std::cos(pi / 4), s = std::sin(pi / 4);
  torch::Tensor rot = torch::tensor({c, s, -s, c}, torch::kFloat64).reshape({2, 2});
  return std::make_unique<GaussianTarget>("scg", json{{"name", "scg"}}, torch::tensor({100.0, 0.1}, torch::kFloat64), rot,
                                          torch::Tensor(), options);
}

std::unique_ptr<Target> make_rotated_icg(const json& spec, torch::TensorOptions options) {
  int64_t d = get_int(spec, "dim", 100, 2);
  int64_t seed = get_int(spec, "seed", 1, 0);
  at::Generator gen = make_generator(static_cast<uint64_t>(seed));
  torch::Tensor var = at::_standard_gamma(torch::full({d}, 0.5, torch::kFloat64), gen);  // Gamma(0.5, scale 1)
  var = torch::clamp_min(var, 1e-12);
  torch::Tensor g = torch::randn({d, d}, gen, torch::kFloat64);
  auto [q, r] = torch::linalg::qr(g);
  q = q * torch::sign(torch::diagonal(r)).unsqueeze(0);  // Haar-distributed rotation
  return std::make_unique<GaussianTarget>("rotated_icg", json{{"name", "rotated_icg"}, {"dim", d}, {"seed", seed}}, var,
                                          q, torch::Tensor(), options);
}

std::unique_ptr<Target> make_funnel(const json& spec, torch::TensorOptions options) {
  return std::make_unique<FunnelTarget>(get_int(spec, "dim", 20, 2), get_positive(spec, "sigma", 3.0), options);
}

std::unique_ptr<Target> make_moon(const json&, torch::TensorOptions options) { return std::make_unique<MoonTarget>(options); }

std::unique_ptr<Target> make_gaussian(const json& spec, torch::TensorOptions options) {
  torch::Tensor var;
  json full = {{"name", "gaussian"}};
  if (spec.contains("scales")) {
    std::vector<double> scales;
    try {
      scales = spec["scales"].get<std::vector<double>>();
    } catch (const std::exception&) {
      throw UsageError("gaussian: 'scales' must be a list of numbers");
    }
    if (scales.empty()) throw UsageError("gaussian: 'scales' is empty");
    for (double s : scales) {
      if (!(s > 0) || !std::isfinite(s)) throw UsageError("gaussian: scales must be positive");
    }
    if (spec.contains("dim") && get_int(spec, "dim", 0, 1) != static_cast<int64_t>(scales.size())) {
      throw UsageError("gaussian: 'dim' disagrees with the number of 'scales'");
    }
    var = torch::tensor(scales, torch::kFloat64).pow(2);
    full["scales"] = scales;
  } else {
    var = torch::ones({get_int(spec, "dim", 2, 1)}, torch::kFloat64);
  }
  full["dim"] = var.size(0);
  return std::make_unique<GaussianTarget>("gaussian", full, var, torch::Tensor(), torch::Tensor(), options);
}

std::vector<TargetInfo> builtin_infos() {
  return {
      {"icg", "ill-conditioned Gaussian: diagonal, variances log-spaced from 1e-2 to 1e2", {{"dim", "dimension (50)"}}},
      {"scg", "strongly correlated 2-d Gaussian: variances 1e2 and 1e-1 rotated by pi/4", {}},
      {"rotated_icg",
       "Gaussian with Gamma(0.5, 1) eigenvalues and a random rotation",
       {{"dim", "dimension (100)"}, {"seed", "seed of the eigenvalues and rotation (1)"}}},
      {"funnel",
       "Neal's funnel: x0 ~ N(0, sigma^2), x_i | x0 ~ N(0, exp(-x0)); Funnel-1 = (100, 1), Funnel-3 = (20, 3)",
       {{"dim", "dimension (20)"}, {"sigma", "sd of x0 (3)"}}},
      {"moon", "2-d banana: U = x0^2/2 + (x1 - x0^2 + 4)^2/2", {}},
      {"logistic",
       "Bayesian logistic regression, N(0, 10^2) prior, standardised features, intercept first",
       {{"dataset", "german | australian | heart (shipped in data/uci)"},
        {"file", "or a whitespace/comma-separated table of your own"},
        {"label_column", "label column of 'file', negative counts from the end (-1)"},
        {"prior_sd", "prior standard deviation (10)"}}},
      {"gaussian",
       "Gaussian with diagonal covariance: standard normal, or given scales",
       {{"dim", "dimension (2)"}, {"scales", "list of standard deviations (all 1)"}}},
      {"torchscript",
       "your density: a TorchScript module, forward(x [C, D]) -> U(x) [C] (see examples/torchscript)",
       {{"module", "file written by torch.jit.save (--module)"},
        {"dim", "dimension (the module's 'dim' attribute if it has one)"},
        {"output", "energy (U(x), default) | log_prob (log p(x)) (--module-output)"}}},
  };
}


/// The registry: built-ins first, then registered targets, in order.
struct Registry {
  std::mutex mutex;
  std::vector<std::pair<TargetInfo, TargetFactory>> entries;
  Registry() {
    const std::map<std::string, TargetFactory> factories = {
        {"icg", make_icg},     {"scg", make_scg},   {"rotated_icg", make_rotated_icg}, {"funnel", make_funnel},
        {"moon", make_moon},   {"logistic", make_logistic}, {"gaussian", make_gaussian},
        {"torchscript", make_torchscript_target}};
    for (auto& info : builtin_infos()) entries.emplace_back(info, factories.at(info.name));
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_target(TargetInfo info, TargetFactory factory) {
  if (info.name.empty()) throw UsageError("register_target: a target needs a name");
  if (!factory) throw UsageError("register_target: target '" + info.name + "' needs a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [existing, f] : r.entries) {
    if (existing.name == info.name) throw UsageError("register_target: a target named '" + info.name + "' exists already");
  }
  r.entries.emplace_back(std::move(info), std::move(factory));
}

std::vector<TargetInfo> target_catalogue() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<TargetInfo> out;
  for (const auto& [info, f] : r.entries) out.push_back(info);
  return out;
}

std::unique_ptr<Target> make_target(const json& spec, torch::TensorOptions options) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) {
    throw UsageError("a target spec needs a \"name\" (see `nmcmc targets`)");
  }
  const std::string name = spec["name"].get<std::string>();
  TargetInfo info;
  TargetFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = std::find_if(r.entries.begin(), r.entries.end(), [&](const auto& e) { return e.first.name == name; });
    if (it == r.entries.end()) throw UsageError("unknown target '" + name + "' (see `nmcmc targets`)");
    info = it->first;
    factory = it->second;
  }
  for (auto& [key, value] : spec.items()) {
    if (key == "name") continue;
    const bool known = std::any_of(info.options.begin(), info.options.end(), [&](const auto& o) { return o.first == key; });
    if (!known) throw UsageError("target '" + name + "' has no option '" + key + "' (see `nmcmc targets`)");
  }
  return factory(spec, options);
}

}  // namespace nmcmc
