#include "nmcmc/kernels/run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <fcntl.h>
#include <unistd.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "run_in_phases.hpp"
#include "starting_points.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
// Note [Chains that run off]: on an improper density (flat, or growing along some direction) every
// move is accepted, warm-up doubles the step size again and again and the chains run off until their
// metric overflows and the draws become NaN. A proper target's adapted step size is about its
// scale in the metric's units (O(1) once a metric is adapted; the target's own scale otherwise),
// so a step size past 1e12 means the run met no curvature: it stops and says so, rather than write
// draws that mean nothing (a user whose parameters truly have scales of 1e12 rescales them).
constexpr double kRunawayStepSize = 1e12;
constexpr double kStateCopiesPerChain = 32;  // [C, D] tensors a kernel keeps alive (NUTS: its trees' buffers, ~20)
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

namespace {
/// dst[i] = src (or -src), the sampling loop's per-draw copy of a [C] or [C, D] value into its
/// [S, C] or [S, C, D] record: a plain loop where both are on the CPU, dst's rows are contiguous
/// and the types are float32/float64 into float64 or the same type (a draw is 64 x 50 numbers, a
/// tensor op costs microseconds: the ops were as much as NUTS's leaves on a cheap target), else
/// the tensor ops.
void put_row(const torch::Tensor& dst, int64_t i, const torch::Tensor& src, bool negate = false) {
  const int64_t n = src.numel();
  const bool fast = dst.device().is_cpu() && src.device().is_cpu() && dst.is_contiguous() && src.is_contiguous() &&
                    dst.numel() / std::max<int64_t>(dst.size(0), 1) == n;
  if (fast && dst.scalar_type() == torch::kFloat64 &&
      (src.scalar_type() == torch::kFloat64 || src.scalar_type() == torch::kFloat32)) {
    double* out = dst.data_ptr<double>() + i * n;
    const double sign = negate ? -1.0 : 1.0;
    if (src.scalar_type() == torch::kFloat64) {
      const double* in = src.data_ptr<double>();
      for (int64_t j = 0; j < n; ++j) out[j] = sign * in[j];
    } else {
      const float* in = src.data_ptr<float>();
      for (int64_t j = 0; j < n; ++j) out[j] = sign * static_cast<double>(in[j]);
    }
    return;
  }
  if (fast && !negate && dst.scalar_type() == src.scalar_type()) {
    std::memcpy(static_cast<char*>(dst.data_ptr()) + i * n * static_cast<int64_t>(dst.element_size()), src.data_ptr(),
                static_cast<size_t>(n) * dst.element_size());
    return;
  }
  dst[i].copy_(negate ? -src : src);
}

// Note [Stuck chains in warm-up]
// The chains share one step size (pooled adaptation). A chain whose random starting point lies
// where the density is so steep that every transition at that step size diverges never moves,
// and it spoils the metric's estimate for all (on posteriordb's kidiq regression, 3 of 16
// uniform(-2, 2) starts stayed put through the whole warm-up and the pooled step size fell to
// 0.008). Stan adapts each chain's step size on its own; here, until the first slow window
// (the metric's estimate) begins, every 25 iterations a chain whose mean accept statistic over
// them was below 0.001 (it could not move) while the median chain's was above 0.1 restarts from
// the current position of a moving chain drawn at random, and the step-size search starts
// dual averaging again from there (the stuck chains had pulled the pooled step size down).
// (A fresh random point does not do: at the step size the moving chains have adapted to, such
// a point is stuck too. Starting points that no step size can move are drawn again before
// warm-up: Note [Starting points that cannot move].) Warm-up draws are discarded, so this
// changes no draw's distribution; the price is that a restarted chain begins its remaining
// warm-up (at least the slow and final windows) where another chain was, which weakens what
// R-hat can tell about modes that chain never found. Given starting points are never replaced.
//
// Sampling time: the rows written while sampling goes on (about every 2 s) are not sampling time.
// Without taking them off, a run longer than 2 s paid for writing its first rows and a shorter one
// paid for none (the last rows are written after the clock stops), which made NUTS on Funnel-1
// look 1.4x slower per gradient against HMC than it is.

/// The run of this process's chains (all of them on one process): the starting state, the
/// warm-up (step size, metric windows, stuck chains), then sampling with the kernel frozen.
class LocalRun {
 public:
  LocalRun(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed, const ProgressFn& progress)
      : target_(target), kernel_(kernel), o_(o), seed_(seed), progress_(progress), device_(checked_device(o, target)),
        gen_(make_generator(seed, device_)) {
    res_.seed = seed;
    res_.names = parameter_labels(target);
    res_.draws_planned = o.draws;
  }

