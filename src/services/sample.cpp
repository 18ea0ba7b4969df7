#include "nmcmc/services/sample.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <unistd.h>
#include <fcntl.h>
#include <limits>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/stan_csv.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::shared_ptr<Proposal> make_baseline_proposal(const ProposalOptions& o) {
  if (o.step_size && !(*o.step_size > 0 && std::isfinite(*o.step_size))) {
    throw UsageError("--step-size must be positive and finite");
  }
  const double eps = o.step_size.value_or(0.0);  // 0: found by find_reasonable_step_size at the start of the run
  if (o.sampler == "rwm") return std::make_shared<RandomWalk>(eps);
  if (o.sampler == "mala") return std::make_shared<Mala>(eps);
  if (o.sampler == "hmc") {
    if (o.leapfrog < 1) throw UsageError("--leapfrog must be at least 1");
    auto hmc = std::make_shared<Hmc>(eps, o.leapfrog);
    if (!(o.jitter >= 0 && o.jitter < 1)) throw UsageError("--jitter must be in [0, 1)");
    hmc->set_jitter(o.jitter);
    return hmc;
  }
  throw UsageError("unknown sampler '" + o.sampler + "' (rwm, mala, hmc, nuts, learned)");
}

std::unique_ptr<Kernel> make_baseline_kernel(const ProposalOptions& o) {
  if (o.sampler != "nuts") return std::make_unique<MetropolisHastings>(make_baseline_proposal(o));
  if (o.step_size && !(*o.step_size > 0 && std::isfinite(*o.step_size))) {
    throw UsageError("--step-size must be positive and finite");
  }
  if (o.max_depth < 1 || o.max_depth > 30) throw UsageError("--max-depth must be in [1, 30]");
  return std::make_unique<Nuts>(NutsOptions().set_step_size(o.step_size.value_or(0.0)).set_max_depth(o.max_depth));
}

double default_target_accept(const std::string& sampler) {
  if (sampler == "rwm") return 0.234;
  if (sampler == "mala") return 0.574;
  return 0.8;
}

LearnedRun load_learned_run(const std::string& model_path, const std::optional<json>& target_spec,
                            torch::TensorOptions options, bool dtype_given,
                            const std::optional<std::string>& matmul) {
  if (matmul) check_matmul_option(*matmul);
  auto [sampler, meta] = load_model(model_path);
  if (matmul) sampler->set_matmul(*matmul);
  const json trained_on = meta.at("target");
  if (target_spec) {
    auto probe = make_target(*target_spec, options);
    // A TorchScript density is the module's content, not its location: a module saved elsewhere
    // (or passed in memory from Python) is accepted when the rest of the spec (dim, output) agrees.
    auto comparable = [](json s) {
      if (s.value("name", "") == "torchscript") s.erase("module");
      return s;
    };
    if (comparable(probe->spec()) != comparable(trained_on)) {
      throw UsageError("model '" + model_path + "' was trained on target " + trained_on.dump() + ", not " +
                       probe->spec().dump());
    }
  }
  if (!dtype_given) options = options.dtype(meta.value("dtype", "float32") == "float64" ? torch::kFloat64 : torch::kFloat32);
  sampler->to(options.device(), options.dtype().toScalarType());
  sampler->eval();
  return {std::make_shared<LearnedProposal>(sampler), trained_on, meta, options};
}

torch::Tensor initial_positions(Target& target, const std::string& scheme, int64_t chains, at::Generator& gen) {
  const auto& opts = target.options();
  if (scheme == "uniform") return rand({chains, target.dim()}, gen, opts) * 4.0 - 2.0;
  if (scheme == "zero") return torch::zeros({chains, target.dim()}, opts);
  if (scheme == "exact") {
    if (!target.has_sampler()) throw UsageError("--init exact: target '" + target.name() + "' has no exact sampler");
    return target.sample(chains, gen);
  }
  throw UsageError("unknown --init '" + scheme + "' (uniform, exact, zero)");
}

