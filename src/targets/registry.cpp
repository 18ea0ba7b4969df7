#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/setting.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/targets/stan.hpp"
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

namespace {
Setting& data_directory_setting() {
  static Setting s;
  return s;
}
}  // namespace

void set_data_directory(const std::string& directory) { data_directory_setting().set(directory); }

std::string data_directory() {
  if (std::string given = data_directory_setting().get_or(""); !given.empty()) return given;
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

// numpy's legacy RandomState stream (MT19937 seeded by init_genrand, 53-bit doubles, the polar Gaussian
// with its cached second value, and the legacy Gamma sampler for shape < 1), so that rotated_icg with
// seed 10 is, number for number, the target NeuTra and the authors use (their code draws it with
// np.random.RandomState(seed=10)). Checked against numpy's draws in tests/unit/test_targets.cpp.
class NumpyLegacyRandom {
 public:
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}
  double uniform() {
    const uint64_t a = mt_() >> 5, b = mt_() >> 6;
    return (static_cast<double>(a) * 67108864.0 + static_cast<double>(b)) / 9007199254740992.0;
  }
  double exponential() { return -std::log(1.0 - uniform()); }
  double gauss() {
    if (has_gauss_) {
      has_gauss_ = false;
      return gauss_;
    }
    double x1, x2, r2;
    do {
      x1 = 2.0 * uniform() - 1.0;
      x2 = 2.0 * uniform() - 1.0;
      r2 = x1 * x1 + x2 * x2;
    } while (r2 >= 1.0 || r2 == 0.0);
    const double f = std::sqrt(-2.0 * std::log(r2) / r2);
    gauss_ = f * x1;
    has_gauss_ = true;
    return f * x2;
  }
  double gamma_below_one(double shape) {  // 0 < shape < 1
    for (;;) {
      const double u = uniform(), v = exponential();
      if (u <= 1.0 - shape) {
        const double x = std::pow(u, 1.0 / shape);
        if (x <= v) return x;
      } else {
        const double y = -std::log((1.0 - u) / shape);
        const double x = std::pow(1.0 - shape + shape * y, 1.0 / shape);
        if (x <= v + y) return x;
      }
    }
  }

 private:
  std::mt19937 mt_;
  bool has_gauss_ = false;
  double gauss_ = 0.0;
};

// NeuTra's ill-conditioned Gaussian (Hoffman et al. 2019; the inference gym's IllConditionedGaussian; the
// authors' 'NDICG'): the eigenvalues of the *precision* are 100 Gamma(0.5, 1) draws (float32, sorted), i.e.
// the covariance's are inverse-Gamma, rotated by the Q of a QR decomposition of a standard-normal matrix.
// "eigenvalues": "covariance" puts the Gamma draws on the covariance instead.
std::unique_ptr<Target> make_rotated_icg(const json& spec, torch::TensorOptions options) {
  int64_t d = get_int(spec, "dim", 100, 2);
  int64_t seed = get_int(spec, "seed", 10, 0);
  if (seed > 4294967295LL) throw UsageError("rotated_icg: 'seed' must be below 2^32");
  std::string eig = "precision";
  if (spec.contains("eigenvalues")) {
    if (!spec["eigenvalues"].is_string()) throw UsageError("rotated_icg: 'eigenvalues' must be \"precision\" or \"covariance\"");
    eig = spec["eigenvalues"].get<std::string>();
    if (eig != "precision" && eig != "covariance") {
      throw UsageError("rotated_icg: 'eigenvalues' must be \"precision\" (Gamma(0.5, 1) precision eigenvalues, NeuTra's) or "
                       "\"covariance\" (Gamma(0.5, 1) covariance eigenvalues), not \"" + eig + "\"");
    }
  }
  NumpyLegacyRandom rng(static_cast<uint32_t>(seed));
  std::vector<double> g(static_cast<size_t>(d));
  for (auto& v : g) v = static_cast<double>(static_cast<float>(rng.gamma_below_one(0.5)));
  std::sort(g.begin(), g.end());
  if (g.front() <= 0.0) throw UsageError("rotated_icg: seed " + std::to_string(seed) + " draws a zero eigenvalue; pick another");
  std::vector<double> normal(static_cast<size_t>(d * d));
  for (auto& v : normal) v = rng.gauss();
  std::vector<double> var_values(g.size());
  for (size_t i = 0; i < g.size(); ++i) {  // like numpy: g**-1 of the float32 draws is computed in float32
    var_values[i] = eig == "precision" ? static_cast<double>(1.0f / static_cast<float>(g[i])) : g[i];
  }
  torch::Tensor var = torch::tensor(var_values, torch::kFloat64);
  torch::Tensor m = torch::tensor(normal, torch::kFloat64).reshape({d, d});
  auto [q, r] = torch::linalg_qr(m);
  q = q * torch::sign(torch::diagonal(r)).unsqueeze(0);  // Haar-distributed; q q^T-sums are sign-free anyway
  return std::make_unique<GaussianTarget>(
      "rotated_icg", json{{"name", "rotated_icg"}, {"dim", d}, {"seed", seed}, {"eigenvalues", eig}}, var, q,
      torch::Tensor(), options);
}