  SampleResult run() {
    torch::NoGradGuard no_grad;
    start();
    check_adaptation();
    if (!warm_up()) return std::move(res_);
    sample();
    return std::move(res_);
  }

 private:
  /// The options checked (before anything is drawn); the target's device.
  static torch::Device checked_device(const RunOptions& o, const Target& target) {
    if (o.chains < 1) throw UsageError("--chains must be at least 1");
    if (o.warmup < 0) throw UsageError("--warmup must be non-negative");
    if (o.draws < 1) throw UsageError("--draws must be at least 1");
    if (!(o.target_accept > 0 && o.target_accept < 1)) throw UsageError("--target-accept must be in (0, 1)");
    check_footprint(o, target.dim(), static_cast<int64_t>(c10::elementSize(target.options().dtype().toScalarType())));
    return target.options().device();
  }

  bool stop() const { return o_.should_stop && o_.should_stop(); }

  /// A step's state to the caller's record, where it keeps one (Note [Warm-up in phases]).
  void keep_step(const ChainState& s) {
    if (!o_.steps) return;
    if (!s.grad.defined()) {
      throw UsageError("a change of variables fitted during warm-up (a flow transport) is fitted from gradients, "
                       "which sampler '" + kernel_.name() + "' does not compute (use nuts, hmc or mala)");
    }
    o_.steps->x.push_back(s.x.detach().to(torch::kCPU, torch::kFloat64));
    o_.steps->grad.push_back(s.grad.detach().to(torch::kCPU, torch::kFloat64));
  }

  /// Gradient calls outside the kernel's steps (screening, starting states, step-size searches):
  /// NUTS reports its steps' gradients per chain, these are added to them.
  template <class F>
  void outside_steps(F&& f) {
    const int64_t before = target_.grad_evals();
    f();
    calls_outside_steps_ += target_.grad_evals() - before;
  }

  /// Progress; accept(): the phase's mean accept statistic so far, computed only when a report is made.
  void report(const char* phase, int64_t i, int64_t total, const std::function<double()>& accept, bool force) {
    if (!progress_) return;
    auto now = Clock::now();
    if (!force && std::chrono::duration<double>(now - last_report_).count() < 0.25) return;
    last_report_ = now;
    Progress p;
    p.phase = phase;
    p.iteration = i;
    p.total = total;
    p.accept = accept();
    p.step_size = kernel_.step_size();
    p.elapsed = std::chrono::duration<double>(now - t0_).count();
    progress_(p);
  }

  /// The starting points (given, or drawn and screened: Note [Starting points that cannot move])
  /// and the kernel's state there.
  void start() {
    torch::Tensor x0;
    if (o_.init_x.defined()) {
      TORCH_CHECK(o_.init_x.dim() == 2 && o_.init_x.size(1) == target_.dim() && o_.init_x.size(0) > 0,
                  "init_x must be [n, ", target_.dim(), "]");
      x0 = o_.init_x.to(target_.options()).index_select(
          0, torch::arange(o_.chains, torch::TensorOptions().dtype(torch::kInt64).device(o_.init_x.device())) % o_.init_x.size(0));
    } else {
      x0 = initial_positions(target_, o_.init, o_.chains, gen_);
    }
    x0 = finite_starting_points(target_, x0, o_.init_x.defined() ? "" : o_.init, gen_);
    g_start_ = target_.grad_evals();
    e_start_ = target_.energy_evals();
    // Random starting points only, before warm-up (given starting points are never replaced, here
    // or by Note [Stuck chains in warm-up]).
    random_start_ = !o_.init_x.defined() && (o_.init == "uniform" || o_.init == "exact");
    if (random_start_ && o_.warmup > 0) {
      // on a stream of its own: where no chain is redrawn the run's draws are what they were without
      at::Generator screen_gen = make_generator(seed_ ^ 0x5c3ee9a1u, device_);
      x0 = screen_starting_points(target_, kernel_, x0, o_.init, screen_gen, res_.chains_redrawn);
    }
    state_ = kernel_.init(target_, x0);
    calls_outside_steps_ = target_.grad_evals() - g_start_;
    t0_ = last_report_ = Clock::now();
  }