torch::Tensor finite_starting_points(Target& target, torch::Tensor x0, const std::string& scheme, at::Generator& gen) {
  // Stan's rule: a random initial point whose log density or gradient is not finite is drawn
  // again, up to 100 times; a given point is never replaced.
  auto bad_rows = [&](const torch::Tensor& x) {
    EnergyGrad eg = target.energy_and_grad(x);
    return torch::logical_not(torch::isfinite(eg.energy) & torch::isfinite(eg.grad).all(1));
  };
  torch::Tensor bad = bad_rows(x0);
  const bool random = scheme == "uniform" || scheme == "exact";
  for (int attempt = 0; attempt < 100 && random && bad.any().item<bool>(); ++attempt) {
    torch::Tensor fresh = initial_positions(target, scheme, x0.size(0), gen);
    x0 = torch::where(bad.unsqueeze(1), fresh, x0);
    bad = bad_rows(x0);
  }
  if (bad.any().item<bool>()) {
    const int64_t chain = bad.nonzero()[0][0].item<int64_t>();
    throw UsageError(fmt::format(
        "the target's energy or gradient is not finite at the starting point of chain {}{}: give starting points "
        "inside the support (init_x, or --init zero|exact where they apply)",
        chain + 1, random ? " after 100 random draws (" + scheme + ")" : ""));
  }
  return x0;
}

double find_reasonable_step_size(Target& target, Kernel& kernel, const ChainState& state, at::Generator& gen,
                                 double start) {
  Kernel& prop = kernel;
  double eps = start > 0 ? start : 1.0;
  auto mean_accept = [&](double e) {
    prop.set_step_size(e);
    return kernel.probe_accept(target, state, gen).mean().item<double>();
  };
  double a = mean_accept(eps);
  const int direction = a > 0.5 ? 1 : -1;
  for (int i = 0; i < 60; ++i) {
    const double next = direction > 0 ? eps * 2.0 : eps * 0.5;
    const double an = mean_accept(next);
    if ((direction > 0 && an < 0.5) || (direction < 0 && an > 0.5)) {
      eps = direction > 0 ? eps : next;
      break;
    }
    eps = next;
    if (eps > 1e7 || eps < 1e-10) break;
  }
  prop.set_step_size(eps);
  return eps;
}

namespace {
constexpr double kStateCopiesPerChain = 32;  // [C, D] tensors a kernel keeps alive (NUTS's trees: ~20)
constexpr double kStatBytesPerDraw = 48;     // lp, accept, divergent, n_grad, tree depth, energy per chain

/// A float64 tensor backed by a scratch file that is unlinked at once: the kernel pages it out
/// as needed and frees the space when the tensor goes.
torch::Tensor disk_backed_tensor(torch::IntArrayRef shape, const std::string& directory) {
  fs::path dir = directory.empty() ? fs::temp_directory_path() : fs::path(directory);
  std::string pattern = (dir / "nmcmc-draws-XXXXXX").string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw IoError("cannot create a scratch file for the draws in '" + dir.string() + "'");
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  const bool sized = ::ftruncate(fd, static_cast<off_t>(numel * 8)) == 0;
  ::close(fd);
  if (!sized) {
    fs::remove(name.data());
    throw IoError("cannot size the scratch file for the draws in '" + dir.string() + "'");
  }
  torch::Tensor t = at::from_file(name.data(), /*shared=*/true, numel, torch::TensorOptions().dtype(torch::kFloat64));
  fs::remove(name.data());  // the mapping keeps the data; nothing is left behind
  return t.view(shape);
}

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  return std::numeric_limits<double>::infinity();
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(int64_t{1} << 30)); }
}  // namespace

RunFootprint estimate_footprint(const RunOptions& o, int64_t dim, int64_t dtype_bytes) {
  const double c = static_cast<double>(o.chains), s = static_cast<double>(o.draws), d = static_cast<double>(dim);
  RunFootprint f;
  f.memory_bytes = kStateCopiesPerChain * c * d * static_cast<double>(dtype_bytes) + kStatBytesPerDraw * s * c;
  const double draws = o.keep_draws ? s * c * d * 8.0 : 0.0;
  if (draws > static_cast<double>(o.draws_in_memory_limit) && o.draws_in_memory_limit > 0) f.disk_bytes = draws;
  else f.memory_bytes += draws;
  return f;
}

