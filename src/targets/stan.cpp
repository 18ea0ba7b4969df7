// A Stan program as a target (Note [Stan programs], targets/stan.hpp).
#include "nmcmc/targets/stan.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/finite_hvp.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/stan_abi.h"

namespace nmcmc {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// A loaded model library: its handle and the C interface's functions. Never unloaded (RTLD_NODELETE):
/// Stan's thread-local autodiff tapes live in it until their threads end.
class StanLibrary {
 public:
  explicit StanLibrary(const std::string& path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle_) throw DataError(fmt::format("stan: cannot load the compiled model {}: {}", path, dlerror()));
    bind(abi_version, "nmcmc_stan_abi_version");
    if (abi_version() != NMCMC_STAN_ABI_VERSION) {
      throw DataError(fmt::format("stan: {} was built for interface version {}, this nmcmc needs {}: build it again",
                                  path, abi_version(), NMCMC_STAN_ABI_VERSION));
    }
    bind(stan_version, "nmcmc_stan_version");
    bind(create, "nmcmc_stan_new");
    bind(destroy, "nmcmc_stan_free");
    bind(free_error, "nmcmc_stan_free_error");
    bind(model_name, "nmcmc_stan_name");
    bind(dims, "nmcmc_stan_dims");
    bind(names, "nmcmc_stan_names");
    bind(log_density, "nmcmc_stan_log_density");
    bind(constrain, "nmcmc_stan_constrain");
    bind(unconstrain, "nmcmc_stan_unconstrain");
  }
  /// The message of a failed call, freed.
  std::string take_error(char* error) const {
    std::string s = error ? error : "(no message)";
    if (error) free_error(error);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  decltype(&nmcmc_stan_abi_version) abi_version = nullptr;
  decltype(&nmcmc_stan_version) stan_version = nullptr;
  decltype(&nmcmc_stan_new) create = nullptr;
  decltype(&nmcmc_stan_free) destroy = nullptr;
  decltype(&nmcmc_stan_free_error) free_error = nullptr;
  decltype(&nmcmc_stan_name) model_name = nullptr;
  decltype(&nmcmc_stan_dims) dims = nullptr;
  decltype(&nmcmc_stan_names) names = nullptr;
  decltype(&nmcmc_stan_log_density) log_density = nullptr;
  decltype(&nmcmc_stan_constrain) constrain = nullptr;
  decltype(&nmcmc_stan_unconstrain) unconstrain = nullptr;

 private:
  template <typename F>
  void bind(F& f, const char* symbol) {
    f = reinterpret_cast<F>(dlsym(handle_, symbol));
    if (!f) throw DataError(fmt::format("stan: {} is not a model built by nmcmc (no {})", path_, symbol));
  }
  std::string path_;
  void* handle_ = nullptr;
};

namespace {
std::mutex g_builder_mutex;
StanBuilder g_builder;

std::vector<std::string> split_names(const char* joined) {
  std::vector<std::string> out;
  std::string s = joined ? joined : "", item;
  if (s.empty()) return out;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("stan: cannot read the {} file {}", what, path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string absolute(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}
}  // namespace

void set_stan_builder(StanBuilder builder) {
  std::lock_guard<std::mutex> lock(g_builder_mutex);
  g_builder = std::move(builder);
}

bool have_stan_builder() {
  std::lock_guard<std::mutex> lock(g_builder_mutex);
  return static_cast<bool>(g_builder);
}

StanTarget::StanTarget(const std::string& library, const std::string& data_json, unsigned seed, json spec,
                       torch::TensorOptions options)
    : Target(options), lib_(std::make_shared<StanLibrary>(library)), spec_(std::move(spec)) {
  char* error = nullptr;
  model_ = lib_->create(data_json.c_str(), seed, &error);
  if (!model_) {
    const std::string where = spec_.value("data", std::string());
    throw DataError(fmt::format("stan: {}{}: {}", spec_.value("program", library),
                                where.empty() ? std::string(" (no data)") : " with data " + where, lib_->take_error(error)));
  }
  threads_ = spec_.value("threads", int64_t{0});
  if (threads_ <= 0) threads_ = std::max<int64_t>(1, std::thread::hardware_concurrency());
  auto* m = static_cast<nmcmc_stan_model*>(model_);
  int unc = 0;
  lib_->dims(m, &unc, nullptr, nullptr, nullptr);
  dim_ = unc;
  unconstrained_names_ = split_names(lib_->names(m, 1, 0, 0));
  if (dim_ == 0) {
    lib_->destroy(m);
    model_ = nullptr;
    throw UsageError(fmt::format("stan: {} has no parameters: there is nothing to sample", spec_.value("program", library)));
  }
}

StanTarget::~StanTarget() {
  if (model_) lib_->destroy(static_cast<nmcmc_stan_model*>(model_));
}

std::string StanTarget::model_name() const { return lib_->model_name(static_cast<const nmcmc_stan_model*>(model_)); }

std::vector<std::string> StanTarget::constrained_names(bool transformed, bool generated) const {
  return split_names(lib_->names(static_cast<const nmcmc_stan_model*>(model_), 0, transformed, generated));
}

void StanTarget::evaluate(const torch::Tensor& x, torch::Tensor* lp, torch::Tensor* grad, bool jacobian, bool propto,
                          std::string* first_failure) const {
  const torch::Tensor x64 = x.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t n = x64.size(0), d = dim_;
  *lp = torch::empty({n}, torch::kFloat64);
  if (grad) *grad = torch::empty({n, d}, torch::kFloat64);
  const double* xs = x64.data_ptr<double>();
  double* lps = lp->data_ptr<double>();
  double* gs = grad ? grad->data_ptr<double>() : nullptr;
  const auto* m = static_cast<const nmcmc_stan_model*>(model_);
  std::mutex failure_mutex;
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      char* error = nullptr;
      if (lib_->log_density(m, propto, jacobian, xs + i * d, lps + i, gs ? gs + i * d : nullptr, &error) != 0) {
        const std::string why = lib_->take_error(error);
        lps[i] = NAN;
        if (gs) std::fill(gs + i * d, gs + (i + 1) * d, NAN);
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (first_failure && first_failure->empty()) *first_failure = why;
      }
    }
  };
  // Note [Stan rows in threads]: each row is independent and computed the same way wherever it
  // runs, so the split changes no bit of the result. A batch is split over up to `threads_`
  // threads (the calling one and LibTorch's inter-op pool: persistent threads, each with its own
  // autodiff tape) when the time that saves, n x row x (1 - 1/workers), exceeds what a split adds
  // to a call: waking the pool's threads and joining them. Both are measured on the calls
  // themselves (moving averages: a row's cost on calls that ran in one thread, the split's on calls
  // that did), the first call not counted (a cold start), and every 64th call does the other thing
  // so that neither estimate goes stale. On a 2-vCPU virtual machine (AMD EPYC, Zen 3) a split
  // added 100-150 us: posteriordb's blr at 4 rows took 36 us in one thread and 144 us split, nes at
  // 4 rows 943 us and 648 us (calls timed with the spec's "threads" 1 and 0; a fixed 30 us
  // threshold split both, and NUTS on blr sampled 2.2x slower than in one thread).
  const auto start = std::chrono::steady_clock::now();
  const int64_t workers = std::min<int64_t>(threads_, n);
  const int64_t call = ++calls_;
  const double row = row_seconds_.load();
  const double saves = static_cast<double>(n) * row * (1.0 - 1.0 / static_cast<double>(std::max<int64_t>(workers, 1)));
  const bool wanted = row > 0 && saves > split_seconds_.load();
  const bool split = workers > 1 && (call % 64 == 0 ? !wanted : wanted);
  if (!split) {
    rows(0, n);
  } else {
    ++split_calls_;
    std::mutex done_mutex;
    std::condition_variable done;
    int64_t pending = workers - 1;
    const int64_t chunk = (n + workers - 1) / workers;
    for (int64_t w = 1; w < workers; ++w) {
      at::launch([&, w] {
        rows(std::min(n, w * chunk), std::min(n, (w + 1) * chunk));
        std::lock_guard<std::mutex> lock(done_mutex);
        if (--pending == 0) done.notify_one();
      });
    }
    rows(0, std::min(n, chunk));
    std::unique_lock<std::mutex> lock(done_mutex);
    done.wait(lock, [&] { return pending == 0; });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (call == 1 || n == 0) return;  // a cold start says little of the calls to come
  if (!split) {
    const double per_row = seconds / static_cast<double>(n);
    row_seconds_.store(row > 0 ? 0.9 * row + 0.1 * per_row : per_row);
  } else if (row > 0) {
    const double added = std::max(0.0, seconds - static_cast<double>(n) * row / static_cast<double>(workers));
    split_seconds_.store(0.9 * split_seconds_.load() + 0.1 * added);
  }
}

torch::Tensor StanTarget::log_density(const torch::Tensor& x, bool jacobian, bool propto) const {
  torch::Tensor lp;
  std::string failure;
  evaluate(x, &lp, nullptr, jacobian, propto, &failure);
  return lp;
}

EnergyGrad StanTarget::plain_energy_and_grad(const torch::Tensor& x) const {
  torch::Tensor lp, grad;
  std::string failure;
  evaluate(x, &lp, &grad, /*jacobian=*/true, /*propto=*/true, &failure);
  // Note [A density may fail]: Target re-evaluates row by row and rejects the rows that raise.
  if (!failure.empty()) throw std::runtime_error("stan: " + failure);
  return {(-lp).to(options_.dtype()).to(x.device()), (-grad).to(options_.dtype()).to(x.device())};
}

torch::Tensor StanTarget::compute_energy(const torch::Tensor& x) const {
  if (x.requires_grad() && torch::GradMode::is_enabled()) return compute_energy_and_grad(x, true).energy;
  torch::Tensor lp;
  std::string failure;
  evaluate(x, &lp, nullptr, true, true, &failure);
  if (!failure.empty()) throw std::runtime_error("stan: " + failure);
  return (-lp).to(options_.dtype()).to(x.device());
}

/// U and grad U as one autograd node: backward takes H v by central differences of Stan's
/// gradients (Note [Native second derivatives]).
struct StanEnergyNode : torch::autograd::Function<StanEnergyNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                int64_t self) {
    const auto* t = reinterpret_cast<const StanTarget*>(self);
    EnergyGrad eg = t->plain_energy_and_grad(x);
    ctx->save_for_backward({x, eg.grad});
    ctx->saved_data["target"] = self;
    return {eg.energy, eg.grad};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list upstream) {
    const auto* t = reinterpret_cast<const StanTarget*>(ctx->saved_data["target"].toInt());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach(), g = saved[1].detach();
    torch::Tensor x_bar = torch::zeros(x.sizes(), x.options().dtype(torch::kFloat64));
    if (upstream[0].defined()) x_bar += upstream[0].to(torch::kFloat64).unsqueeze(1) * g.to(torch::kFloat64);
    if (upstream[1].defined()) {
      const auto energy_grad = [t](const torch::Tensor& points) {
        torch::Tensor lp, grad;
        std::string failure;
        t->evaluate(points, &lp, &grad, true, true, &failure);  // failing rows are NaN: their H v is NaN
        return std::make_pair(-lp, -grad);
      };
      x_bar += central_difference_hvp(energy_grad, x, upstream[1]);
    }
    return {x_bar.to(x.scalar_type()), torch::Tensor()};
  }
};