// A Gaussian with a few wide directions (the case a low-rank preconditioner is built for): covariance
// I + (spike_sd^2 - 1) V V^T for `spikes` random orthonormal directions V (the first columns of the Q
// of a QR decomposition of a standard-normal matrix drawn with `seed`).
std::unique_ptr<Target> make_spiked(const json& spec, torch::TensorOptions options) {
  const int64_t d = get_int(spec, "dim", 1200, 2);
  const int64_t k = get_int(spec, "spikes", 8, 1);
  const double spike_sd = get_positive(spec, "spike_sd", 30.0);
  const int64_t seed = get_int(spec, "seed", 0, 0);
  if (k >= d) throw UsageError("spiked: 'spikes' must be below 'dim' (" + std::to_string(k) + " >= " + std::to_string(d) + ")");
  at::Generator gen = make_generator(static_cast<uint64_t>(seed));
  auto [q, r] = torch::linalg_qr(randn({d, d}, gen, torch::TensorOptions().dtype(torch::kFloat64)));
  q = q * torch::sign(torch::diagonal(r)).unsqueeze(0);
  torch::Tensor var = torch::ones({d}, torch::kFloat64);
  var.narrow(0, 0, k).fill_(spike_sd * spike_sd);
  return std::make_unique<GaussianTarget>(
      "spiked", json{{"name", "spiked"}, {"dim", d}, {"spikes", k}, {"spike_sd", spike_sd}, {"seed", seed}}, var, q,
      torch::Tensor(), options);
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
      {"icg", "ill-conditioned Gaussian: diagonal, variances log-spaced from 1e-2 to 1e2", {{"dim", "dimension (50)"}}, {}},
      {"scg", "strongly correlated 2-d Gaussian: variances 1e2 and 1e-1 rotated by pi/4", {}, {}},
      {"rotated_icg",
       "NeuTra's ill-conditioned Gaussian: Gamma(0.5, 1) precision eigenvalues, random rotation",
       {{"dim", "dimension (100)"},
        {"seed", "numpy RandomState seed of the eigenvalues and rotation (10: NeuTra's target)"},
        {"eigenvalues", "precision (NeuTra's) or covariance: which matrix has the Gamma(0.5, 1) eigenvalues"}}, {}},
      {"spiked",
       "Gaussian with a few wide directions: covariance I + (spike_sd^2 - 1) V V^T, V random orthonormal",
       {{"dim", "dimension (1200)"},
        {"spikes", "number of wide directions (8)"},
        {"spike_sd", "their standard deviation (30)"},
        {"seed", "seed of the directions (0)"}}, {}},
      {"funnel",
       "Neal's funnel: x0 ~ N(0, sigma^2), x_i | x0 ~ N(0, exp(-x0)); Funnel-1 = (100, 1), Funnel-3 = (20, 3)",
       {{"dim", "dimension (20)"}, {"sigma", "sd of x0 (3)"}}, {}},
      {"moon", "2-d banana: U = x0^2/2 + (x1 - x0^2 + 4)^2/2", {}, {}},
      {"logistic",
       "Bayesian logistic regression, N(0, 10^2) prior, standardised features, intercept first",
       {{"dataset", "german | australian | heart (shipped in data/uci)"},
        {"file", "or a whitespace/comma-separated table of your own"},
        {"label_column", "label column of 'file', negative counts from the end (-1)"},
        {"prior_sd", "prior standard deviation (10)"}}, {}},
      {"gaussian",
       "Gaussian with diagonal covariance: standard normal, or given scales",
       {{"dim", "dimension (2)"}, {"scales", "list of standard deviations (all 1)"}}, {}},
      {"torchscript",
       "your density: a TorchScript module, forward(x [C, D]) -> U(x) [C] (see examples/torchscript)",
       {{"module", "file written by torch.jit.save (--module)"},
        {"dim", "dimension (the module's 'dim' attribute if it has one)"},
        {"output", "energy (U(x), default) | log_prob (log p(x)) (--module-output)"},
        {"engine", "auto (default: nmcmc's own evaluator where the module allows, else LibTorch) | native | libtorch "
                   "(--module-engine)"}},
       {"module"}},
      {"stan",
       "your Stan program (docs/stan.md): compiled by Stan's compiler, sampled on Stan's unconstrained scale",
       {{"program", "the .stan file (--stan)"},
        {"data", "its data as CmdStan's JSON (--data)"},
        {"library", "the model built from it (filled in when nmcmc builds the program)"},
        {"seed", "seed of the transformed data block's random numbers (0)"},
        {"threads", "threads a batch's rows may use (0: one per core)"}},
       {"program", "data", "library"}},
  };
}