  /// What the warm-up adapts, checked against what the kernel has.
  void check_adaptation() {
    tunable_ = kernel_.has_tunable_step_size();
    if (o_.adapt_step.value_or(false) && !tunable_) {
      throw UsageError("sampler '" + kernel_.name() + "' has no tunable step size: run it without step-size adaptation");
    }
    const bool adapt_metric = o_.metric != MetricAdapt::kUnit;
    if (adapt_metric && !kernel_.has_metric()) throw UsageError("sampler '" + kernel_.name() + "' has no mass matrix to adapt");
    if (is_full_rank_metric(o_.metric) && !kernel_.has_dense_metric()) {
      throw UsageError("sampler '" + kernel_.name() + "' has no " + enum_name(o_.metric) + " metric (diagonal only)");
    }
    if (adapt_metric) {
      estimator_.emplace(o_.metric);
      if (estimator_->needs_gradients() && !state_.grad.defined()) {
        throw UsageError("metric " + enum_name(o_.metric) + " is estimated from gradients, which sampler '" +
                         kernel_.name() + "' does not compute (use diag or dense)");
      }
    }
    tune_ = o_.adapt_step.value_or(tunable_) && o_.warmup > 0;
  }

  /// The warm-up's figures (at its end, or where the caller's observer ends the run).
  void warmup_figures() {
    res_.step_size = kernel_.step_size();
    const std::vector<double> steps = kernel_.step_sizes();
    if (!steps.empty()) res_.step_size_chain = torch::tensor(steps, torch::kFloat64);
    res_.seconds_warmup = std::chrono::duration<double>(Clock::now() - t0_).count();
    res_.grads_warmup = target_.grad_evals() - g_start_;
    res_.energies_warmup = target_.energy_evals() - e_start_;
    if (warmup_grads_chain_.defined()) {
      res_.grads_warmup = std::llround(warmup_grads_chain_.to(torch::kFloat64).mean().item<double>()) + calls_outside_steps_;
    }
    res_.max_tree_depth = kernel_.max_tree_depth();
  }

  /// Note [Stuck chains in warm-up]: every 25 iterations before the first slow window, chains that
  /// could not move restart from moving chains' positions.
  void redraw_stuck(int64_t i, const StepInfo& info, ChainsDualAveraging& da) {
    const torch::Tensor a = info.accept_prob.detach().to(torch::kFloat64).reshape({-1});
    block_accept_ = i % 25 == 0 || !block_accept_.defined() ? a.clone() : block_accept_ + a;
    if (!((i + 1) % 25 == 0 && i + 1 < first_slow_ && block_accept_.size(0) == o_.chains)) return;
    // stuck: a mean accept statistic below 0.001 over the block, while the typical chain moves
    const torch::Tensor mean = block_accept_ / 25.0;
    const torch::Tensor stuck = (mean < 1e-3).to(state_.x.device());
    const int64_t n_stuck = stuck.sum().item<int64_t>();
    if (!(n_stuck > 0 && n_stuck < o_.chains && mean.median().item<double>() > 0.1)) return;
    // each stuck chain takes the position of a moving chain drawn at random
    const torch::Tensor moving = (~stuck).nonzero().reshape({-1});
    const torch::Tensor pick = moving.index_select(0, torch::randint(moving.size(0), {o_.chains}, gen_, moving.options()));
    const torch::Tensor donors = state_.x.index_select(0, pick);
    outside_steps([&] {
      state_ = kernel_.init(target_, torch::where(stuck.unsqueeze(1), donors, state_.x));
      // the step size the stuck chains dragged down starts again from the moving chains'
      if (tune_) da.restart(find_reasonable_step_size(target_, kernel_, state_, gen_, kernel_.step_size()));
    });
    res_.chains_restarted += n_stuck;
  }

