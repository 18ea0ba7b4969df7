// `nmcmc train` (services::train): the model and its target, resuming, the preconditioner's or the
// transport's warm-up (Note [Choosing the transport]), the training steps under their budget (Note
// [Training budget]) and the checks that training learned something. One TrainRun holds the
// run's state; each step below is one of its methods, called in order by run(). (About 600 lines:
// the one class's steps with the Notes that explain their budgets, kept together on purpose.)
//
// Note [A long warm-up shortens training]
// `max_seconds` bounds the training steps; when the preconditioner's (or the transport's) warm-up
// took more than kWarmupAllowance of it, the excess comes out of training's time, down to a quarter
// of max_seconds. With the defaults (90 s) a posterior whose gradient is cheap trains as before,
// and one whose warm-up is long (GARCH: 16 chains x 600 NUTS iterations of a 200-step recursion,
// ~100 s) still hands over a sampler within about two minutes of `nmcmc train` instead of three.
// The allowance, 25 s, leaves 5 s of the two minutes to loading the module and writing the
// checkpoint: with 30 the latent GP, whose warm-up (the affine one, then the flow's) takes ~80 s,
// took 121.5 s.
// That cut must not starve a sampler that is not ready: when the time limit is reached, the mixing
// check (below) runs first, and where it fails training goes on for another max_seconds, at most
// three times; each such check is recorded ("time_extensions") and its cost counted. A sampler that
// already mixes stops as before (posteriordb's diamonds: 169 s of warm-up, 23 s of training, and a
// sampler that passes every moment check at 0.41 bulk-ESS per gradient).
//
// Note [A plateau that does not mix]
// The plateau rule (the proposal entropy gaining less than train.min_gain nats per dimension over
// train.patience steps) stopped training on samplers that did not mix once D reached a few hundred:
// on the 300-d ill-conditioned Gaussian it stopped after 813 steps (11 s of a 90 s budget) with the
// mixing check at R-hat 1.15, and the sampler ran at 0.026 bulk-ESS per gradient against 0.44 at
// D = 100. So at the plateau the mixing check (below) runs first, and where it fails training goes
// on for another `patience` steps, at most three times in all with the time extensions above; each
// such check is recorded ("time_extensions", its "stop" saying which rule) and its cost counted. A
// sampler that mixes at its plateau stops as before, with the same draws.
//
// Note [An extension that does not pay]
// Extending training helps a sampler that is still learning, not one whose training has settled:
// on the large suite (BENCHMARKS.md, "The learned sampler, thinned") the checks at the stops of
// German credit (min bulk-ESS 121, 106, 119), GLMM_Poisson (184, 191, 184) and accel_gp (150,
// 144, 145) did not move over three extensions,
// about half of their training's seconds, while sat's R-hat fell at each (2.40, 2.17, 1.95). So a
// failed check extends training only where it is the first, or where it improved on the previous
// stop's check: min bulk-ESS up by kExtensionGain (10 %) or more, or max R-hat's excess over 1 down
// by that fraction. Otherwise training stops there, and the check's failure is reported as before
// (`train` warns; `sample` thins by the check's ESS, Note [The learned sampler's thinning]). Each
// record says whether it extended ("extends").
//
// Note [The mixing check]
// `train` reported success for samplers that did not mix (posteriordb-sized models are fine, but
// at 501 parameters a starved training handed over a sampler with R-hat 1.28). After the last
// step the trained proposal runs from the training's own chains (the bootstrap buffer, or exact
// draws where training used them): 64 chains x 200 draws, no warm-up, in the space it was trained
// in. It passes when the chains mix there: max rank-normalised R-hat at most 1.1, min bulk-ESS at
// least 100, mean accept rate at least 0.05, and at least 90 % of the chains moved. 200 draws per
// chain are few for a slow but correct sampler: on Inference Gym's Brownian motion (32
// parameters) the learned sampler at 0.049 bulk-ESS per gradient, 16x NUTS's, showed R-hat 1.09
// here (min bulk-ESS 469) and passed every moment check over 4 x 10,000 draws, where the broken
// samplers this check is for show R-hat 5.6 (kilpisjarvi after 3 steps) to 18 (icg after 2 steps
// without a preconditioner). It costs 12,800 proposals (a few per
// cent of the default training's); its gradients and seconds are recorded with it and count in the
// all-in cost. A failed check does not remove the model (more steps may mend it): the command
// line warns on stderr, Python warns (RuntimeWarning), and the checkpoint records it, with the
// parameter that mixed worst ("worst": its name and R-hat, in the target's own coordinates: a
// flow's latent draws are mapped back first). Distributed runs skip it (each rank holds only its
// shard of the chains).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/flows/checkpoint.hpp"
#include "nmcmc/kernels/baselines.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/targets/targets.hpp"
#include "seed_streams.hpp"
#include "train_parts.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {

