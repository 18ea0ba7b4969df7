// `--transport flow`: the fitting rounds, the choice between the flow and its affine base, the final
// warm-up and sampling (Note [Transport warm-up], services/transport.hpp), as the phases of one
// run (Note [Warm-up in phases], kernels/run.hpp): FlowRun is the run's PhaseAdapter, and each
// of its steps is one of the Notes below.
//
// Note [Transient states in the pool]
// The pool holds every state since the second round, and a later fit is warm-started from the
// last. Where the early rounds' states were still partly transient (not far enough out to be
// flagged by Note [Transport warm-up]'s rule) they stay there: on posteriordb's earnings (three
// parameters, nearly Gaussian, a correlation near -1) the base estimated afresh from all the
// pool's states fitted them 164-17,000x worse (held-out Fisher loss) than the base estimated from
// the last two rounds' states fitted theirs, at six seeds of ten; its warm-started fits ended at
// 0.02-0.49 per coordinate and NUTS through the flow got 0.78x the bulk-ESS per gradient of NUTS
// with the low-rank Fisher metric alone (ten seeds). So before each fit from the fourth round on,
// both affine estimates are made (no Adam step; network time only): where the whole pool's is
// more than rules.drift_ratio times worse than the recent one's, the older rounds leave the pool
// and the fit starts afresh from the last two rounds (base estimated, layers from the identity):
// earnings 0.379 -> 0.417 bulk-ESS per gradient (median of ten seeds); it also acted on the worst
// seeds of kidiq's interaction (0.236 -> 0.431, ratio 5,033) and the mixture (0.231 -> 0.533,
// 0.161 -> 0.322; 472 and 627). The threshold is set from measurements, with a narrow margin: on
// sblrc the ratio reached 14-91 at nine seeds of ten, and acting there at 10 cost it 0.258 ->
// 0.218 (a fresh fit loses what the warm-started fits had learned); at 100 it acts on one (155:
// 0.256 -> 0.200). On Funnel-3 it stayed at 2.9 or below (six seeds), as on Funnel-1. The
// summary's rounds record both losses (`drift`) and `dropped_rounds` where it acted. Dropping the
// older rounds always (a pool of the last two), or the second round's states after the fourth,
// moved Funnel-3's neck.
//
// Note [Far out twice]
// The first round (50 iterations from the starting box) is the transient, and a later round in
// the transient is dropped (Note [Transport warm-up]); the chains usually arrive within a round or
// two. Where the first two fits both end far out (above rules.far_out_loss per coordinate), they
// are not arriving: the base fitted from far-out states makes a latent space in which they stay.
// On posteriordb's kilpisjarvi with 16 chains (a correlation near -1; 4 chains arrive) every fit
// of the six rounds ended at the clip (10^4), NUTS ran at step sizes of 1.3-11 on a flat ridge and
// the run ended with R-hat 1.17 after 149 s of warm-up; NUTS alone from the same box arrives in
// 200 iterations with its own metric adaptation (R-hat 1.007 over 200 draws; 100 are too few). So
// the rounds start again, once, with a first round of `arrival_round` iterations in x and a fresh
// base, from new points in the starting box (where the caller gave the starting points, from where
// the chains are); the abandoned rounds count as warm-up (the warm-up runs that many iterations
// longer) and stay in the record (`restarted`). On kilpisjarvi with 16 chains: R-hat 1.001, 58 s
// of warm-up; restarted from where the chains were, the 200-iteration round still ended far out
// (R-hat 1.002, 111 s). In the posteriordb suite with 4 chains (seeds 1-3) two runs of 39 had two
// far-out fits, and their later rounds had arrived after two or three transient rounds:
// restarted, kidiq's interaction got 0.323 bulk-ESS per gradient (0.367 before), kilpisjarvi
// 0.469 (0.392).
//
// Note [Far out after the restart]
// On kilpisjarvi with 16 chains the restarted first round (200 iterations in x) still ended far
// out on one CPU (an Intel Xeon; on an AMD EPYC it arrived: Note [Far out twice]), every later fit
// ended at the clip, and the run ended with R-hat 1.16 after 169 s of warm-up, where NUTS with the
// low-rank Fisher metric alone passes from the box with 300 warm-up iterations (R-hat 1.002, 2 s).
// The fits cannot help where they see no posterior: after a restart whose first round still ends
// far out the transport is given up, and the rest of the warm-up (the rounds not run included)
// runs as a run without transport would, on the target itself from the starting points (or the
// starting box, where stuck chains are redrawn: Note [Starting points that cannot move]) with a
// unit metric, adapting the metric the rounds adapt (`transport.choice.chosen`: none). Continued
// from where the chains were, with the rounds' metric, the same warm-up ended at R-hat 1.31 in
// float32 (648 divergences; 0.042 bulk-ESS per gradient in float64): far-out chains given as
// starting points are never redrawn.
//
// Note [The flow or its affine base]
// The Fisher loss is not what NUTS pays. On posteriordb's kilpisjarvi (three parameters, a
// correlation near -1, nearly Gaussian) the coupling layers cut the held-out loss 4x against the
// affine base alone and yet NUTS through the flow got 0.026 bulk-ESS per gradient, through the
// affine base alone (`--transport-layers 0`) 0.36 (seed 1; NUTS with fisher-lowrank and no
// transport: 0.30-0.41). So after the rounds two candidates are tried with the kernel, each for
// rules.trial_warmup iterations of warm-up (step size and, as in the rounds, the low-rank Fisher
// metric) and rules.trial_draws draws, from the same positions: the fitted flow, and the affine
// map alone with its base estimated afresh from the last fit's points (the low-rank-plus-diagonal
// Fisher estimate, as the first rounds set it). The cheaper goes on: NUTS's gradients per draw (a
// latent space that is far from N(0, I) needs smaller steps and longer trees), or for the kernels
// with a fixed number of gradients per step the inverse of the adapted step size. The affine map
// goes on only when it costs at most rules.affine_if_below of the flow's: the trials see the cost
// of a draw, not how well draws mix, and where the flow helps by mixing (eight schools: 2.7x the
// bulk-ESS per gradient) the two cost the same per draw (6.25 and 6.4 gradients at seed 1), while
// on kilpisjarvi the flow's draws cost twice the affine's (7.4 and 3.7). Each trial also records
// how far its draws move per gradient (`score`: the worst coordinate's mean squared jump between
// consecutive draws in x, over its variance among the last fit's points, per gradient). Choosing
// by that score instead was measured on 13 posteriors (the flow kept at 1.25x the affine map's
// score): it kept the affine map on six, and where the two rules differ the cost rule did as well
// or better on four of four in the same session (low_dim_gauss_mix 0.284 bulk-ESS per gradient
// through the flow against 0.188 through the affine map, whose 20 trial draws had moved farther;
// earnings 0.477 against 0.390): 20 draws' lag-one jumps do not rank two latent spaces by their
// ESS. Both trials come out of the final warm-up (their gradients and seconds are warm-up's; they
// run when at least 100 iterations of it remain: the learned sampler's 500-iteration transport
// warm-up leaves 130), and the final warm-up starts where the chosen trial ended.
// With the affine map kept, a diagonal metric in its latent space cannot correct what its base
// (the last fit's pool) missed: on posteriordb's earnings at seed 2 (rounds 4-6 ended at held-out
// losses of 0.83, 0.88 and 0.49, the pool partly transient) the affine map won the trials and
// NUTS's diagonal metric in its latent space got 0.041 bulk-ESS per gradient, NUTS with
// fisher-lowrank and no transport 0.48; the low-rank Fisher metric there (as the rounds and trials
// adapt it) got 0.527. Over the five runs of 39 that kept the affine map: 0.041 -> 0.527, 0.340 ->
// 0.390, 0.256 -> 0.239, 0.195 -> 0.183, 0.290 -> 0.209. So the final warm-up adapts the low-rank
// Fisher metric there. Through the flow the diagonal metric stays: there the low-rank one left
// Funnel-3's neck under-sampled.
//
// Note [The final metric through the flow]
// The low-rank Fisher metric estimates the latent covariance from gradients, which is sound where
// the latent space is Gaussian (for N(m, S) the gradients' covariance is S^-1) and biased where it
// is not: on Funnel-3 (the last fit's held-out loss 0.016-0.033 per coordinate) it under-sampled
// the neck (x1's sd 3.0-4.6 MCSE low on four seeds of six) where the diagonal metric passed six of
// six. Where the last fit reached its tolerance the latent space is Gaussian to it, and the
// diagonal metric leaves the correlations the flow did not remove (posteriordb's kidiq interaction
// and mixture: 0.76x and 0.83x the best NUTS per gradient with it), so the low-rank Fisher metric
// is adapted there.
//
// Note [A linear residual in the latent space]
// Where the last fit did not reach its tolerance, what it left can be linear: a warm-started fit
// moves a stale affine base slowly (posteriordb's earnings, a correlation near -1: last fits at
// 0.014-0.03 per coordinate where the affine map estimated afresh reaches 0.003). The last fit's
// points, pulled back into the latent space (no target gradient), tell: an affine map estimated
// from them fits them rules.linear_residual_ratio times better than N(0, I) does only where the
// residual is linear - the latent space is Gaussian up to an affine map, and the low-rank Fisher
// metric (the same estimate, adapted over the final warm-up) is sound there. On Funnel-3 the ratio
// was 0.89-1.00 at six seeds (a funnel is not linear), and those runs keep the diagonal metric.
// Measured: earnings over 20 seeds 0.94x -> 1.00x NUTS with fisher-lowrank per seed (it acted on
// 8; 5 faster, 3 slower), kilpisjarvi on 3 of 10 (all faster): level, not clearly ahead.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "nmcmc/core/clock.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/services/transport.hpp"
#include "flow_run.hpp"
#include "seed_streams.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {

