#pragma once
/// A run on the target pulled back through a flow transport fitted during warm-up
/// (Note [Flow transport], flows/transport.hpp): `nmcmc sample --transport flow`, `compare`.
//
// Note [Transport warm-up]
// Warm-up is split (one run, in phases: Note [Warm-up in phases], kernels/run.hpp): the first
// `fit_fraction` of it runs in rounds of doubling length (NUTS, HMC
// or MALA with their usual step-size and metric adaptation - the fisher-lowrank metric when the
// run adapts one and the kernel takes it - each round from where the last one ended). The first
// round is the transient from the starting points: the second half of its states sets only the
// flow's affine base (the Fisher estimate) and is then dropped (with one round, its second half is
// fitted as below). After each later round the flow is fitted again (its base re-estimated after
// the second round, then warm-started) to every state the chains have visited since the first -
// positions and energy gradients, stored as the kernel carries them, mapped back to x without a
// target evaluation (TransformedTarget::ambient_pairs, core/transform.hpp). Coupling layers fitted to transient states
// far in the tails (a time series' first states, 100+ posterior sds out) made latent spaces in
// which NUTS needed 100x smaller steps. A later round can still be in the transient (kidiq's
// interaction regression at seed 1: the chains took about 130 iterations to arrive, and its
// second to fifth rounds ran NUTS at step sizes of 6e-4 to 7e-3 in latent spaces fitted to
// transient states, 1.7 x 10^5 gradients per chain): when a round's fit (not the last one's)
// ends with a held-out loss above rules.transient_loss per coordinate, its coupling layers are reset
// to the identity, the base is estimated from that round's states alone, its states leave the
// pool and the next fit estimates the base afresh (as after the first round). The summary's
// rounds say `transient` where this happened. The states of round r live
// in the latent space of flow r, so draws from the current latent space feed the next fit. Then T
// is fixed, the rest of the warm-up adapts the step size and metric in the latent space, and the
// draws are mapped back, x = T(z), with lp = -U(x). Everything before the first kept draw -
// every round's gradients, the fits' seconds - is warm-up in the result (all-in accounting).
//
// Global moves: with `global_moves`, every step of the kernel is followed by an independence
// Metropolis-Hastings step from N(0, I) in the latent space (the flow's pushforward in x): it
// is exact for the pulled-back density whatever the flow, and can jump between modes that the
// local kernel cannot cross. It costs one gradient per chain and step; the step-size adaptation
// sees the local kernel's accept statistics only. They start once the fits are done (the trials,
// the final warm-up and sampling), not in the fitting rounds: there every chain jumped to where
// the current flow put its mass and the next fit saw only those states - on posteriordb's
// low-dimensional Gaussian mixture without its ordering (two labellings of equal weight) all 8
// chains ended in one labelling and stayed (R-hat 1.001, the other half of the posterior never
// drawn), where the rounds without them fitted a flow joining both.
//
// Progress: the rounds report phase "warmup" (iterations of the whole warm-up); each fit reports
// phase "fit" with iteration = its Adam step, total = its most steps, and `accept` holding the
// held-out Fisher loss.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "nmcmc/core/enum_names.hpp"
#include "nmcmc/core/json.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/kernel.hpp"
#include "nmcmc/kernels/run.hpp"
#include "nmcmc/kernels/proposal.hpp"
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// kAuto: the choice between the affine map (training) or no transport (sampling: the kernel's
/// metric) and a flow, by how far the best affine map leaves the posterior from a Gaussian
/// (Note [Choosing the transport]).
enum class TransportKind { kNone, kFlow, kAuto };
template <>
struct EnumNames<TransportKind> {
  static constexpr const char* what = "transport";
  static std::vector<std::pair<TransportKind, const char*>> values() {
    return {{TransportKind::kNone, "none"}, {TransportKind::kFlow, "flow"}, {TransportKind::kAuto, "auto"}};
  }
};
NMCMC_ENUM_JSON(TransportKind)