constexpr double kWarmupAllowance = 25.0;  // Note [A long warm-up shortens training]

class TrainRun {
 public:
  TrainRun(const TrainConfig& config, torch::Device device, const std::string& output, const std::string& log_path,
           bool resume, const TrainProgressFn& progress, const std::function<bool()>& should_stop,
           std::shared_ptr<parallel::Communicator> comm)
      : config_(config), output_(output), log_path_(log_path), resume_(resume), progress_(progress),
        should_stop_(should_stop), comm_(comm ? std::move(comm) : parallel::single_process()) {
    auto options = torch::TensorOptions().dtype(config.dtype == "float64" ? torch::kFloat64 : torch::kFloat32).device(device);
    target_ = make_target(config.target, options);
    model_ = config.model;
    model_.dim = target_->dim();
    if (model_.hidden == 0) model_.hidden = default_hidden(model_.dim);  // Note [Training budget]
    distributed_ = comm_->world_size() > 1;
    auto_transport_ = config.transport.kind == TransportKind::kAuto;
    with_transport_ = config.transport.kind == TransportKind::kFlow;
    if (with_transport_ && distributed_) throw UsageError("training with a flow transport runs in one process");
    asked_precondition_ = model_.precondition;
    set_precondition();
    if (!config.from.empty() && !(resume && std::filesystem::exists(output))) start_from_previous();
  }

  TrainResult run() {
    check_resume();
    if (!choose_auto()) return interrupted();
    if (!warm_up_flow()) return interrupted();
    make_trainer();
    if (!prepare_model()) return interrupted();
    if (!previous_model_fits()) train_steps();
    finish();
    check_mixing();
    return std::move(result_);
  }

 private:
  /// The space the proposal trains and runs in: the flow's latent space where there is a flow
  /// (fitted, resumed or kept from a previous model), else the target's own.
  Target& space() { return latent_ ? static_cast<Target&>(*latent_) : *target_; }

  TrainResult interrupted() {
    result_.interrupted = true;
    result_.saved = false;
    return std::move(result_);
  }

  /// With a transport the flow is the preconditioner; "auto" adds a learned diagonal one in its
  /// latent space (Note [Learned proposal in a flow's latent space]).
  void set_precondition() {
    model_.precondition = with_transport_ && asked_precondition_ == Precondition::kAuto
                              ? Precondition::kDiag
                              : resolve_precondition(asked_precondition_, model_.dim);
  }

  /// Note [Training from a previous model]: the previous model, checked against this target.
  void start_from_previous() {
    if (distributed_) throw UsageError("--from trains in one process");
    PreviousModel previous = load_previous_model(config_.from, *target_, config_.train);
    const TransportKind asked = config_.transport.kind;
    if (asked != TransportKind::kAuto && (asked == TransportKind::kFlow) != bool(previous.flow)) {
      throw UsageError(fmt::format("--from keeps the previous model's transport, and '{}' was trained {}; leave out "
                                   "--transport (or train from scratch to choose another)",
                                   config_.from, previous.flow ? "through a flow" : "without one"));
    }
    model_ = previous.sampler->options();
    auto_transport_ = with_transport_ = false;  // no flow fitted: the previous one is kept as it is
    flow_ = previous.flow;
    from_sampler_ = previous.sampler;
    from_meta_ = std::move(previous.meta);
    from_start_ = std::move(previous.start);
  }