EnergyGrad StanTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  if (!create_graph || !x.requires_grad() || !torch::GradMode::is_enabled()) return plain_energy_and_grad(x);
  auto out = StanEnergyNode::apply(x, reinterpret_cast<int64_t>(this));
  return {out[0], out[1]};
}

torch::Tensor StanTarget::constrain(const torch::Tensor& x, bool transformed, bool generated, uint64_t seed,
                                    int64_t first_row, int64_t* failures, std::string* first_failure) const {
  const torch::Tensor x64 = x.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const auto* m = static_cast<const nmcmc_stan_model*>(model_);
  int p = 0, ptp = 0, all = 0;
  lib_->dims(m, nullptr, &p, &ptp, &all);
  const int64_t k = transformed ? (generated ? all : ptp) : (generated ? all - ptp + p : p);
  const int64_t n = x64.size(0), d = dim_;
  torch::Tensor out = torch::empty({n, k}, torch::kFloat64);
  const double* xs = x64.data_ptr<double>();
  double* os = out.data_ptr<double>();
  int64_t failed = 0;
  for (int64_t i = 0; i < n; ++i) {
    char* error = nullptr;
    const uint64_t row_seed = stream_seed(seed, first_row + i + 1);  // the draw's own stream
    if (lib_->constrain(m, transformed, generated, xs + i * d, row_seed, os + i * k, &error) != 0) {
      const std::string why = lib_->take_error(error);
      std::fill(os + i * k, os + (i + 1) * k, NAN);
      if (failed++ == 0 && first_failure && first_failure->empty()) *first_failure = why;
    }
  }
  if (failures) *failures += failed;
  return out;
}