/// The fits during `nmcmc sample`'s and `compare`'s transported warm-up (Note [Transport warm-up]).
/// Six since the native pass made the rounds cheap: on Funnel-3 (x1's mean and sd within 3 MCSE,
/// R-hat < 1.01) six passed 3 seeds of 3 and 2 of 3 in two measurements, four 1 of 3 in both;
/// on 13 posteriordb posteriors six gave a median 1.09x the best NUTS's bulk-ESS per gradient
/// (ahead on 10) where four gave 1.04x (ahead on 8).
/// `nmcmc train`'s shorter warm-up keeps four (kTrainTransportRounds, services/train.hpp).
constexpr int64_t kDefaultTransportRounds = 6;
constexpr int64_t kDefaultTransportLayers = 8;
/// Note [Far out twice]: the first round's length when the rounds start again.
constexpr int64_t kDefaultArrivalRound = 200;

/// The thresholds that decide the transport's path, each documented once, with its default; a
/// run takes them from TransportOptions::rules. The defaults were set from measurements on
/// posteriordb's posteriors and the funnels (the Notes named say which).
struct TransportRules {
  /// Note [Transport warm-up]: the first round's least length, in iterations. At 17 (train's
  /// 500-iteration warm-up, four rounds) the base fitted to kilpisjarvi's first states (a
  /// correlation near -1) put the next round at step sizes of 5e-4; at 50 it arrives.
  int64_t first_round = 50;
  /// Note [Transport warm-up]: a fit's held-out Fisher loss per coordinate above which its round
  /// counts as transient. A score error as large as N(0, I)'s own score (about 1 per coordinate)
  /// means the fit does not describe the states; where the chains had arrived, fits from the
  /// second round on ended at 0.54 or less on 13 posteriordb posteriors and 0.36 or less on
  /// Funnel-1 and Funnel-3 (three seeds), and kidiq's interaction's transient rounds at 2.6-8,300.
  double transient_loss = 1.0;
  /// Note [Far out twice]: the first round's fit (per coordinate) above which the chains had not
  /// arrived: where they had, it ended at 4.5 or less (Funnel-3 at six seeds 2.2-4.5; posteriordb
  /// 0.03-3.7 with NUTS's 4 chains), where not at 14.7-10,000 (sblrc, earnings, kidiq's
  /// regressions; kilpisjarvi with 16 chains).
  double far_out_loss = 10.0;
  /// Note [Transient states in the pool]: the ratio of the whole pool's affine loss to the last
  /// two rounds' above which the older rounds leave the pool.
  double drift_ratio = 100.0;
  /// Note [The flow or its affine base]: each trial's warm-up and draws, and the share of the
  /// flow's cost below which the affine map is kept.
  int64_t trial_warmup = 40;
  int64_t trial_draws = 20;
  double affine_if_below = 0.75;
  /// Note [A linear residual in the latent space]: the ratio above which the final warm-up
  /// through the flow adapts the low-rank Fisher metric. Funnel-3's last fits at six seeds:
  /// 0.89-1.00; posteriordb's earnings 1.5-11.3 at 8 seeds of 20, kilpisjarvi 2.1-6.8 at 3 of 10.
  double linear_residual_ratio = 1.5;
  /// Note [Choosing the transport]: the Fisher divergence per dimension of the best affine map
  /// above which the flow is chosen, the most rows it is measured on, and (sampling) the least
  /// number of warm-up iterations watched before it decides.
  double flow_fisher_per_dim = 0.15;
  int64_t fisher_rows = 1024;
  int64_t auto_watch_min = 100;
};

/// Note [A linear residual in the latent space] (services/transport.cpp): the last fit's points
/// in the flow's latent space, their Fisher loss per coordinate against N(0, I) (flow_loss), and
/// after the affine map estimated from them (affine_loss; the low-rank-plus-diagonal Fisher
/// estimate, no Adam step; both over all the points).
struct LatentResidual {
  double flow_loss = 0, affine_loss = 0;
  /// How many times better the affine map fits them (0 where the flow's loss is 0).
  double ratio() const { return flow_loss > 0 ? flow_loss / std::max(affine_loss, 1e-300) : 0.0; }
};
LatentResidual latent_residual(const TransportedTarget& latent, const torch::Tensor& x, const torch::Tensor& g,
                               uint64_t seed);

