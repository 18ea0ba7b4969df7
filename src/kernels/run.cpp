// The run loop of one process's chains (LocalRun: starting points, warm-up, sampling, thinning).
// The phased warm-up of a transport is in run_phases.cpp, the run sharded over a communicator in
// run_sharded.cpp; both call run_local (local_run.hpp).
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

#include "nmcmc/core/clock.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "draw_storage.hpp"
#include "transformed_draws.hpp"
#include "local_run.hpp"
#include "starting_points.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
// Note [Chains that run off]: on an improper density (flat, or growing along some direction) every
// move is accepted, warm-up doubles the step size again and again and the chains run off until their
// metric overflows and the draws become NaN. A proper target's adapted step size is about its
// scale in the metric's units (O(1) once a metric is adapted; the target's own scale otherwise),
// so a step size past 1e12 means the run met no curvature: it stops and says so, rather than write
// draws that mean nothing (a user whose parameters truly have scales of 1e12 rescales them).
constexpr double kRunawayStepSize = 1e12;

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

// Note [Thinning]
// With thin k a kept draw is the state after every k-th sampling step, as Stan's thin: the chain
// runs k x draws steps and keeps every k-th. A kept draw's figures cover every step behind it, so
// nothing a dropped step did goes unreported and every per-gradient figure stays exact: its
// gradient and energy counts are the block's sums, its divergence any of the block's, its accept
// statistic the block's mean, its tree depth the block's deepest. Ctrl-C is looked at every step
// (a block cut short keeps no draw). Warm-up is counted in steps. Thinning by k loses effective
// draws per gradient where draws k apart are still correlated (an AR(1) chain thinned at half its
// integrated autocorrelation time keeps about 92 % of them, at the whole time about 76 %); it buys
// chains that are k times longer for the same number of stored draws.

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
    res_.thin = o.thin;
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
    if (o.thin < 1) throw UsageError("--thin must be at least 1");
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

  /// One sampling step: a draw's row where it ends a block of `thin` steps (Note [Thinning]);
  /// false where the run is asked to stop.
  bool on_step(const ChainState& now, const StepInfo& info) {
    keep_step(now);
    if (o_.thin == 1) return record(now, info);
    if (in_block_ == 0) {
      block_ = info;  // its own tensors: a kernel may reuse the ones it reports
      for (torch::Tensor* t : {&block_.accept_prob, &block_.divergent, &block_.n_grad_chain, &block_.tree_depth}) {
        if (t->defined()) *t = t->clone();
      }
    } else {
      block_.accept_prob = block_.accept_prob + info.accept_prob;
      block_.divergent = block_.divergent.logical_or(info.divergent);
      block_.n_grad += info.n_grad;
      block_.n_energy += info.n_energy;
      if (info.n_grad_chain.defined()) block_.n_grad_chain += info.n_grad_chain;
      if (info.tree_depth.defined()) block_.tree_depth = block_.tree_depth.maximum(info.tree_depth);
      block_.energy = info.energy;
    }
    if (++in_block_ < o_.thin) return !stop();
    in_block_ = 0;
    block_.accept_prob = block_.accept_prob / static_cast<double>(o_.thin);
    return record(now, block_);
  }

  /// One draw's row; false where the run is asked to stop. Rows go to the sink about every 2 s.
  bool record(const ChainState& now, const StepInfo& info) {
    const int64_t i = done_, s = o_.draws;
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
      state_ = kernel_.run_steps(target_, std::move(state_), s * o_.thin, gen_,
                                 [this](const ChainState& now, const StepInfo& info) { return on_step(now, info); });
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
  StepInfo block_;        // Note [Thinning]: the steps of the draw being made so far
  int64_t in_block_ = 0;  // how many
  double writing_ = 0;
};

}  // namespace

SampleResult run_local(Target& target, Kernel& kernel, const RunOptions& o, uint64_t seed, const ProgressFn& progress) {
  return LocalRun(target, kernel, o, seed, progress).run();
}

}  // namespace nmcmc