/// What one trial of Note [The flow or its affine base] measured.
struct Trial {
  double cost = 0, score = 0, step_size = 0, grads_per_draw = 0;
  int64_t worst = 0;     // the coordinate with the smallest scaled jump
  int64_t divergent = 0;  // divergent transitions among the trial's draws
  torch::Tensor x_end;
};

json trial_record(const Trial& tr) {
  return json{{"cost", tr.cost}, {"score", tr.score}, {"worst_coordinate", tr.worst}, {"step_size", tr.step_size},
              {"grads_per_draw", tr.grads_per_draw}, {"divergent", tr.divergent}};
}

/// A run through the flow as a warm-up in phases (Note [Warm-up in phases], kernels/run.hpp):
/// the fitting rounds, the two trials, the final warm-up and sampling (Note [Transport warm-up]).
class FlowRun : public PhaseAdapter {
 public:
  FlowRun(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t, uint64_t seed,
          const ProgressFn& progress)
      : target_(target), kernel_(kernel), options_(options), t_(t), rules_(t.rules), seed_(seed), progress_(progress),
        d_(target.dim()), lengths_(transport_round_lengths(options, t)),
        flow_(FlowOptions().set_dim(d_).set_layers(t.layers).set_hidden(t.hidden).set_mask_seed(seed).set_engine(t.engine)),
        latent_(target, flow_),
        // The first of two rounds or more runs where T is still the identity and only sets the
        // affine base (Note [Transport warm-up]): on the affine map alone, the same values without
        // a pass through the (identity) coupling layers' graph.
        first_latent_(target, FlowTransport(FlowOptions().set_dim(d_).set_layers(0).set_mask_seed(seed).set_engine(t.engine))),
        rk_(kernel, /*global_moves=*/false),  // global moves once the flow is fitted (Note [Transport warm-up])
        kept_(flow_) {
    if (t.kind != TransportKind::kFlow) throw UsageError("run_with_transport: transport must be flow");
    final_warmup_ = options.warmup - std::accumulate(lengths_.begin(), lengths_.end(), int64_t{0});
  }