  /// Resume only when every rank sees the checkpoint (rank 0 writes it; other machines need the
  /// same path on a shared directory); the checkpoint holds the transport's choice and the shards.
  void check_resume() {
    resuming_ = resume_ && std::filesystem::exists(output_);
    const double seen = parallel::all_reduce_doubles(*comm_, {resuming_ ? 1.0 : 0.0})[0];
    if (seen > 0 && seen < comm_->world_size()) {
      throw UsageError(fmt::format("{}: checkpoint '{}' exists on {} of {} processes; to resume, every process needs it "
                                   "(a directory all machines share)", comm_->where(), output_, seen, comm_->world_size()));
    }
    if (auto_transport_ && resuming_) {  // the checkpoint holds the choice
      auto ar = open_learned_checkpoint(output_);
      with_transport_ = read_learned_meta(ar, output_).contains("transport");
      if (with_transport_ && distributed_) {
        throw UsageError("checkpoint '" + output_ + "' was trained with a flow transport, which runs in one process");
      }
      set_precondition();
    }
    train_options_ = config_.train;
    if (resuming_ && train_options_.shards.value_or(0) == 0) {
      // A checkpoint keeps its shard count (its random streams): resume on any divisor of it.
      if (auto stored = checkpoint_shards(output_)) {
        if (*stored % comm_->world_size() != 0) {
          throw UsageError(fmt::format("checkpoint '{}' was trained with {} shard(s) per batch, each with its own random "
                                       "stream and buffer rows; it resumes on a number of processes that divides {}, "
                                       "not on {}", output_, *stored, *stored, comm_->world_size()));
        }
        train_options_.shards = *stored;
      }
    }
  }

  /// Every rank runs the same warm-up (same seed); rank 0's result is then broadcast. Distributed,
  /// a stop during it waits for the first training step (so all ranks stop together).
  json run_affine_warmup(LearnedSampler& s, Trainer& t, bool& stopped) {
    TrainOptions o = config_.train;
    if (from_start_) o.precondition.eps_from_warmup = o.precondition.beta_from_warmup = false;  // the previous model's (Note [Training from a previous model])
    json record = warm_up_preconditioner(space(), s, t, o, progress_, distributed_ ? nullptr : should_stop_,
                                         &affine_end_, from_start_ ? &*from_start_ : nullptr);
    stopped = parallel::all_reduce_doubles(*comm_, {record.value("interrupted", false) ? 1.0 : 0.0})[0] > 0;
    return record;
  }

  /// Note [Choosing the transport]: the affine warm-up first; its model and trainer are kept when
  /// the affine map fits. False where it was interrupted.
  bool choose_auto() {
    if (!auto_transport_ || resuming_) return true;
    affine_sampler_ = LearnedSampler(model_);
    affine_trainer_ = std::make_unique<Trainer>(*target_, affine_sampler_.ptr(), train_options_, comm_);
    if (!affine_sampler_->preconditioned()) return true;
    bool stopped = false;
    affine_record_ = run_affine_warmup(affine_sampler_, *affine_trainer_, stopped);
    if (stopped) return false;
    const json f = affine_record_.value("fisher_per_dim", json(nullptr));
    const double threshold = TransportRules().flow_fisher_per_dim;
    const bool misfit = f.is_number() && f.get<double>() > threshold;
    auto_record_ = {{"fisher_per_dim", f},
                    {"threshold", threshold},
                    {"chose", misfit && !distributed_ ? "flow" : "affine"},
                    {"affine_grads", affine_record_.value("grads", int64_t{0})},
                    {"affine_seconds", affine_record_.value("seconds", 0.0)}};
    if (misfit && distributed_) auto_record_["why"] = "a distributed run keeps the affine map";
    affine_record_["auto"] = auto_record_;
    if (misfit && !distributed_) {
      with_transport_ = true;
      set_precondition();
      affine_trainer_.reset();
      affine_sampler_ = nullptr;
    }
    return true;
  }