/// The registry: built-ins first, then registered targets, in order.
struct Registry {
  std::mutex mutex;
  std::vector<std::pair<TargetInfo, TargetFactory>> entries;
  Registry() {
    const std::map<std::string, TargetFactory> factories = {
        {"icg", make_icg},     {"scg", make_scg},   {"rotated_icg", make_rotated_icg}, {"spiked", make_spiked}, {"funnel", make_funnel},
        {"moon", make_moon},   {"logistic", make_logistic}, {"gaussian", make_gaussian},
        {"torchscript", make_torchscript_target}, {"stan", make_stan_target}};
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

void resolve_target_paths(json& spec, const std::string& base_dir) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) return;
  const std::string name = spec["name"].get<std::string>();
  std::vector<std::string> keys;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = std::find_if(r.entries.begin(), r.entries.end(), [&](const auto& e) { return e.first.name == name; });
    if (it == r.entries.end()) return;
    keys = it->first.path_options;
  }
  for (const std::string& key : keys) {
    if (!spec.contains(key) || !spec[key].is_string()) continue;
    const std::string file = spec[key].get<std::string>();
    if (file.rfind("memory:", 0) == 0 || !fs::path(file).is_relative()) continue;  // memory: a module held in memory
    spec[key] = (fs::path(base_dir) / file).lexically_normal().string();
  }
}

json density_of(json spec) {
  if (!spec.is_object()) return spec;
  const std::string name = spec.value("name", std::string());
  if (name == "torchscript") spec.erase("module");
  if (name == "stan" && spec.contains("program")) {
    spec.erase("library");
    spec.erase("threads");
  }
  return spec;
}

void set_target_engine(json& spec, Engine engine, bool replace) {
  if (!spec.is_object() || spec.value("name", std::string()) != "torchscript") return;
  const std::string name = enum_name(engine);
  if (!replace && spec.contains("engine") && spec["engine"] != name) {
    throw UsageError("--engine " + name + " and the target's \"engine\": " + spec["engine"].dump() + " differ");
  }
  spec["engine"] = name;
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