  /// The kernel every phase runs: the caller's, with global moves once the fits are done.
  Kernel& kernel() { return rk_; }

  WarmupPhase first() override {
    // Starting points in x (the inner target has the exact sampler, if any), then in z; random
    // ones by Stan's rule, as without a transport: where the density is not finite, drawn again.
    if (options_.init_x.defined()) {
      x_start_ = options_.init_x;
    } else {
      at::Generator gen = make_generator(seed_of(seed_, SeedStream::kStartingPoints));
      x_start_ = finite_starting_points(target_, initial_positions(target_, options_.init, options_.chains, gen),
                                        options_.init, gen);
    }
    return round_phase(0);
  }

  std::optional<WarmupPhase> next(PhaseEnd& ended) override {
    switch (stage_) {
      case Stage::kRound:
        switch (end_round(round_, ended)) {
          case After::kNext:
            if (++round_ < t_.rounds) return round_phase(round_);
            return after_rounds();
          case After::kRestart:
            round_ = 0;  // round 0 again, at its new length
            return round_phase(0);
          case After::kGiveUp:
            abandoned_ = true;
            for (int64_t k = round_ + 1; k < t_.rounds; ++k) final_warmup_ += lengths_[k];
            return after_rounds();
          case After::kStop: return std::nullopt;
        }
        break;
      case Stage::kTrialFlow:
        with_flow_ = trial_end(latent_, ended);
        affine_candidate_->set_engine(t_.engine);
        affine_latent_.emplace(target_, affine_candidate_);
        stage_ = Stage::kTrialAffine;
        return phase(*affine_latent_, rules_.trial_warmup, rules_.trial_draws, seed_of(seed_, SeedStream::kTrialAffine));
      case Stage::kTrialAffine:
        with_affine_ = trial_end(*affine_latent_, ended);
        choose_map();
        return final_phase();
      case Stage::kFinal: break;
    }
    throw std::logic_error("FlowRun::next after the last phase");
  }