  /// Note [Learned proposal in a flow's latent space]: the flow comes from the checkpoint when
  /// resuming, else from its warm-up (Note [The transported warm-up starts at the posterior]: where
  /// it ends in the transient it runs again from where the affine warm-up, auto's if it ran, left
  /// the chains). False where it was interrupted.
  bool warm_up_flow() {
    if (!with_transport_) return true;
    if (resuming_) {
      auto ar = open_learned_checkpoint(output_);
      json meta = read_learned_meta(ar, output_);
      flow_ = load_transport(ar, meta, output_);
      if (!flow_) throw UsageError("checkpoint '" + output_ + "' was trained without a transport; resume it without one");
      if (meta.contains("preconditioner")) transport_record_ = meta["preconditioner"];
      return true;
    }
    TransportChoice tt = config_.transport;
    tt.kind = TransportKind::kFlow;
    transport_record_ = warm_up_transport(*target_, tt, config_.train, flow_, latent_draws_, progress_, should_stop_, affine_end_);
    if (!auto_record_.is_null()) {  // all-in: the affine warm-up that chose the flow is paid too
      transport_record_["auto"] = auto_record_;
      transport_record_["grads"] = transport_record_.value("grads", int64_t{0}) + auto_record_["affine_grads"].get<int64_t>();
      transport_record_["seconds"] = transport_record_.value("seconds", 0.0) + auto_record_["affine_seconds"].get<double>();
    }
    return !transport_record_.value("interrupted", false);
  }

  /// The proposal and its trainer, on the pulled-back target where there is a flow (the affine
  /// warm-up's, where auto kept it).
  void make_trainer() {
    if (flow_) latent_ = std::make_unique<TransportedTarget>(*target_, flow_);
    sampler_ = affine_trainer_ ? affine_sampler_ : from_sampler_ ? from_sampler_ : LearnedSampler(model_);
    trainer_ = affine_trainer_ ? std::move(affine_trainer_)
                               : std::make_unique<Trainer>(space(), sampler_.ptr(), train_options_, comm_);
    extra_ = {{"name", config_.name}, {"config", config_.to_json()}, {"names", parameter_labels(*target_)}};
    if (from_sampler_) {
      trainer_->set_beta(from_meta_.value("beta", trainer_->beta()));
      extra_["from"] = {{"model", config_.from}, {"target", from_meta_.value("target", json())},
                        {"steps", from_meta_.value("step", int64_t{0})}, {"beta", trainer_->beta()},
                        {"flow_kept", bool(flow_)}};
    }
    if (flow_) extra_["transport"] = {{"kind", TransportKind::kFlow}, {"flow", flow_->options()}};
  }

  /// The model's starting point: the checkpoint's, the transport's latent draws, or the affine
  /// warm-up's. False where the warm-up was interrupted.
  bool prepare_model() {
    if (resuming_) {
      if (!with_transport_) {
        auto ar = open_learned_checkpoint(output_);
        if (read_learned_meta(ar, output_).contains("transport")) {
          throw UsageError("checkpoint '" + output_ + "' was trained in a flow transport's latent space; resume it with "
                           "the transport (--transport flow)");
        }
      }
      json meta = trainer_->load(output_);
      if (meta.contains("preconditioner")) extra_["preconditioner"] = result_.preconditioner = meta["preconditioner"];
      return true;
    }
    if (with_transport_) {
      set_from_latent_draws();
    } else if (sampler_->preconditioned()) {
      json record = affine_record_;
      if (record.is_null()) {
        bool stopped = false;
        record = run_affine_warmup(sampler_, *trainer_, stopped);
        if (stopped) return false;
      }
      extra_["preconditioner"] = result_.preconditioner = record;
    }
    trainer_->broadcast_from_root();
    return true;
  }