void check_footprint(const RunOptions& o, int64_t dim, int64_t dtype_bytes) {
  const RunFootprint f = estimate_footprint(o, dim, dtype_bytes);
  const double mem = available_memory_bytes();
  if (f.memory_bytes > mem) {
    throw UsageError(fmt::format(
        "this run needs about {} of memory ({} chains x {} dimensions of sampler state, {} draws of statistics per "
        "chain) but {} is available: use fewer chains or draws",
        gib(f.memory_bytes), o.chains, dim, o.draws, gib(mem)));
  }
  if (f.disk_bytes > 0) {
    std::error_code ec;
    const fs::path dir = o.scratch_directory.empty() ? fs::temp_directory_path() : fs::path(o.scratch_directory);
    const auto space = fs::space(dir, ec);
    if (!ec && static_cast<double>(space.available) < f.disk_bytes) {
      throw UsageError(fmt::format("the draws need {} of scratch disk in '{}' but {} is free: use fewer draws or chains",
                                   gib(f.disk_bytes), dir.string(), gib(static_cast<double>(space.available))));
    }
  }
}

SampleResult run_sampler(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed,
                         const ProgressFn& progress) {
  if (o.chains < 1) throw UsageError("--chains must be at least 1");
  if (o.warmup < 0) throw UsageError("--warmup must be non-negative");
  if (o.draws < 1) throw UsageError("--draws must be at least 1");
  if (!(o.target_accept > 0 && o.target_accept < 1)) throw UsageError("--target-accept must be in (0, 1)");
  check_footprint(o, target.dim(), static_cast<int64_t>(c10::elementSize(target.options().dtype().toScalarType())));
  torch::NoGradGuard no_grad;
  const auto device = target.options().device();
  at::Generator gen = make_generator(seed, device);
  Kernel& prop = kernel;
  SampleResult res;
  res.seed = seed;
  res.names = parameter_labels(target);
  res.draws_planned = o.draws;
  auto stop = [&] { return o.should_stop && o.should_stop(); };

  torch::Tensor x0;
  if (o.init_x.defined()) {
    TORCH_CHECK(o.init_x.dim() == 2 && o.init_x.size(1) == target.dim() && o.init_x.size(0) > 0,
                "init_x must be [n, ", target.dim(), "]");
    x0 = o.init_x.to(target.options()).index_select(
        0, torch::arange(o.chains, torch::TensorOptions().dtype(torch::kInt64).device(o.init_x.device())) % o.init_x.size(0));
  } else {
    x0 = initial_positions(target, o.init, o.chains, gen);
  }
  x0 = finite_starting_points(target, x0, o.init_x.defined() ? "" : o.init, gen);
  ChainState state = kernel.init(target, x0);
  const int64_t g_start = target.grad_evals(), e_start = target.energy_evals();
  auto t0 = Clock::now();
  auto last_report = t0;
  auto report = [&](const char* phase, int64_t i, int64_t total, const torch::Tensor& acc_sum, int64_t n, bool force) {
    if (!progress) return;
    auto now = Clock::now();
    if (!force && std::chrono::duration<double>(now - last_report).count() < 0.25) return;
    last_report = now;
    Progress p;
    p.phase = phase;
    p.iteration = i;
    p.total = total;
    p.accept = n > 0 ? acc_sum.item<double>() / static_cast<double>(n * o.chains) : 0.0;
    p.step_size = prop.step_size();
    p.elapsed = std::chrono::duration<double>(now - t0).count();
    progress(p);
  };

  // ---- warm-up: dual averaging of the step size, optional windowed diagonal metric ----
  const bool tunable = prop.has_tunable_step_size();
  if (o.adapt_step.value_or(false) && !tunable) {
    throw UsageError("sampler '" + prop.name() + "' has no tunable step size: run it without step-size adaptation");
  }
  if (o.adapt_mass && !prop.has_metric()) throw UsageError("sampler '" + prop.name() + "' has no mass matrix to adapt");
  if (o.adapt_mass && o.dense_mass && !prop.has_dense_metric()) {
    throw UsageError("sampler '" + prop.name() + "' has no dense metric");
  }
  const bool tune = o.adapt_step.value_or(tunable) && o.warmup > 0;
  if (tune || (tunable && prop.step_size() <= 0)) {
    find_reasonable_step_size(target, kernel, state, gen, prop.step_size() > 0 ? prop.step_size() : 1.0);
  }
  DualAveraging da(prop.step_size(), o.target_accept);
  WarmupSchedule schedule(o.warmup);
  VarianceEstimator variance;
  CovarianceEstimator covariance;
  torch::Tensor acc_sum = torch::zeros({}, state.energy.options());
  torch::Tensor warmup_grads_chain;  // [C] when the kernel reports per-chain counts
  for (int64_t i = 0; i < o.warmup; ++i) {
    if (stop()) {  // nothing drawn yet: nothing to keep
      res.complete = false;
      return res;
    }
    auto [next, info] = kernel.step(target, state, gen);
    state = std::move(next);
    acc_sum += info.accept_prob.sum();
    if (info.n_grad_chain.defined()) {
      warmup_grads_chain = warmup_grads_chain.defined() ? warmup_grads_chain + info.n_grad_chain : info.n_grad_chain.clone();
    }
    if (tune) prop.set_step_size(da.update(info.accept_prob.mean().item<double>()));
    if (o.adapt_mass && schedule.in_slow_window(i)) {
      if (o.dense_mass) covariance.add(state.x);
      else variance.add(state.x);
    }
    const int64_t collected = o.dense_mass ? covariance.count() : variance.count();
    if (o.adapt_mass && schedule.ends_window(i) && collected > 1) {
      torch::Tensor inv_mass =
          (o.dense_mass ? covariance.regularised_covariance() : variance.regularised_variance()).to(target.options());
      prop.set_inv_mass(inv_mass);
      res.inv_mass = inv_mass.to(torch::kCPU, torch::kFloat64);
      variance.reset();
      covariance.reset();
      if (tune) da.restart(find_reasonable_step_size(target, kernel, state, gen, prop.step_size()));
    }
    report("warmup", i + 1, o.warmup, acc_sum, i + 1, i + 1 == o.warmup);
  }
  if (tune) prop.set_step_size(da.final_step());
  res.step_size = prop.step_size();
  auto t1 = Clock::now();
  res.seconds_warmup = std::chrono::duration<double>(t1 - t0).count();
  res.grads_warmup = target.grad_evals() - g_start;
  res.energies_warmup = target.energy_evals() - e_start;
  if (warmup_grads_chain.defined()) {
    res.grads_warmup = std::llround(warmup_grads_chain.to(torch::kFloat64).mean().item<double>());
  }
  res.max_tree_depth = kernel.max_tree_depth();

  // ---- sampling: the kernel is frozen ----
  const int64_t s_count = o.draws, c = o.chains, d = target.dim();
  if (o.keep_draws) {
    const double bytes = 8.0 * static_cast<double>(s_count) * static_cast<double>(c) * static_cast<double>(d);
    // On disk the layout is parameter-major ([D, S, C] seen as [S, C, D]): a step writes D short
    // runs, and the summary's blocks of parameters read contiguous stretches of the file instead
    // of every page of it once per block.
    res.draws = o.draws_in_memory_limit > 0 && bytes > static_cast<double>(o.draws_in_memory_limit)
                    ? disk_backed_tensor({d, s_count, c}, o.scratch_directory).permute({1, 2, 0})
                    : torch::empty({s_count, c, d}, torch::kFloat64);
  }
  res.lp = torch::empty({s_count, c}, torch::kFloat64);
  res.accept_stat = torch::empty({s_count, c}, torch::kFloat64);
  res.divergent = torch::empty({s_count, c}, torch::kBool);
  res.n_grad = torch::empty({s_count}, torch::kInt64);
  auto n_grad = res.n_grad.accessor<int64_t, 1>();
  const int64_t g_mid = target.grad_evals(), e_mid = target.energy_evals();
  acc_sum.zero_();
  t0 = Clock::now();
  int64_t done = 0, flushed = 0;
  auto last_flush = Clock::now();
  if (o.sink && !o.keep_draws) throw UsageError("a draw sink needs keep_draws");
  for (int64_t i = 0; i < s_count; ++i) {
    if (stop()) break;
    if (o.sink && done > flushed && std::chrono::duration<double>(Clock::now() - last_flush).count() >= 2.0) {
      o.sink->append(res, flushed, done);  // rows as they are drawn, about every 2 s
      flushed = done;
      last_flush = Clock::now();
    }
    auto [next, info] = kernel.step(target, state, gen);
    state = std::move(next);
    done = i + 1;
    if (o.keep_draws) res.draws[i].copy_(state.x);
    res.lp[i].copy_(-state.energy);
    res.accept_stat[i].copy_(info.accept_prob);
    res.divergent[i].copy_(info.divergent);
    n_grad[i] = info.n_grad;
    if (info.n_grad_chain.defined()) {
      if (i == 0) {
        res.n_grad_chain = torch::empty({s_count, c}, torch::kInt64);
        res.tree_depth = torch::empty({s_count, c}, torch::kInt64);
        res.energy = torch::empty({s_count, c}, torch::kFloat64);
      }
      res.n_grad_chain[i].copy_(info.n_grad_chain);
      if (info.tree_depth.defined()) res.tree_depth[i].copy_(info.tree_depth);
      if (info.energy.defined()) res.energy[i].copy_(info.energy);
    }
    acc_sum += info.accept_prob.sum();
    report("sampling", i + 1, s_count, acc_sum, i + 1, i + 1 == s_count);
  }
  if (done < s_count) {  // stopped: keep what was drawn
    res.complete = false;
    for (torch::Tensor* t : {&res.draws, &res.lp, &res.accept_stat, &res.divergent, &res.n_grad, &res.n_grad_chain,
                             &res.tree_depth, &res.energy}) {
      if (t->defined()) *t = t->narrow(0, 0, done);
    }
  }
  res.seconds_sampling = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.sink && done > flushed) o.sink->append(res, flushed, done);
  res.grads_sampling = target.grad_evals() - g_mid;
  res.energies_sampling = target.energy_evals() - e_mid;
  if (res.n_grad_chain.defined()) {
    // Each chain's own count (the target's counter sees the batch, i.e. the busiest chain).
    res.grads_sampling = std::llround(res.n_grad_chain.to(torch::kFloat64).sum(0).mean().item<double>());
  }
  if (o.sink) o.sink->finish(res);
  return res;
}