  int64_t iterations_before() const override { return offset_; }
  int64_t iterations_planned() const override { return options_.warmup + extra_iterations_; }

  /// The run's flow (the one kept: Note [The flow or its affine base]) and what the phases did.
  void finish(TransportRun& out) const {
    out.flow = kept_;
    if (far_out_) {
      out.far_out = true;
      out.report = {{"kind", t_.kind}, {"layers", t_.layers}, {"rounds", rounds_}, {"fit_seconds", fit_seconds_}, {"far_out", true}};
      return;
    }
    if (stage_ != Stage::kFinal) return;  // stopped before sampling
    out.report = {{"kind", t_.kind},
                  {"layers", t_.layers},
                  {"hidden", t_.hidden},
                  {"rounds", rounds_},
                  {"fit_seconds", fit_seconds_},
                  {"global_moves", t_.global_moves},
                  {"metric_space", "latent"},
                  {"choice", choice_}};
    if (restarted_) {
      out.report["restarted"] = {{"why", "the first two fits ended far out (Note [Far out twice])"},
                                 {"first_round", t_.arrival_round},
                                 {"warmup_iterations", options_.warmup + extra_iterations_}};
    }
    if (t_.global_moves) out.report["global_accept"] = rk_.global_accept();
  }

 private:
  enum class After { kNext, kRestart, kGiveUp, kStop };
  enum class Stage { kRound, kTrialFlow, kTrialAffine, kFinal };

  /// A phase before sampling on `lt`, from where the chains are: the low-rank-plus-diagonal Fisher
  /// metric whatever the final metric (the flow changes between rounds, and the metric from
  /// gradients finds a correlated latent space's shape from a short round: Note [Transport warm-up]).
  WarmupPhase phase(TransportedTarget& lt, int64_t iterations, int64_t draws, uint64_t seed) const {
    WarmupPhase ph;
    ph.target = &lt;
    ph.iterations = iterations;
    ph.draws = draws;
    ph.metric = options_.metric != MetricAdapt::kUnit && kernel_.has_dense_metric() ? MetricAdapt::kFisherLowRank
                                                                                     : options_.metric;
    ph.seed = seed;
    ph.init_x = lt.to_latent(x_start_);
    return ph;
  }

  /// Fitting round r: its chains run, and one draw after its warm-up.
  WarmupPhase round_phase(int64_t r) {
    stage_ = Stage::kRound;
    const bool affine_round = r == 0 && t_.rounds >= 2;
    return phase(affine_round ? first_latent_ : latent_, lengths_[r], 1,
                 seed_of(seed_, restarted_ ? SeedStream::kRestartedRound : SeedStream::kRound, r));
  }