  /// The latent draws set the affine preconditioner on top of the flow (near the identity when
  /// the flow fits), the step size, the buffer and beta, as the affine warm-up's draws do.
  void set_from_latent_draws() {
    const int64_t d = target_->dim();
    torch::Tensor flat = latent_draws_.reshape({-1, d});
    if (model_.precondition == Precondition::kLowRank) {
      LowRankFactors f = low_rank_factors(flat, model_.precondition_rank, latent_draws_.size(1));
      sampler_->set_low_rank_preconditioner(flat.mean(0), f.variances, f.directions, f.eigenvalues);
    } else if (model_.precondition == Precondition::kDense) {
      torch::Tensor c = flat - flat.mean(0);
      sampler_->set_preconditioner(flat.mean(0), c.t().matmul(c) / double(std::max<int64_t>(1, flat.size(0) - 1)));
    } else if (model_.precondition == Precondition::kDiag) {
      sampler_->set_preconditioner(flat.mean(0), flat.var(0));
    }
    if (config_.train.precondition.eps_from_warmup) sampler_->set_eps(transport_record_.value("step_size", 0.1));
    seed_buffer_from(*trainer_, latent_draws_, target_->options());
    if (config_.train.precondition.eps_from_warmup && config_.train.precondition.beta_from_warmup) {
      transport_record_["beta"] = trainer_->warm_start_beta();
    }
    extra_["preconditioner"] = result_.preconditioner = transport_record_;
  }

  void checkpoint() {
    if (flow_) {
      trainer_->save(output_, extra_, [&](torch::serialize::OutputArchive& ar) { write_transport(ar, *flow_); });
    } else {
      trainer_->save(output_, extra_);  // collective: rank 0 writes
    }
    if (comm_->is_root()) write_training_log(log_path_, trainer_->log());
  }

  /// Note [A long warm-up shortens training]: the training steps' time limit (0: none).
  double time_limit() {
    const TrainBudget& budget = config_.train.budget;
    double limit = budget.max_seconds.value_or(0);
    if (limit > 0 && result_.preconditioner.is_object()) {
      const double warm = result_.preconditioner.value("seconds", 0.0);
      if (warm > kWarmupAllowance) {
        limit = std::max(0.25 * *budget.max_seconds, *budget.max_seconds - (warm - kWarmupAllowance));
        // recorded with the warm-up that caused it (checkpoint meta "preconditioner")
        result_.preconditioner["train_time_limit"] = limit;
        extra_["preconditioner"]["train_time_limit"] = limit;
      }
    }
    return limit;
  }