std::function<torch::Tensor(const torch::Tensor&, int64_t)> StanTarget::draw_mapper(
    uint64_t seed, std::shared_ptr<std::pair<int64_t, std::string>> failures) const {
  return [this, seed, failures](const torch::Tensor& x, int64_t first_draw) {
    const int64_t n = x.size(0), c = x.size(1);
    return constrain(x.reshape({n * c, x.size(2)}), true, true, seed, first_draw * c, &failures->first, &failures->second)
        .reshape({n, c, -1});
  };
}

torch::Tensor StanTarget::unconstrain(const torch::Tensor& constrained) const {
  const torch::Tensor c = constrained.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const auto* m = static_cast<const nmcmc_stan_model*>(model_);
  int p = 0;
  lib_->dims(m, nullptr, &p, nullptr, nullptr);
  TORCH_CHECK(c.dim() == 2 && c.size(1) == p, "stan: unconstrain expects [N, ", p, "], got ", c.sizes());
  const int64_t n = c.size(0);
  torch::Tensor out = torch::empty({n, dim_}, torch::kFloat64);
  for (int64_t i = 0; i < n; ++i) {
    char* error = nullptr;
    if (lib_->unconstrain(m, c.data_ptr<double>() + i * p, out.data_ptr<double>() + i * dim_, &error) != 0) {
      throw DataError("stan: unconstrain: " + lib_->take_error(error));
    }
  }
  return out;
}