  /// The fit's points: the pool's, the most recent max_points of them.
  std::pair<torch::Tensor, torch::Tensor> pool_points() const {
    torch::Tensor x = torch::cat(pool_x_), g = torch::cat(pool_g_);
    if (x.size(0) > t_.max_points) {
      x = x.slice(0, x.size(0) - t_.max_points);
      g = g.slice(0, g.size(0) - t_.max_points);
    }
    return {x, g};
  }
  void add_to_pool(const torch::Tensor& xs, const torch::Tensor& gxs) {
    pool_x_.push_back(xs);
    pool_g_.push_back(gxs);
    pool_rows_ += xs.size(0);
    while (pool_x_.size() > 1 && pool_rows_ - pool_x_.front().size(0) >= t_.max_points) {
      pool_rows_ -= pool_x_.front().size(0);
      pool_x_.erase(pool_x_.begin());
      pool_g_.erase(pool_g_.begin());
    }
  }
  void clear_pool() {
    pool_x_.clear();
    pool_g_.clear();
    pool_rows_ = 0;
  }

  std::pair<FlowTransport, FitReport> affine_estimate(const torch::Tensor& x, const torch::Tensor& g,
                                                      uint64_t fit_seed) const {
    return transport_affine_estimate(d_, t_.fit, x, g, seed_, fit_seed);
  }

  /// Note [Transient states in the pool]: from the fourth round on, the older rounds leave the
  /// pool where the whole pool's affine estimate fits much worse than the last two rounds'.
  json check_drift(int64_t r, torch::Tensor& px, torch::Tensor& pg) {
    if (t_.layers <= 0 || pool_x_.size() < 3) return json();
    const size_t k = pool_x_.size();
    torch::Tensor rx = torch::cat({pool_x_[k - 2], pool_x_[k - 1]}), rg = torch::cat({pool_g_[k - 2], pool_g_[k - 1]});
    const FitReport fa_all = affine_estimate(px, pg, seed_of(seed_, SeedStream::kFit, r)).second;
    const FitReport fa_recent = affine_estimate(rx, rg, seed_of(seed_, SeedStream::kFit, r)).second;
    fit_seconds_ += fa_all.seconds + fa_recent.seconds;
    json drift = {{"affine_all", fa_all.loss_end}, {"affine_recent", fa_recent.loss_end}};
    if (fa_all.loss_end > rules_.drift_ratio * fa_recent.loss_end) {
      drift["dropped_rounds"] = int64_t(k - 2);
      pool_x_.erase(pool_x_.begin(), pool_x_.end() - 2);
      pool_g_.erase(pool_g_.begin(), pool_g_.end() - 2);
      pool_rows_ = rx.size(0);
      std::tie(px, pg) = pool_points();
      fresh_base_ = true;
      flow_->reset_layers();
    }
    return drift;
  }

  /// The flow's fit after round r (the first of several: the base alone).
  FitReport fit_round(int64_t r, bool affine_round, const torch::Tensor& px, const torch::Tensor& pg) {
    FitOptions f = t_.fit;
    f.init_base = fresh_base_;
    if (affine_round) f.steps = 0;
    f.seed = seed_of(seed_, SeedStream::kFit, r);
    if (progress_) {
      // Progress phase "fit": iteration = the fit's step, accept = its held-out Fisher loss.
      const auto t_fit = Clock::now();
      f.progress = [this, t_fit](int64_t step, int64_t steps, double loss) {
        Progress q;
        q.phase = "fit";
        q.iteration = step;
        q.total = steps;
        q.accept = loss;
        q.elapsed = seconds_since(t_fit);
        progress_(q);
      };
    }
    FitReport fr = fit_transport(*flow_, px, pg, f);
    last_px_ = px;
    last_pg_ = pg;
    last_loss_ = fr.loss_end;
    fit_seconds_ += fr.seconds;
    return fr;
  }

  /// Note [Transport warm-up]: a later round (not the last) whose fit's held-out loss is still
  /// above rules.transient_loss per coordinate ran in the transient too: its coupling layers are
  /// dropped, the base is estimated from its states alone, its states leave the pool, and the next
  /// fit estimates the base afresh.
  bool drop_if_transient(int64_t r, bool affine_round, const FitReport& fr, const torch::Tensor& xs,
                         const torch::Tensor& gxs) {
    const bool transient = !affine_round && r + 1 < t_.rounds && !(fr.loss_end <= rules_.transient_loss);
    if (transient) {
      flow_->reset_layers();
      if (xs.size(0) >= 8) {
        FitOptions fb = t_.fit;
        fb.steps = 0;
        fb.init_base = true;
        fb.progress = nullptr;
        fit_transport(*flow_, xs, gxs, fb);
      }
    }
    fresh_base_ = affine_round || transient;
    if (fresh_base_) clear_pool();
    return transient;
  }