  /// Warm-up: dual averaging of the step size, the metric over Stan's windows, stuck chains
  /// restarted. False where the run ends in it (stopped, or the caller's observer ended it).
  bool warm_up() {
    if (tune_ || (tunable_ && kernel_.step_size() <= 0)) {
      outside_steps([&] {
        find_reasonable_step_size(target_, kernel_, state_, gen_, kernel_.step_size() > 0 ? kernel_.step_size() : 1.0);
      });
    }
    const bool per_chain = kernel_.has_per_chain_step_size() && o_.step_size_per_chain;
    ChainsDualAveraging da(kernel_.step_size(), o_.target_accept, per_chain ? o_.chains : 1);
    WarmupSchedule schedule(o_.warmup);
    torch::Tensor acc_sum = torch::zeros({}, state_.energy.options());
    const bool redraw = random_start_ && o_.chains > 1;
    while (first_slow_ < o_.warmup && !schedule.in_slow_window(first_slow_)) ++first_slow_;
    for (int64_t i = 0; i < o_.warmup; ++i) {
      if (stop()) {  // nothing drawn yet: nothing to keep
        res_.complete = false;
        return false;
      }
      auto [next, info] = kernel_.step(target_, state_, gen_);
      state_ = std::move(next);
      keep_step(state_);
      acc_sum += info.accept_prob.sum();
      if (info.n_grad_chain.defined()) {
        warmup_grads_chain_ = warmup_grads_chain_.defined() ? warmup_grads_chain_ + info.n_grad_chain : info.n_grad_chain.clone();
      }
      if (tune_) set_step_sizes(da.update(info.accept_prob));
      check_not_running_off(i, false);
      if (redraw && i < first_slow_) redraw_stuck(i, info, da);
      if (o_.warmup_observer && !o_.warmup_observer(i, state_)) {  // the caller goes on otherwise: no draws
        warmup_figures();
        return false;
      }
      if (estimator_ && schedule.in_slow_window(i)) estimator_->add(state_.x, state_.grad);
      if (estimator_ && schedule.ends_window(i) && estimator_->count() > 1) {
        check_not_running_off(i, true);
        end_metric_window(da);
      }
      report("warmup", i + 1, o_.warmup, [&] { return acc_sum.item<double>() / static_cast<double>((i + 1) * o_.chains); },
             i + 1 == o_.warmup);
    }
    if (tune_) set_step_sizes(da.final_steps());
    if (o_.warmup > 0) check_not_running_off(o_.warmup - 1, true);
    warmup_figures();
    return true;
  }

  /// One step size for every chain, or each chain's (Note [A step size per chain], kernels/adaptation.hpp).
  void set_step_sizes(const std::vector<double>& eps) {
    max_step_ = *std::max_element(eps.begin(), eps.end());
    if (eps.size() == 1) {
      kernel_.set_step_size(eps[0]);
    } else {
      kernel_.set_step_sizes(eps);
    }
  }

  /// Note [Chains that run off]: an adapted step size past kRunawayStepSize, or a chain at a
  /// non-finite point, ends the run with a DataError (no draw is written). The states are looked at
  /// (a host synchronisation) only where `look_at_states`: at metric windows' ends and warm-up's end.
  void check_not_running_off(int64_t i, bool look_at_states) {
    const double eps = max_step_;
    const bool runaway_step = tune_ && !(eps <= kRunawayStepSize);
    if (!runaway_step && !look_at_states) return;
    const torch::Tensor x = state_.x.detach().to(torch::kFloat64);
    const bool finite = torch::isfinite(x).all().item<bool>();
    if (!runaway_step && finite) return;
    const double far = finite ? x.abs().max().item<double>() : std::numeric_limits<double>::infinity();
    throw DataError(fmt::format(
        "the chains ran off to infinity while warming up: after {} of {} iterations {} and the chains reached "
        "|x| = {:.3g}. The density is probably improper (flat, or not decaying along some direction: a missing "
        "prior, a missing Jacobian term, an energy of the wrong sign); a target whose parameters truly have "
        "scales beyond {:.0e} should be rescaled",
        i + 1, o_.warmup,
        runaway_step ? fmt::format("the step size had grown to {:.3g}, accepting nearly every move,", eps)
                     : std::string("a chain's position was no longer finite,"),
        far, kRunawayStepSize));
  }