namespace {
/// Parameters per block so that one block of draws [S, C, k] and the summaries' temporaries
/// (about 8 copies) stay near 256 MiB: the summary of disk-backed draws reads them in blocks.
int64_t parameter_block(const torch::Tensor& draws, int64_t block_bytes) {
  const double per_parameter = 8.0 * 8.0 * static_cast<double>(draws.size(0)) * static_cast<double>(draws.size(1));
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(block_bytes) / per_parameter));
}

StanSummary blocked_stan_summary(const torch::Tensor& draws, int64_t block_bytes, const ProgressFn& progress) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  if (block >= d) return stan_summary(draws);
  std::vector<StanSummary> parts;
  const auto t0 = std::chrono::steady_clock::now();
  SummaryWorkspace workspace;  // one set of buffers for all blocks
  for (int64_t k = 0; k < d; k += block) {
    parts.push_back(stan_summary(draws.narrow(2, k, std::min(block, d - k)), &workspace));
    if (progress) {
      Progress p;
      p.phase = "summary";
      p.iteration = std::min(d, k + block);
      p.total = d;
      p.elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(p);
    }
  }
  auto cat = [&](torch::Tensor StanSummary::*field) {
    std::vector<torch::Tensor> v;
    for (auto& p : parts) v.push_back(p.*field);
    return torch::cat(v);
  };
  StanSummary st;
  for (auto field : {&StanSummary::mean, &StanSummary::sd, &StanSummary::mcse_mean, &StanSummary::ess_bulk,
                     &StanSummary::ess_tail, &StanSummary::rhat, &StanSummary::q05, &StanSummary::q50, &StanSummary::q95}) {
    st.*field = cat(field);
  }
  return st;
}