  /// The training steps until the last, a plateau of the proposal entropy, the time limit or a
  /// stop (Note [Training budget]); checkpoints as configured.
  void train_steps() {
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    const TrainBudget& budget = config_.train.budget;
    const int64_t total = budget.steps;
    const int64_t usual_patience = budget.patience.value_or(0);  // 0: never
    const double min_gain = budget.min_gain * static_cast<double>(target_->dim());
    double ema = 0, best = -INFINITY;
    int64_t best_step = trainer_->current_step(), entropies = 0;
    double trained = 0;
    double limit = time_limit();
    int extensions = 0;
    // Note [Training from a previous model]: a short plateau first, the usual one where the check fails
    int64_t patience = from_sampler_ ? budget.from_patience : usual_patience;
    auto elapsed = [&t0](std::chrono::steady_clock::time_point now) {
      return std::chrono::duration<double>(now - t0).count();
    };
    while (trainer_->current_step() < total) {
      const bool stop = should_stop_ && should_stop_();
      if (stop && !distributed_) {
        checkpoint();
        result_.interrupted = true;
        result_.stopped = "interrupted";
        break;
      }
      TrainStats s = trainer_->step(stop);
      if (trainer_->stop_agreed()) {  // some rank was asked to stop: all save this step and end
        checkpoint();
        result_.interrupted = true;
        result_.stopped = "interrupted";
        break;
      }
      trained += s.seconds;
      if (std::isfinite(s.entropy)) {
        ema = entropies++ == 0 ? s.entropy : 0.98 * ema + 0.02 * s.entropy;
        if (ema > best + min_gain) {
          best = ema;
          best_step = s.step;
        }
      }
      // Every rank decides alike: the entropy and the step are the all-reduced ones; the time is rank 0's.
      std::string why;
      if (patience > 0 && s.step - best_step >= patience && s.step < total) why = "plateau";
      if (why == "plateau" && patience != usual_patience) {
        const json check = mixing_check();
        extra_["from"]["first_check"] = check;
        if (!check.value("passes", true)) {
          patience = usual_patience;
          why.clear();
        }
      }
      if (limit > 0 && s.step < total &&
          parallel::all_reduce_doubles(*comm_, {comm_->is_root() && trained > limit ? 1.0 : 0.0})[0] > 0) {
        why = "time";
      }
      if (why.empty() && !distributed_ && cost_.due(s.step) && s.step < total) {  // Note [Training stops when it no longer pays]
        if (cost_.stops(s.step, spent_grads(s), mixing_check(kProbeDraws, SeedStream::kCostProbe, s.step))) why = "cost";
        result_.probes = cost_.log();
      }
      if (((why == "plateau" && patience == usual_patience) || why == "time") && !distributed_ && extensions < 3) {
        // Note [A plateau that does not mix], Note [A long warm-up shortens training], Note [An
        // extension that does not pay]
        json check = mixing_check();
        check["stop"] = why;
        const json* previous = result_.time_extensions.empty() ? nullptr : &result_.time_extensions.back();
        check["extends"] = !check.value("passes", true) && extension_gained(previous, check);
        result_.time_extensions.push_back(check);
        if (check["extends"].get<bool>()) {
          if (why == "plateau") best_step = s.step;  // another `patience` steps from here
          if (why == "time") limit += budget.max_seconds.value_or(0);
          ++extensions;
          why.clear();
        }
      }
      if (!why.empty()) {
        checkpoint();
        result_.stopped = why;
        if (progress_) progress_({"train", s, total, elapsed(std::chrono::steady_clock::now())});
        break;
      }
      if (s.step % config_.train.checkpoint_every == 0 || s.step == total) checkpoint();
      auto now = std::chrono::steady_clock::now();
      if (progress_ && (std::chrono::duration<double>(now - last).count() > 0.5 || s.step == total)) {
        last = now;
        progress_({"train", s, total, elapsed(now)});
      }
    }
    const bool written = comm_->is_root() ? std::filesystem::exists(output_) : true;
    const bool need = total == 0 || (trainer_->current_step() == total &&
                                     parallel::all_reduce_doubles(*comm_, {written ? 0.0 : 1.0})[0] > 0);
    if (need) checkpoint();
    result_.seconds = elapsed(std::chrono::steady_clock::now());
  }

  /// The result, and an error where training learned nothing.
  void finish() {
    result_.steps = trainer_->current_step();
    result_.log = trainer_->log();
    result_.grads = result_.log.empty() ? 0 : result_.log.back().grads;
    result_.comm = comm_->stats();
    result_.shards = trainer_->shards();
    result_.skipped = trainer_->skipped_steps();
    result_.bad_rows = trainer_->bad_rows();
    if (result_.steps > 0 && result_.skipped == result_.steps) {
      throw DataError(fmt::format("training learned nothing: all {} steps were skipped because the gradient was not "
                                  "finite (the density overflows or fails where the proposals go?); the checkpoint {} "
                                  "holds the untrained proposal",
                                  result_.steps, output_));
    }
    // Every proposal of every step met a non-finite energy or gradient (rejected, not trained on):
    // the steps ran but there was nothing to learn from (posteriordb's kilpisjarvi through a flow
    // fitted to a warm-up whose chains had not arrived: 19,264 of 19,264, and `train` had exited 0).
    const int64_t rows = result_.steps * trainer_->options().batch;
    if (result_.steps > 0 && result_.bad_rows >= rows) {
      throw DataError(fmt::format("training learned nothing: all {} proposals of its {} steps met a non-finite energy or "
                                  "gradient and were rejected (the density overflows or fails where the proposals go, "
                                  "or the warm-up ended far from the posterior?); the checkpoint {} holds the untrained "
                                  "proposal",
                                  rows, result_.steps, output_));
    }
  }