  /// A metric window's end: the kernel takes the estimate, and the step size is searched again.
  void end_metric_window(ChainsDualAveraging& da) {
    const Metric metric = estimator_->estimate();
    kernel_.set_metric(metric.to(target_.options()));
    res_.inv_mass = metric.inv_mass();
    res_.metric = enum_name(metric.kind());
    res_.metric_rank = metric.kind() == MetricKind::kLowRank ? metric.basis().size(1) : 0;
    estimator_->reset();
    if (tune_) outside_steps([&] { da.restart(find_reasonable_step_size(target_, kernel_, state_, gen_, kernel_.step_size())); });
  }

  /// The result's per-draw tensors, [S, C, ...].
  void allocate() {
    const int64_t s = o_.draws, c = o_.chains, d = target_.dim();
    if (o_.keep_draws) {
      const double bytes = 8.0 * static_cast<double>(s) * static_cast<double>(c) * static_cast<double>(d);
      // On disk the layout is parameter-major ([D, S, C] seen as [S, C, D]): a step writes D short
      // runs, and the summary's blocks of parameters read contiguous stretches of the file instead
      // of every page of it once per block.
      res_.draws = o_.draws_in_memory_limit > 0 && bytes > static_cast<double>(o_.draws_in_memory_limit)
                       ? disk_backed_tensor({d, s, c}, o_.scratch_directory).permute({1, 2, 0})
                       : torch::empty({s, c, d}, torch::kFloat64);
    }
    res_.lp = torch::empty({s, c}, torch::kFloat64);
    res_.accept_stat = torch::empty({s, c}, torch::kFloat64);
    res_.divergent = torch::empty({s, c}, torch::kBool);
    res_.n_grad = torch::empty({s}, torch::kInt64);
  }

  /// One draw's row; false where the run is asked to stop. Rows go to the sink about every 2 s.
  bool record(const ChainState& now, const StepInfo& info) {
    const int64_t i = done_, s = o_.draws;
    keep_step(now);
    if (o_.keep_draws) put_row(res_.draws, i, now.x);
    put_row(res_.lp, i, now.energy, /*negate=*/true);
    put_row(res_.accept_stat, i, info.accept_prob);
    put_row(res_.divergent, i, info.divergent);
    res_.n_grad.data_ptr<int64_t>()[i] = info.n_grad;
    if (info.n_grad_chain.defined()) {
      if (i == 0) {
        res_.n_grad_chain = torch::empty({s, o_.chains}, torch::kInt64);
        res_.tree_depth = torch::empty({s, o_.chains}, torch::kInt64);
        res_.energy = torch::empty({s, o_.chains}, torch::kFloat64);
      }
      put_row(res_.n_grad_chain, i, info.n_grad_chain);
      if (info.tree_depth.defined()) put_row(res_.tree_depth, i, info.tree_depth);
      if (info.energy.defined()) put_row(res_.energy, i, info.energy);
    }
    done_ = i + 1;
    report("sampling", done_, s,
           [&] { return res_.accept_stat.narrow(0, 0, done_).sum().item<double>() / static_cast<double>(done_ * o_.chains); },
           done_ == s);
    if (stop()) return false;
    if (o_.sink && std::chrono::duration<double>(Clock::now() - last_flush_).count() >= 2.0) {
      const auto write_start = Clock::now();
      o_.sink->append(res_, flushed_, done_);  // rows as they are drawn, about every 2 s
      flushed_ = done_;
      last_flush_ = Clock::now();
      writing_ += std::chrono::duration<double>(last_flush_ - write_start).count();
    }
    return true;
  }