double blocked_msjd(const torch::Tensor& draws, int64_t block_bytes) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  double total = 0;  // |x' - x|^2 sums over parameters, so blocks add up
  for (int64_t k = 0; k < d; k += block) total += mean_squared_jump(draws.narrow(2, k, std::min(block, d - k)));
  return total;
}

torch::Tensor blocked_paper_ess(const torch::Tensor& draws, const Moments& m, int64_t block_bytes) {
  const int64_t d = draws.size(2), block = parameter_block(draws, block_bytes);
  std::vector<torch::Tensor> v;
  for (int64_t k = 0; k < d; k += block) {
    const int64_t n = std::min(block, d - k);
    v.push_back(paper_ess_ratio(draws.narrow(2, k, n), m.mean.narrow(0, k, n), m.sd.narrow(0, k, n)));
  }
  return torch::cat(v);
}

double finite_min(const torch::Tensor& t) {
  torch::Tensor f = t.masked_select(torch::isfinite(t));
  return f.numel() ? f.min().item<double>() : std::nan("");
}
}  // namespace

json summarise(const SampleResult& r, Target& target, int64_t block_bytes, const ProgressFn& progress) {
  TORCH_CHECK(r.draws.defined(), "summarise needs the draws (keep_draws)");
  if (r.draws.size(0) == 0) throw UsageError("no draws to summarise (the run stopped before its first draw)");
  const int64_t s = r.draws.size(0), c = r.draws.size(1), d = r.draws.size(2);
  const double steps = static_cast<double>(s * c);
  // Per chain and step; for NUTS the exact mean over chains of each chain's own count.
  const double grads_per_step = r.n_grad_chain.defined() ? r.n_grad_chain.to(torch::kFloat64).mean().item<double>()
                                                         : static_cast<double>(r.grads_sampling) / static_cast<double>(s);
  StanSummary st = blocked_stan_summary(r.draws, block_bytes, progress);
  json j;
  j["target"] = target.spec();
  j["chains"] = c;
  j["draws"] = s;
  j["dim"] = d;
  j["seed"] = r.seed;
  j["complete"] = r.complete;
  j["draws_planned"] = r.draws_planned;
  j["step_size"] = r.step_size;
  j["accept_rate"] = r.accept_stat.mean().item<double>();
  j["divergences"] = r.divergent.sum().item<int64_t>();
  j["grads_per_step"] = grads_per_step;
  j["energies_per_step"] = static_cast<double>(r.energies_sampling) / static_cast<double>(s);
  j["grads_warmup_per_chain"] = r.grads_warmup;
  j["seconds_warmup"] = r.seconds_warmup;
  j["seconds_sampling"] = r.seconds_sampling;
  j["msjd"] = blocked_msjd(r.draws, block_bytes);
  if (r.tree_depth.defined()) {
    j["max_tree_depth"] = r.max_tree_depth;
    j["tree_depth_hits"] = (r.tree_depth >= r.max_tree_depth).sum().item<int64_t>();
    j["mean_tree_depth"] = r.tree_depth.to(torch::kFloat64).mean().item<double>();
  }
  if (r.n_grad_chain.defined()) {
    // Batched gradient evaluations per step: the busiest chain's count, which the lockstep batch
    // pays in time; grads_per_step / this is the batch's gradient utilisation.
    j["batch_grads_per_step"] = r.n_grad.to(torch::kFloat64).mean().item<double>();
  }
  json params = json::array();
  const std::vector<std::string> names = parameter_labels(target);
  for (int64_t k = 0; k < d; ++k) {
    params.push_back({{"name", names[k]},
                      {"mean", st.mean[k].item<double>()},
                      {"sd", st.sd[k].item<double>()},
                      {"mcse_mean", st.mcse_mean[k].item<double>()},
                      {"q05", st.q05[k].item<double>()},
                      {"q50", st.q50[k].item<double>()},
                      {"q95", st.q95[k].item<double>()},
                      {"ess_bulk", st.ess_bulk[k].item<double>()},
                      {"ess_tail", st.ess_tail[k].item<double>()},
                      {"rhat", st.rhat[k].item<double>()}});
  }
  j["parameters"] = params;
  const double min_bulk = finite_min(st.ess_bulk), min_tail = finite_min(st.ess_tail);
  j["min_ess_bulk"] = min_bulk;
  j["min_ess_tail"] = min_tail;
  j["max_rhat"] = st.rhat.masked_select(torch::isfinite(st.rhat)).numel() ? st.rhat.nan_to_num(0).max().item<double>() : std::nan("");
  j["ess_bulk_per_step"] = min_bulk / steps;
  j["ess_bulk_per_grad"] = grads_per_step > 0 ? min_bulk / (steps * grads_per_step) : std::nan("");
  j["ess_bulk_per_second"] = min_bulk / r.seconds_sampling;
  if (auto m = target.reference_moments(); m && s >= 2) {  // (ESS needs two draws)
    torch::Tensor ratio = blocked_paper_ess(r.draws, *m, block_bytes);  // ESS / S per dimension
    json p;
    p["convention"] = "L2HMC/A-NICE-MC: known moments, cutoff 0.05, averaged over chains";
    p["ess_per_step_min"] = ratio.min().item<double>();
    p["ess_per_step_mean"] = ratio.mean().item<double>();
    p["ess_per_step_x1"] = ratio[0].item<double>();
    if (d > 1) p["ess_per_step_rest_min"] = ratio.narrow(0, 1, d - 1).min().item<double>();
    if (grads_per_step > 0) {
      p["ess_per_grad_min"] = ratio.min().item<double>() / grads_per_step;
      p["ess_per_grad_x1"] = ratio[0].item<double>() / grads_per_step;
      if (d > 1) p["ess_per_grad_rest_min"] = ratio.narrow(0, 1, d - 1).min().item<double>() / grads_per_step;
    }
    const double seconds_per_step = r.seconds_sampling / static_cast<double>(s);
    p["ess_per_second_min"] = ratio.min().item<double>() * static_cast<double>(c) / seconds_per_step;
    p["per_dim"] = std::vector<double>(ratio.data_ptr<double>(), ratio.data_ptr<double>() + d);
    j["paper_ess"] = p;
  }
  return j;
}