std::unique_ptr<Target> make_stan_target(const json& spec, torch::TensorOptions options) {
  const auto text = [&](const char* key) -> std::string {
    if (!spec.contains(key)) return "";
    if (!spec[key].is_string() || spec[key].get<std::string>().empty()) {
      throw UsageError(fmt::format("stan: '{}' must be a file name", key));
    }
    return spec[key].get<std::string>();
  };
  json resolved = spec;
  std::string program = text("program"), library = text("library"), data = text("data");
  if (spec.contains("threads") && (!spec["threads"].is_number_integer() || spec["threads"].get<int64_t>() < 0)) {
    throw UsageError("stan: 'threads' must be a non-negative integer (0: one per core)");
  }
  if (program.empty() && library.empty()) throw UsageError("stan: give the program (--stan model.stan)");
  unsigned seed = 0;
  if (spec.contains("seed")) {
    if (!spec["seed"].is_number_integer() || spec["seed"].get<int64_t>() < 0) {
      throw UsageError("stan: 'seed' must be a non-negative integer");
    }
    seed = static_cast<unsigned>(spec["seed"].get<int64_t>());
  }
  if (!program.empty()) {
    program = absolute(program);
    resolved["program"] = program;
    if (!fs::exists(program)) throw UsageError("stan: no such program file: " + program);
    StanBuilder builder;
    {
      std::lock_guard<std::mutex> lock(g_builder_mutex);
      builder = g_builder;
    }
    if (builder) {
      library = builder(program);
    } else if (library.empty()) {
      throw UsageError("stan: this program cannot compile Stan programs (no builder registered): give the built \"library\"");
    }
  }
  library = absolute(library);
  resolved["library"] = library;
  std::string data_text;
  if (!data.empty()) {
    data = absolute(data);
    resolved["data"] = data;
    data_text = read_text(data, "data");
  }
  return std::make_unique<StanTarget>(library, data_text, seed, resolved, options);
}

}  // namespace nmcmc