  /// Note [Far out twice]: the rounds start again once, from round 0 at its new length.
  void restart() {
    restarted_ = true;
    rounds_.back()["restarted_after"] = true;
    flow_->reset_layers();
    clear_pool();
    fresh_base_ = true;
    extra_iterations_ += lengths_[1] + t_.arrival_round;  // rounds 0 and 1 ran, then round 0 at its new length
    lengths_[0] = t_.arrival_round;
    if (!options_.init_x.defined()) {  // from the box again, fresh points
      at::Generator gen = make_generator(seed_of(seed_, SeedStream::kRestartStartingPoints));
      x_start_ = finite_starting_points(target_, initial_positions(target_, options_.init, options_.chains, gen), options_.init, gen);
    }
  }

  /// Fitting round r ended: its states pooled, the flow fitted; what comes next.
  After end_round(int64_t r, PhaseEnd& ended) {
    const bool affine_round = r == 0 && t_.rounds >= 2;
    TransportedTarget& round_latent = affine_round ? first_latent_ : latent_;
    const SampleResult& rr = ended.result;
    torch::Tensor zs = ended.x, gzs = ended.grad;
    offset_ += lengths_[r];
    if (r == 0) {  // the transient from the starting points
      const int64_t rows = zs.size(0);
      zs = zs.slice(0, rows / 2);
      gzs = gzs.slice(0, rows / 2);
    }
    auto [xs, gxs] = round_latent.ambient_pairs(zs, gzs);
    add_to_pool(xs, gxs);
    auto [px, pg] = pool_points();
    x_start_ = round_latent.to_ambient(rr.draws[rr.draws.size(0) - 1]);  // the chains' last positions, in x
    const json drift = affine_round ? json() : check_drift(r, px, pg);
    const FitReport fr = fit_round(r, affine_round, px, pg);
    const bool transient = drop_if_transient(r, affine_round, fr, xs, gxs);
    rounds_.push_back({{"iterations", lengths_[r]},
                       {"step_size", rr.step_size},
                       {"grads_per_chain", rr.grads_warmup + rr.grads_sampling},
                       {"fit", to_json_value(fr)},
                       {"transient", transient}});
    if (!drift.is_null()) rounds_.back()["drift"] = drift;
    if (affine_round) first_loss_ = fr.loss_end;
    if (r == 1 && t_.arrival_round > 0 && !restarted_ && !(first_loss_ <= rules_.far_out_loss) &&
        !(fr.loss_end <= rules_.far_out_loss)) {
      restart();
      return After::kRestart;
    }
    if (t_.give_up_far_out && restarted_ && affine_round && !(fr.loss_end <= rules_.far_out_loss)) {
      return After::kGiveUp;  // Note [Far out after the restart]
    }
    if (affine_round && t_.far_out_loss > 0 && !(fr.loss_end <= t_.far_out_loss)) {
      far_out_ = true;  // the chains have not arrived: the caller starts again elsewhere (TransportOptions::far_out_loss)
      return After::kStop;
    }
    return After::kNext;
  }

  /// What a trial of Note [The flow or its affine base] on `lt` measured.
  Trial trial_end(TransportedTarget& lt, const PhaseEnd& ended) {
    const SampleResult& rr = ended.result;
    Trial tr;
    offset_ += rules_.trial_warmup + rules_.trial_draws;
    tr.step_size = rr.step_size;
    if (rr.divergent.defined()) tr.divergent = rr.divergent.sum().item<int64_t>();
    tr.grads_per_draw = double(rr.grads_sampling) / double(rules_.trial_draws);
    tr.cost = per_chain_ ? tr.grads_per_draw : 1.0 / std::max(rr.step_size, 1e-300);
    if (!std::isfinite(tr.cost)) tr.cost = std::numeric_limits<double>::infinity();
    // The draws in x [S, C, D]; squared jumps between consecutive draws, per coordinate.
    const int64_t n = rr.draws.size(0), c = rr.draws.size(1);
    const torch::Tensor x = lt.to_ambient(rr.draws.reshape({n * c, d_})).to(torch::kFloat64).reshape({n, c, d_});
    const torch::Tensor jump = (x.narrow(0, 1, n - 1) - x.narrow(0, 0, n - 1)).pow(2).mean(std::vector<int64_t>{0, 1}) / scale_;  // [D]
    const auto [worst, at] = jump.min(0);
    tr.worst = at.item<int64_t>();
    tr.score = worst.item<double>() / std::max(tr.grads_per_draw, 1e-300);
    if (!std::isfinite(tr.score)) tr.score = 0;
    tr.x_end = lt.to_ambient(rr.draws[n - 1]);  // the last draws mapped as before (one batch of C rows): the same bits
    return tr;
  }