/// Note [Transport warm-up].
struct TransportOptions {
  TransportKind kind = TransportKind::kFlow;
  int64_t layers = kDefaultTransportLayers;  // coupling layers
  int64_t hidden = 0;            // their width (0: clamp(2 D, 32, 64))
  int64_t rounds = kDefaultTransportRounds;  // fits during warm-up
  double fit_fraction = 0.5;     // of the warm-up spent in the fitting rounds
  int64_t max_points = 16000;    // the most recent states kept for fitting
  bool global_moves = false;     // independence proposals from the flow after every step
  Engine engine = Engine::kAuto;  // the flow's passes (Note [Native copies]); libtorch: with fit.own_gradient false
  FitOptions fit;
  /// Above 0: when the first round's fit (the affine base from its states) ends above this
  /// held-out loss per coordinate, the run stops there with TransportRun::far_out set (the
  /// chains have not arrived; Note [The transported warm-up starts at the posterior],
  /// services/train.cpp). 0: it goes on.
  double far_out_loss = 0;
  /// Above 0: when the first two rounds' fits both end above rules.far_out_loss per coordinate, the
  /// rounds start again once, from where the chains are, with a first round of this many
  /// iterations (Note [Far out twice], services/transport.cpp). 0: they go on.
  int64_t arrival_round = kDefaultArrivalRound;
  /// Where the restarted first round still ends far out, give the transport up: the rest of the
  /// warm-up runs on the target itself (Note [Far out after the restart], services/transport.cpp).
  /// false: the rounds go on (training, which needs a map to train in, and has its own restart).
  bool give_up_far_out = true;
  TransportRules rules;
};

/// Note [The transport's options]
/// What a user chooses of the flow transport, the same on every command that has one: `nmcmc
/// sample` and `compare` (--transport, --transport-layers, --transport-rounds, --global-moves),
/// `nmcmc train` (the same but --global-moves; a config's "transport" section), and Python's
/// keyword arguments of the same names. In JSON either the kind alone ("flow") or an object
/// ({"kind": "flow", "layers": 4}). Unset numbers take the command's default: kDefaultTransportLayers
/// coupling layers, conditioners of width clamp(2 D, 32, 64), and kDefaultTransportRounds fits
/// (training's shorter warm-up: kTrainTransportRounds, services/train.hpp). The run's
/// TransportOptions are made from it by transport_options(); what stays fixed - the fits' settings,
/// the rounds' thresholds (TransportRules) - is not a user's choice.
struct TransportChoice {
  TransportKind kind = TransportKind::kNone;
  std::optional<int64_t> layers;  // coupling layers (0: the affine base map only)
  std::optional<int64_t> hidden;  // their width (0: clamp(2 D, 32, 64))
  std::optional<int64_t> rounds;  // fits during the warm-up
  bool global_moves = false;      // sampling: an independence move from the flow after every step
  Engine engine = Engine::kAuto;  // the flow's passes and fit (Note [Native copies])
  TransportChoice& set_kind(TransportKind k) { kind = k; return *this; }
  TransportChoice& set_layers(int64_t k) { layers = k; return *this; }
  TransportChoice& set_rounds(int64_t r) { rounds = r; return *this; }
  TransportChoice& set_global_moves(bool on) { global_moves = on; return *this; }
};
/// Every key, unset numbers as null (so that a struct's JSON names every option it knows).
void to_json(nlohmann::json& j, const TransportChoice& c);
/// A kind alone ("flow") or an object of the keys above; UsageError on anything else.
void from_json(const nlohmann::json& j, TransportChoice& c);
/// Note [The transport's options]: the rules of one choice, written once - layers, hidden, rounds
/// and global moves go with kind flow or auto; layers and hidden are non-negative, rounds at least 1;
/// global moves only where the command samples (`sampling`). UsageError with `what` (the command)
/// and the first broken rule.
void check_transport_choice(const TransportChoice& c, bool sampling, const std::string& what);
/// A run's options from the choice; `default_rounds` where it sets none. The fit's gradient is the
/// flow's own unless the engine is libtorch (Note [Native copies]).
TransportOptions transport_options(const TransportChoice& c, int64_t default_rounds);

/// A kernel on a transported target: runs `inner`; with global moves follows every step with an
/// independence MH step from N(0, I) (Note [Transport warm-up]). Everything else is the inner
/// kernel's.
class TransportKernel : public TuningFrom<Kernel> {
 public:
  TransportKernel(Kernel& inner, bool global_moves) : inner_(&inner), global_(global_moves) {}
  /// Global moves on or off from the next step.
  void set_global_moves(bool on) { global_ = on; }
  std::string name() const override { return inner_->name(); }
  ChainState init(Target& target, const torch::Tensor& x) const override { return inner_->init(target, x); }
  std::pair<ChainState, StepInfo> step(Target& target, const ChainState& state, at::Generator& gen) override;
  int64_t max_tree_depth() const override { return inner_->max_tree_depth(); }
  torch::Tensor probe_accept(Target& target, const ChainState& state, at::Generator& gen) override {
    return inner_->probe_accept(target, state, gen);
  }