  /// Sampling: the kernel is frozen, and NUTS's chains may run ahead of each other (run_steps).
  void sample() {
    const int64_t s = o_.draws;
    allocate();
    const int64_t g_mid = target_.grad_evals(), e_mid = target_.energy_evals();
    t0_ = Clock::now();
    last_flush_ = Clock::now();
    // The rows written while sampling goes on (about every 2 s) are not sampling time:
    // seconds_sampling is the kernel's time alone (writing_ is taken off).
    if (o_.sink && !o_.keep_draws) throw UsageError("a draw sink needs keep_draws");
    if (!stop()) {
      state_ = kernel_.run_steps(target_, std::move(state_), s, gen_,
                                 [this](const ChainState& now, const StepInfo& info) { return record(now, info); });
    }
    if (done_ < s) {  // stopped: keep what was drawn
      res_.complete = false;
      for (torch::Tensor* t : {&res_.draws, &res_.lp, &res_.accept_stat, &res_.divergent, &res_.n_grad,
                               &res_.n_grad_chain, &res_.tree_depth, &res_.energy}) {
        if (t->defined()) *t = t->narrow(0, 0, done_);
      }
    }
    res_.seconds_sampling = std::chrono::duration<double>(Clock::now() - t0_).count() - writing_;
    if (o_.sink && done_ > flushed_) o_.sink->append(res_, flushed_, done_);
    res_.grads_sampling = target_.grad_evals() - g_mid;
    res_.batch_grads_sampling = res_.grads_sampling;
    res_.energies_sampling = target_.energy_evals() - e_mid;
    if (res_.n_grad_chain.defined()) {
      // Each chain's own count (the target's counter sees the batch, i.e. the busiest chain).
      res_.grads_sampling = std::llround(res_.n_grad_chain.to(torch::kFloat64).sum(0).mean().item<double>());
    }
    if (o_.sink) o_.sink->finish(res_);
  }

  Target& target_;
  Kernel& kernel_;
  const RunOptions& o_;
  const uint64_t seed_;
  const ProgressFn& progress_;
  const torch::Device device_;
  at::Generator gen_;
  SampleResult res_;
  ChainState state_;
  int64_t g_start_ = 0, e_start_ = 0, calls_outside_steps_ = 0;
  Clock::time_point t0_, last_report_, last_flush_;
  bool random_start_ = false, tunable_ = false, tune_ = false;
  double max_step_ = 0;  // the largest step size warm-up has set (Note [Chains that run off])
  std::optional<MetricEstimator> estimator_;
  torch::Tensor warmup_grads_chain_;  // [C] when the kernel reports per-chain counts
  int64_t first_slow_ = 0;
  torch::Tensor block_accept_;  // [C]: each chain's accept statistics over the current 25 iterations
  int64_t done_ = 0, flushed_ = 0;
  double writing_ = 0;
};


SampleResult run_local(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed, const ProgressFn& progress) {
  return LocalRun(target, kernel, o, seed, progress).run();
}
}  // namespace