  /// Note [The mixing check]: the trained proposal from the training's chains, recorded in the
  /// result and the checkpoint (with the checks that extended training's time, if any).
  void check_mixing() {
    if (distributed_ || (result_.steps == 0 && !from_sampler_) || (should_stop_ && should_stop_())) return;
    // (the check at the first plateau of training from a previous model, where training ended there)
    std::string reused;
    if (extra_.contains("from")) {
      for (const char* c : {"first_check", "check_before_training"}) {
        const json& f = extra_["from"].value(c, json());
        if (f.is_object() && f.value("at_step", int64_t{-1}) == trainer_->current_step()) reused = c;
      }
    }
    // (the check at the plateau or time limit where training stopped: Note [A plateau that does not mix])
    json& stops = result_.time_extensions;
    const bool at_stop = reused.empty() && !stops.empty() &&
                         stops.back().value("at_step", int64_t{-1}) == trainer_->current_step();
    if (at_stop) {
      result_.check = stops.back();
      result_.check.erase("stop");
      stops.erase(stops.size() - 1);  // counted once
    } else {
      result_.check = reused.empty() ? mixing_check() : extra_["from"][reused];
    }
    if (!reused.empty()) extra_["from"].erase(reused);  // counted once
    extra_["check"] = result_.check;
    if (extra_.contains("from")) result_.from = extra_["from"];
    if (!result_.time_extensions.empty()) extra_["time_extensions"] = result_.time_extensions;
    checkpoint();  // the record with the model
  }

  /// Note [Training from a previous model]: after the affine map has moved, no training where the
  /// previous networks fit; then the checkpoint is written as it is ("fits").
  bool previous_model_fits() {
    if (!from_sampler_ || (should_stop_ && should_stop_())) return false;
    json check = mixing_check();
    const bool fits = previous_networks_fit(check, from_meta_);
    extra_["from"]["check_before_training"] = check;
    extra_["from"]["fits"] = fits;
    extra_["from"]["ess_of_previous"] = check["ess_of_previous"];
    extra_["from"]["check_passed"] = check.value("passes", false);
    if (!fits) return false;
    result_.stopped = "fits";
    checkpoint();
    return true;
  }

  /// Gradients spent before step `s` ends: the warm-up's, training's and the checks' (all chains).
  double spent_grads(const TrainStats& s) const {
    double g = result_.preconditioner.is_object() ? result_.preconditioner.value("grads", 0.0) : 0.0;
    g += static_cast<double>(s.grads) * static_cast<double>(trainer_->options().batch);
    for (const json& c : result_.time_extensions) g += c.value("grads", 0.0);
    if (extra_.contains("from")) {
      for (const char* c : {"first_check", "check_before_training"}) {
        if (extra_["from"].contains(c)) g += extra_["from"][c].value("grads", 0.0);
      }
    }
    return g;
  }