  /// Accepted fraction of the global moves since reset_global().
  double global_accept() const { return global_tries_ ? double(global_accepts_) / double(global_tries_) : 0.0; }
  void reset_global() { global_tries_ = global_accepts_ = 0; }

 protected:
  Tunable& tuned() const override { return *inner_; }
  /// The global move's proposal: normal_independence_proposal (tests replace it with broken ones).
  virtual ProposalResult global_proposal(Target& target, const ChainState& state, at::Generator& gen) const;

 private:
  Kernel* inner_;
  bool global_;
  int64_t global_tries_ = 0, global_accepts_ = 0;
};

/// Note [Choosing the transport]
/// `nmcmc train` without a config (and nmcmc.train(target)) has transport "auto": it runs the
/// affine preconditioner's warm-up as before and then measures how far the best affine map could
/// take the posterior from N(0, I): for the Gaussian N(m, L L^T) with the mean and covariance of
/// the warm-up's last draws (up to TransportRules::fisher_rows), the Fisher divergence per dimension
/// E||L^T grad U(x) - L^-1 (x - m)||^2 / D; 0 for a Gaussian target (the whitened gradient is
/// then the whitened point), and unchanged by any affine map of x, so a badly scaled or strongly
/// correlated posterior is not mistaken for a curved one. (The warm-up's own metric is no
/// yardstick: Stan's regularisation of a dense metric leaves kilpisjarvi's near-singular
/// covariance unwhitened, a divergence of 400 where the draws' own covariance gives 0.04.) Above
/// TransportRules::flow_fisher_per_dim no affine map whitens the posterior, and the learned proposal trains in a
/// flow transport's latent space (its warm-up fitted next; the affine warm-up's gradients and
/// seconds are counted in the record, "auto"); else it trains on the affine map, with nothing spent
/// beyond one batched gradient. On posteriordb's reference draws the divergence is 0.007-0.6 per
/// dimension on 15 of the 16 posteriors (GARCH 0.6, eight schools 0.19) and 6.1 on the latent
/// Gaussian process, the one the affine learned sampler fails; from the warm-up's draws (seeds 1
/// and 2) GARCH 0.52-0.74, eight schools 0.20-0.24, mesquite's logvash 0.08-0.09 (the next below),
/// kilpisjarvi 0.04-0.05 and the latent GP 5.3-7.9. The threshold was 2 until the flow's fits
/// became cheap (Note [The flow's native pass], Note [The fit's own gradient]); at 0.15 eight schools and GARCH train in the flow's latent space too, where the affine
/// learned sampler was at its weakest: eight schools failed the moment checks at 3 of 8 seeds
/// (R-hat 1.011-1.015, 0.09-0.12 bulk-ESS per gradient) and passes through the flow (0.33-0.63),
/// GARCH 0.14-0.24 -> 0.49-0.64 per gradient and less all-in time; on logvash and logvolume
/// (0.05-0.09) the flow cost more than it gave. A distributed run keeps the affine map (the flow trains in one process).
///
/// `nmcmc sample` and `compare` with `--transport auto` (NUTS, HMC, MALA) make the same choice
/// from their own warm-up (run_with_transport): the run starts as one without a transport would,
/// with the same seed, and watches the first quarter of its warm-up (at least TransportRules::auto_watch_min
/// iterations): the divergence of that stretch's second half (the positions and gradients the
/// kernel carries: no extra gradient; the last TransportRules::fisher_rows rows) decides at its end. At or below
/// TransportRules::flow_fisher_per_dim (or where it cannot be measured: fewer draws than D + 1, or draws spanning
/// fewer than D directions) the run goes on: its draws are those of `--transport none`, bit for
/// bit. Above it the run stops there and the whole `--transport flow` run follows, from the
/// starting box with the same seed (its draws are those of `--transport flow`), and the watched
/// stretch's gradients and seconds are counted in its warm-up (all-in). The summary's transport
/// record says which (`auto`).
/// Why not the flow everywhere: on the 13 small posteriordb posteriors NUTS through the flow
/// costs 1.5-20x the best NUTS's seconds to 10,000 effective draws (the fits), for a per-gradient gain of
/// 0.89-1.6x; on the three above the threshold (eight schools, GARCH, the latent GP) it gains
/// 2.5-80x per gradient.
/// That divergence at draws x [N, D] for the affine map x = mean(x) + L z (NaN with < 2 finite rows).
double affine_fisher_per_dim(Target& target, const torch::Tensor& x, const torch::Tensor& l);
/// The same with L the Cholesky factor of the draws' covariance (NaN where it has none: fewer
/// finite rows than D + 1, or draws that span fewer than D directions).
double gaussian_fisher_per_dim(Target& target, const torch::Tensor& x);
/// The same from draws x [N, D] and their energy gradients grad_u [N, D] (dU/dx) as a run holds
/// them: no gradient is computed (rows where either is not finite are left out).
double gaussian_fisher_per_dim(const torch::Tensor& x, const torch::Tensor& grad_u);