std::string format_summary(const json& j, int64_t rows) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  const auto& params = j.at("parameters");
  const int64_t d = static_cast<int64_t>(params.size());
  line(fmt::format("{:>10} {:>11} {:>10} {:>9} {:>9} {:>9} {:>7}", "param", "mean", "sd", "mcse", "ess_bulk", "ess_tail",
                   "rhat"));
  auto row = [&](const json& p) {
    line(fmt::format("{:>10} {:>11.4g} {:>10.4g} {:>9.3g} {:>9.0f} {:>9.0f} {:>7.3f}", p["name"].get<std::string>(),
                     p["mean"].get<double>(), p["sd"].get<double>(), p["mcse_mean"].get<double>(),
                     p["ess_bulk"].get<double>(), p["ess_tail"].get<double>(), p["rhat"].get<double>()));
  };
  std::vector<int64_t> order(d);
  for (int64_t k = 0; k < d; ++k) order[k] = k;
  if (d <= 2 * rows) {
    for (auto& p : params) row(p);
  } else {
    for (int64_t k = 0; k < rows; ++k) row(params[k]);
    line(fmt::format("{:>10}", "..."));
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return params[a]["ess_bulk"].get<double>() < params[b]["ess_bulk"].get<double>();
    });
    line(fmt::format("worst {} by bulk ESS:", rows));
    for (int64_t k = 0; k < rows; ++k) row(params[order[k]]);
  }
  const double steps = j["draws"].get<double>() * j["chains"].get<double>();
  line("");
  line(fmt::format("chains {}  draws/chain {}  accept {:.3f}  step size {:.4g}  divergences {}  grads/step {:.1f}",
                   j["chains"].get<int64_t>(), j["draws"].get<int64_t>(), j["accept_rate"].get<double>(),
                   j["step_size"].get<double>(), j["divergences"].get<int64_t>(), j["grads_per_step"].get<double>()));
  line(fmt::format("min bulk-ESS {:.0f} of {:.0f} draws ({:.4f}/MH step, {:.4g}/grad, {:.1f}/s)  min tail-ESS {:.0f}  max R-hat {:.3f}",
                   j["min_ess_bulk"].get<double>(), steps, j["ess_bulk_per_step"].get<double>(),
                   j["ess_bulk_per_grad"].is_number() ? j["ess_bulk_per_grad"].get<double>() : std::nan(""),
                   j["ess_bulk_per_second"].get<double>(), j["min_ess_tail"].get<double>(), j["max_rhat"].get<double>()));
  if (j.contains("paper_ess")) {
    const auto& p = j["paper_ess"];
    std::string s = fmt::format("paper ESS (true moments): min {:.4f}/MH step", p["ess_per_step_min"].get<double>());
    if (p.contains("ess_per_grad_min")) s += fmt::format(", {:.4g}/grad", p["ess_per_grad_min"].get<double>());
    const std::string first = params.empty() ? "x.1" : params[0]["name"].get<std::string>();
    s += fmt::format("; {} {:.4f}/step", first, p["ess_per_step_x1"].get<double>());
    if (p.contains("ess_per_step_rest_min")) s += fmt::format("; the others min {:.4f}/step", p["ess_per_step_rest_min"].get<double>());
    line(s);
  }
  if (j.contains("tree_depth_hits")) {
    line(fmt::format("NUTS: mean tree depth {:.2f}, {} of {} transitions hit the maximum depth {}", j["mean_tree_depth"].get<double>(),
                     j["tree_depth_hits"].get<int64_t>(), static_cast<int64_t>(steps), j["max_tree_depth"].get<int64_t>()));
  }
  line(fmt::format("time: warm-up {:.2f} s, sampling {:.2f} s;  mean squared jump {:.4g}", j["seconds_warmup"].get<double>(),
                   j["seconds_sampling"].get<double>(), j["msjd"].get<double>()));
  return out;
}

}  // namespace nmcmc