  /// The rounds are done: the trials of Note [The flow or its affine base], where they run, or the
  /// final phase (Note [Far out after the restart]: none).
  WarmupPhase after_rounds() {
    rk_.set_global_moves(t_.global_moves);  // the fits are done: the flow is what the trials and the sampling use
    const int64_t trials = 2 * (rules_.trial_warmup + rules_.trial_draws);
    choice_ = {{"chosen", "flow"}};
    if (abandoned_) {
      kept_ = FlowTransport(FlowOptions().set_dim(d_).set_layers(0).set_mask_seed(seed_).set_engine(t_.engine));  // the identity
      affine_latent_.emplace(target_, kept_);
      choice_ = {{"chosen", "none"}, {"why", "the restarted first round still ended far out (Note [Far out after the restart])"}};
      return final_phase();
    }
    if (!(t_.layers > 0 && t_.rounds >= 2 && final_warmup_ - trials >= 100)) {
      if (t_.layers > 0) choice_["not_tried"] = "the warm-up is too short for the trials (or one round only)";
      return final_phase();
    }
    std::tie(affine_candidate_, affine_fit_) = affine_estimate(last_px_, last_pg_, seed_of(seed_, SeedStream::kAffineCandidate));
    per_chain_ = kernel_.max_tree_depth() > 0;  // NUTS: gradients per draw vary
    // One scale per coordinate for both trials' scores: the variance among the last fit's points.
    scale_ = last_px_.to(torch::kFloat64).var(0, /*unbiased=*/true).clamp_min(1e-300);
    stage_ = Stage::kTrialFlow;
    return phase(latent_, rules_.trial_warmup, rules_.trial_draws, seed_of(seed_, SeedStream::kTrialFlow));
  }

  /// Note [The flow or its affine base]: both trials ran from the same positions; the cheaper map goes on.
  void choose_map() {
    const int64_t trials = 2 * (rules_.trial_warmup + rules_.trial_draws);
    const bool use_affine = with_affine_.cost <= rules_.affine_if_below * with_flow_.cost;
    choice_ = {{"chosen", use_affine ? "affine" : "flow"},
               {"cost", per_chain_ ? "gradients per draw" : "1 / step size"},
               {"affine_if_below", rules_.affine_if_below},
               {"score", "recorded, not used: min over coordinates of the mean squared jump / the fit points' variance, "
                         "per gradient"},
               {"flow", trial_record(with_flow_)},
               {"affine", trial_record(with_affine_)},
               {"iterations", trials},
               {"affine_loss", affine_fit_.loss_end}};
    final_warmup_ -= trials;
    if (use_affine) {
      kept_ = affine_candidate_;
      x_start_ = with_affine_.x_end;
    } else {
      affine_latent_.reset();
      x_start_ = with_flow_.x_end;
    }
  }