/// Note [The affine map's noise]
/// The divergence above, measured with the map fitted to the same N draws, is not zero for a
/// Gaussian posterior: a covariance estimated from N draws in D dimensions leaves about D / N_eff
/// per dimension, N_eff the draws' effective number (0.099 at D = 100 from 1,024 independent
/// draws; 0.24 from the warm-up's 1,024 autocorrelated ones of a 100-d diagonal Gaussian). At
/// TransportRules::fisher_rows = 1,024 rows that floor alone passes the threshold from D of about
/// 60 on, so `auto` chose the flow for every posterior of ~100 parameters or more, Gaussian or not,
/// and spent minutes fitting it (issue #64). The noise halves when the rows double, whatever N_eff
/// is, while the posterior's own departure from a Gaussian does not change: with f_N the
/// divergence from all N rows and f_N/2 from the last half (each with its own fitted map),
/// 2 f_N - f_N/2 removes the noise to first
/// order (Richardson's extrapolation) and is what `auto` compares with the threshold. On small
/// posteriors the correction is of the order of D / N_eff (0.01 at D = 10 from 1,000 effective
/// draws), on the funnel and the latent GP it is small beside their divergence; where the last
/// half has no covariance factor (fewer than 2 (D + 1) rows) it is not measured and the affine map
/// is kept. The divergences quoted in Note [Choosing the transport] are f_N, measured before this
/// correction. Test: Preconditioner.TheAffineMapsNoiseIsNotTakenForACurvedPosterior.
struct FisherBeyondNoise {
  int64_t rows = 0;                                                  // finite rows used
  double all_rows = std::numeric_limits<double>::quiet_NaN();        // f_N (gaussian_fisher_per_dim)
  double half_rows = std::numeric_limits<double>::quiet_NaN();       // f_N/2, the last half
  double beyond_noise = std::numeric_limits<double>::quiet_NaN();    // 2 f_N - f_N/2; NaN: not measured
  /// fisher_per_dim (beyond_noise), fisher_per_dim_all_rows and _half_rows; null where not measured.
  nlohmann::json record() const;
};
FisherBeyondNoise fisher_beyond_noise(const torch::Tensor& x, const torch::Tensor& grad_u);

/// A finished transported run: the draws in x, the flow, and what the fits did.
struct TransportRun {
  SampleResult result;
  FlowTransport flow{nullptr};
  nlohmann::json report;  // {"kind", "layers", "rounds": [{iterations, points, fit}], "fit_seconds",
                          //  "global_moves", "global_accept"}
  bool far_out = false;   // stopped after the first round (TransportOptions::far_out_loss)
};

/// Note [Transport warm-up]: warm-up with fitting rounds, then sampling with `kernel` (NUTS, HMC,
/// MALA, RWM) on the pulled-back target; `options` as for run_sampler (warm-up of at least 100
/// iterations; one process). The result is in x, with every round counted as warm-up.
/// transport.kind kAuto: Note [Choosing the transport] (the report's "auto" says which ran; with
/// no transport chosen the flow is unset and the report has no rounds).
TransportRun run_with_transport(Target& target, Kernel& kernel, const RunOptions& options,
                                const TransportOptions& transport, uint64_t seed, const ProgressFn& progress = nullptr);

}  // namespace nmcmc