SampleResult run_sampler(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                         const ProgressFn& progress, parallel::Communicator* communicator) {
  parallel::Communicator& comm = communicator != nullptr ? *communicator : *parallel::single_process();
  const int world = comm.world_size(), rank = comm.rank();
  if (options.phases) {
    if (world > 1) throw UsageError("a warm-up in phases (a flow transport) runs in one process");
    return run_in_phases(target, kernel, options, seed, progress);
  }
  if (world == 1) return run_local(target, kernel, options, seed, progress);  // the gather of one run is itself
  if (options.chains < world) {
    throw UsageError(fmt::format("{} chains cannot be shared by {} processes: give at least one chain each",
                                 options.chains, world));
  }
  auto [begin, end] = parallel::block_of(options.chains, rank, world);
  // This rank's chains are the run `chains = end - begin, seed = seed + rank`, with their own
  // warm-up and adaptation (as Stan's chains): Note [Data parallelism].
  RunOptions run = options;
  run.chains = end - begin;
  const uint64_t my_seed = seed + static_cast<uint64_t>(rank);
  if (run.init_x.defined()) {  // given or buffer starting points: the rows the whole run gives these chains
    torch::Tensor rows = torch::arange(begin, end, torch::kInt64).remainder(run.init_x.size(0));
    run.init_x = run.init_x.index_select(0, rows.to(run.init_x.device()));
  }
  SampleResult mine = run_local(target, kernel, run, my_seed, rank == 0 ? progress : nullptr);

  // Runs stopped early (Ctrl-C reaches the ranks at slightly different draws) keep the draws all have.
  const int64_t have = mine.draws.defined() ? mine.draws.size(0) : 0;
  const double c = static_cast<double>(run.chains);
  std::vector<double> t = parallel::all_reduce_doubles(
      comm, {mine.complete ? 0.0 : 1.0, mine.seconds_warmup, mine.seconds_sampling, mine.grads_warmup * c,
             mine.grads_sampling * c, mine.energies_warmup * c, mine.energies_sampling * c,
             static_cast<double>(mine.batch_grads_sampling)});
  const int64_t common = comm.all_gather_rows(torch::tensor({have}, torch::kInt64)).min().item<int64_t>();
  const double total = static_cast<double>(options.chains);
  SampleResult r;
  r.complete = t[0] == 0;
  r.seed = seed;
  r.draws_planned = mine.draws_planned;
  r.names = mine.names;
  r.max_tree_depth = mine.max_tree_depth;
  r.metric = mine.metric;
  r.metric_rank = mine.metric_rank;
  r.chains_restarted =
      comm.all_gather_rows(torch::tensor({mine.chains_restarted}, torch::kInt64)).sum().item<int64_t>();
  r.chains_redrawn = comm.all_gather_rows(torch::tensor({mine.chains_redrawn}, torch::kInt64)).sum().item<int64_t>();
  r.seconds_warmup = t[1] / world;  // the ranks run side by side: their mean wall time
  r.seconds_sampling = t[2] / world;
  r.grads_warmup = std::llround(t[3] / total);
  r.grads_sampling = std::llround(t[4] / total);
  r.energies_warmup = std::llround(t[5] / total);
  r.energies_sampling = std::llround(t[6] / total);
  r.batch_grads_sampling = std::llround(t[7] / world);
  if (common == 0) return r;  // stopped before any rank drew
  auto first = [&](const torch::Tensor& x) { return x.defined() ? x.narrow(0, 0, common) : x; };
  // [S, c, ...] per rank -> [S, C, ...]: the chains (dim 1) in rank order.
  if (mine.draws.defined()) r.draws = parallel::all_gather_along(comm, first(mine.draws).to(torch::kFloat64), 1);
  r.lp = parallel::all_gather_along(comm, first(mine.lp), 1);
  r.accept_stat = parallel::all_gather_along(comm, first(mine.accept_stat), 1);
  r.divergent = parallel::all_gather_along(comm, first(mine.divergent), 1);
  r.tree_depth = parallel::all_gather_along(comm, first(mine.tree_depth), 1);
  r.energy = parallel::all_gather_along(comm, first(mine.energy), 1);
  torch::Tensor per_chain = mine.n_grad_chain.defined()
                                ? first(mine.n_grad_chain)
                                : first(mine.n_grad).unsqueeze(1).expand({common, run.chains}).contiguous();
  r.n_grad_chain = parallel::all_gather_along(comm, per_chain, 1);
  r.n_grad = std::get<0>(r.n_grad_chain.max(1));
  const torch::Tensor my_steps = mine.step_size_chain.defined() ? mine.step_size_chain.reshape({1, run.chains})
                                                                : torch::full({1, run.chains}, mine.step_size, torch::kFloat64);
  r.step_size_chain = parallel::all_gather_along(comm, my_steps, 1).squeeze(0);
  r.step_size = r.step_size_chain.mean().item<double>();
  if (mine.inv_mass.defined()) {
    std::vector<int64_t> reps(mine.inv_mass.dim() + 1, 1);
    reps[0] = run.chains;
    r.inv_mass_chain = comm.all_gather_rows(mine.inv_mass.unsqueeze(0).repeat(reps));
    r.inv_mass = mine.inv_mass;  // rank 0's (each chain's own is in inv_mass_chain)
  }
  return r;
}

}  // namespace nmcmc