  /// The final warm-up's metric: Note [Far out after the restart], Note [The flow or its affine
  /// base], Note [The final metric through the flow], Note [A linear residual in the latent space].
  MetricAdapt final_metric() {
    const bool diag = options_.metric == MetricAdapt::kDiag && kernel_.has_dense_metric();
    std::optional<LatentResidual> residual;
    if (!affine_latent_ && t_.layers > 0 && last_px_.defined() && diag && last_loss_ > t_.fit.tolerance) {
      residual = latent_residual(latent_, last_px_, last_pg_, seed_of(seed_, SeedStream::kLatentResidual));
      choice_["latent_residual"] = {{"flow_loss", residual->flow_loss}, {"affine_loss", residual->affine_loss},
                                    {"ratio", residual->ratio()}};
    }
    if (abandoned_ && diag) {
      choice_["final_metric"] = "fisher-lowrank (no transport: the metric the rounds adapt)";
    } else if (affine_latent_ && diag) {
      choice_["final_metric"] = "fisher-lowrank (the affine map kept: a diagonal metric cannot correct its base)";
    } else if (!affine_latent_ && t_.layers > 0 && diag && last_loss_ <= t_.fit.tolerance) {
      choice_["final_metric"] = "fisher-lowrank (the last fit reached its tolerance: the latent space is Gaussian to it)";
    } else if (residual && residual->ratio() >= rules_.linear_residual_ratio) {
      choice_["final_metric"] = "fisher-lowrank (an affine map fits the latent points " +
                                fmt::format("{:.3g}", residual->ratio()) + "x better than N(0, I): the latent space is Gaussian up to it)";
    } else {
      return options_.metric;
    }
    return MetricAdapt::kFisherLowRank;
  }

  /// The final warm-up and sampling on the map kept; the run loop maps the draws to x.
  WarmupPhase final_phase() {
    stage_ = Stage::kFinal;
    TransportedTarget& final_latent = affine_latent_ ? *affine_latent_ : latent_;
    WarmupPhase ph;
    ph.target = &final_latent;
    ph.iterations = final_warmup_;
    ph.metric = final_metric();
    ph.seed = seed_;
    ph.sampling = true;
    if (abandoned_) {
      // Note [Far out after the restart]: as a run without transport starts, so that the rounds'
      // far-out positions and metric leave nothing behind.
      ph.init_x = options_.init_x;
      if (kernel_.has_metric()) rk_.set_metric(Metric());
    } else {
      ph.init_x = final_latent.to_latent(x_start_);
    }
    rk_.reset_global();
    return ph;
  }

  Target& target_;
  Kernel& kernel_;
  const RunOptions& options_;
  const TransportOptions& t_;
  const TransportRules& rules_;
  const uint64_t seed_;
  const ProgressFn& progress_;
  const int64_t d_;
  std::vector<int64_t> lengths_;
  FlowTransport flow_;
  TransportedTarget latent_, first_latent_;
  TransportKernel rk_;
  FlowTransport kept_;                               // the map the run samples through
  std::optional<TransportedTarget> affine_latent_;  // the map kept where it is not the flow
  Stage stage_ = Stage::kRound;
  int64_t round_ = 0;
  int64_t final_warmup_ = 0;
  torch::Tensor x_start_;  // where the next phase starts, in x
  int64_t offset_ = 0;     // warm-up iterations before the phase now running (progress)
  int64_t extra_iterations_ = 0;  // Note [Far out twice]: the rounds' iterations beyond options.warmup
  bool restarted_ = false;
  bool abandoned_ = false;  // Note [Far out after the restart]
  bool far_out_ = false;    // TransportOptions::far_out_loss: the run ended after the first round
  bool fresh_base_ = true;  // the next fit estimates the base afresh: the first, and after a round that left the pool
  double first_loss_ = 0;   // the first round's fit
  std::vector<torch::Tensor> pool_x_, pool_g_;
  int64_t pool_rows_ = 0;
  torch::Tensor last_px_, last_pg_;  // the last fit's points (Note [The flow or its affine base])
  double last_loss_ = std::numeric_limits<double>::infinity();  // the last fit's held-out loss
  // Note [The flow or its affine base]: the affine candidate, the trials' common scale and cost rule, their results
  FlowTransport affine_candidate_{nullptr};
  FitReport affine_fit_;
  torch::Tensor scale_;
  bool per_chain_ = false;
  Trial with_flow_, with_affine_;
  json rounds_ = json::array();
  json choice_;
  double fit_seconds_ = 0;
};

}  // namespace

TransportRun run_flow_transport(Target& target, Kernel& kernel, const RunOptions& options, const TransportOptions& t,
                                uint64_t seed, const ProgressFn& progress) {
  FlowRun flow(target, kernel, options, t, seed, progress);
  TransportRun out;
  out.result = run_in_phases(target, flow.kernel(), options, flow, seed, progress);
  flow.finish(out);
  return out;
}

}  // namespace nmcmc