  /// One run of Note [The mixing check] (`draws` per chain; a cost probe: fewer, on its own stream):
  /// its record.
  json mixing_check(int64_t draws = 200, SeedStream stream = SeedStream::kMixingCheck, uint64_t index = 0) {
    constexpr int64_t kChains = 64;
    Target& t = space();
    at::Generator gen = make_generator(seed_of(config_.train.seed, stream, index));
    torch::Tensor start = trainer_->chains();
    if (!start.defined()) start = t.sample(kChains, gen);
    start = start.narrow(0, 0, std::min<int64_t>(kChains, start.size(0)));
    auto proposal = std::make_shared<LearnedProposal>(sampler_);
    proposal->set_persistence(kDefaultPersistence);  // as `nmcmc sample` will run it (Note [Persistent noise])
    MetropolisHastings kernel(proposal);
    RunOptions o;
    o.set_chains(start.size(0)).set_warmup(0).set_draws(draws).set_adapt_step(false).set_init_x(start.to(t.options()));
    const int64_t g0 = t.grad_evals();
    const auto t0 = std::chrono::steady_clock::now();
    SampleResult r = run_sampler(t, kernel, o, seed_of(config_.train.seed, stream, index));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const StanSummary s = stan_summary(r.draws.to(torch::kFloat64));
    const torch::Tensor rhat = s.rhat.masked_select(torch::isfinite(s.rhat));
    const double max_rhat = rhat.numel() ? rhat.max().item<double>() : INFINITY;
    const double accept = r.accept_stat.mean().item<double>();
    const torch::Tensor first = r.draws.select(0, 0), last = r.draws.select(0, r.draws.size(0) - 1);  // [C, D]
    const double moved = (first != last).any(1).to(torch::kFloat64).mean().item<double>();
    std::vector<std::string> why;
    const double min_ess = s.ess_bulk.nan_to_num(0).min().item<double>();
    if (!(max_rhat <= 1.1)) why.push_back(fmt::format("max R-hat {:.3g} > 1.1", max_rhat));
    if (!(min_ess >= 100)) why.push_back(fmt::format("min bulk-ESS {:.0f} < 100", min_ess));
    if (!(accept >= 0.05)) why.push_back(fmt::format("accept rate {:.3g} < 0.05", accept));
    if (!(moved >= 0.9)) why.push_back(fmt::format("{:.0f} % of the chains moved", 100 * moved));
    json record = {{"chains", start.size(0)}, {"draws", draws}, {"max_rhat", max_rhat}, {"accept", accept},
                   {"moved", moved}, {"min_ess_bulk", min_ess},
                   // per chain (a batched call counts once), and all chains' together
                   {"grads_per_chain", t.grad_evals() - g0}, {"grads", (t.grad_evals() - g0) * start.size(0)},
                   {"seconds", seconds}, {"passes", why.empty()},
                   {"why", fmt::format("{}", fmt::join(why, "; "))},
                   {"at_step", trainer_->current_step()}};
    if (!why.empty()) record["worst"] = slowest_parameter(r.draws, *target_, latent_.get());
    return record;
  }


  const TrainConfig& config_;
  const std::string output_, log_path_;
  const bool resume_;
  const TrainProgressFn& progress_;
  const std::function<bool()>& should_stop_;
  std::shared_ptr<parallel::Communicator> comm_;
  std::shared_ptr<Target> target_;
  LearnedOptions model_;
  bool distributed_ = false, auto_transport_ = false, with_transport_ = false, resuming_ = false;
  Precondition asked_precondition_ = Precondition::kAuto;
  TrainOptions train_options_;
  TrainResult result_;
  torch::Tensor affine_end_;  // where the affine warm-up left the chains [C, D] float64
  LearnedSampler affine_sampler_{nullptr};
  std::unique_ptr<Trainer> affine_trainer_;
  json affine_record_, auto_record_;
  FlowTransport flow_{nullptr};
  torch::Tensor latent_draws_;  // [S, C, D] float64, the transport warm-up's draws in z
  json transport_record_;
  std::unique_ptr<TransportedTarget> latent_;
  LearnedSampler sampler_{nullptr};
  std::unique_ptr<Trainer> trainer_;
  json extra_;
  LearnedSampler from_sampler_{nullptr};  // Note [Training from a previous model]
  json from_meta_;
  std::optional<WarmStart> from_start_;
  static constexpr int64_t kProbeDraws = 50;  // Note [Training stops when it no longer pays]
  CostWatch cost_{config_.train.budget.ess_goal.value_or(0), config_.train.budget.probe_every};
};

}  // namespace

TrainResult train(const TrainConfig& config, torch::Device device, const std::string& output,
                  const std::string& log_path, bool resume, const TrainProgressFn& progress,
                  const std::function<bool()>& should_stop, std::shared_ptr<parallel::Communicator> comm) {
  return TrainRun(config, device, output, log_path, resume, progress, should_stop, std::move(comm)).run();
}

}  // namespace nmcmc
