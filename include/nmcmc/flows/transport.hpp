#pragma once
/// A transport T: z -> x (a normalizing flow) fitted from draws and gradients, and the target
/// pulled back through it.
//
// Note [Flow transport]
// T(z) = mu + L C_K(... C_1(z)), an affine map after K affine coupling layers
// (RealNVP, Dinh et al. 2017). Layer k owns a fixed random half-half mask m_k (its seed is
// stored) and maps y to
//   y' = m_k y + (1 - m_k) (y exp(a tanh(S_k(m_k y) / a)) + T_k(m_k y)),
// with S_k, T_k one MLP of the conditioning half (output layer zero at start, so the layer starts
// as the identity; a bounds one layer's log-scale). L = tril(B, -1) + diag(exp(s)) is lower
// triangular (diagonal only above kMaxDenseBase dimensions); log|det dT/dz| = sum s + sum over
// layers of the bounded S on the updated half. The inverse runs the layers backwards with the same S, T.
//
// It is fitted to positions x_i with energy gradients g_i = dU(x_i) by the Fisher divergence
// between the pulled-back density and N(0, I):
//   U_z(z) = U(T(z)) - log|det dT/dz|,   grad U_z(z) = J(z)^T g - grad_z log|det dT/dz|,
//   L = mean_i |grad U_z(z_i) - z_i|^2 / D,   z_i = T^-1(x_i),
// which is zero exactly when the pulled-back density is N(0, I) on the points. It needs no fresh
// target gradient per network step: the points and their gradients are stored (the chains'
// states), so fitting costs network time only (Seyboldt, Carlson & Carpenter 2026 fit nutpie's
// flows the same way). The points need not be exact draws: the divergence is a pointwise
// identity of scores, so warm-up states and states from an earlier transport's latent space all
// inform it; far-out points with huge gradients would dominate a squared loss, so each point's
// term is clipped at kMaxPointLoss. The base (mu, s) starts at the points' mean and the
// per-coordinate sqrt(Var x / Var g); 10 % of the
// points are held out and the parameters with the lowest held-out loss are kept (few points in
// many dimensions overfit). The loss's gradient in the parameters is written out by hand (Note
// [The fit's own gradient]), and a fit stops once the held-out loss is below FitOptions::tolerance
// (1e-3 per coordinate: near-Gaussian posteriors' fits went on to 1e-5-1e-6, for nothing NUTS sees)
// or once FitOptions::patience checks in a row have not lowered it by FitOptions::min_gain (2 %)
// (a smaller gain still keeps its parameters).
//
// Note [The flow's size]
// The conditioners' width is clamp(2 D, 32, 64) (default_flow_hidden). A fit sees a pool of a few
// hundred to a few thousand warm-up states, whatever D is, and each coupling layer holds about
// 3 D h weights: at h = 256 and D = 175 about 1.6 million weights for some 1,000 states, whose
// held-out loss stopped falling after 100-200 steps while a patience of eight checks ran 200 more,
// so that the fits were most of NUTS-through-the-flow's all-in time on the larger posteriors.
// Measured (BENCHMARKS, "The flow's size"; NUTS through the flow, 4 x (1,000 + 1,000), Ice Lake
// Xeon): radon_mn (D = 175) all-in seconds to 10,000 effective draws 355 -> 77, irt_2pl (144)
// 313 -> 59, ESS per sampling gradient 0.102 -> 0.074 and 0.072 -> 0.085 (single runs); the
// posteriors of D <= 32 keep width 2 D.
// The base (mu, L) starts at the points' mean and the Cholesky factor of the low-rank-plus-
// diagonal Fisher estimate from the points and their gradients (kernels/adaptation.hpp's
// fisher_low_rank, as `--metric fisher-lowrank`), diagonal (sqrt(Var x / Var g)) above
// kMaxDenseBase: gradients locate a strongly correlated posterior's shape even from points that
// are still far from it, where the diagonal start left the first fits to rediscover it (the
// correlated regressions of posteriordb did not converge with it).
//
// Once fitted, T is fixed: TransportedTarget is the exact density of z = T^-1(x) and any kernel
// run on it is exact for p after mapping its draws x = T(z) (services/transport.hpp). The flow
// runs in float64 whatever the target's dtype; without a graph its pass and vector-Jacobian product
// run in plain loops (Note [The flow's native pass], flows/native_flow.hpp).
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nmcmc/core/engine.hpp"
#include "nmcmc/core/target.hpp"
#include "nmcmc/core/transform.hpp"
#include "nmcmc/flows/native_flow.hpp"

namespace nmcmc {

/// The flow's shape.
struct FlowOptions {
  int64_t dim = 2;
  int64_t layers = 8;       // coupling layers K (0: the elementwise affine map only)
  int64_t hidden = 0;       // conditioner width; 0: default_flow_hidden(D)
  double max_log_scale = 3.0;  // a: one layer's |log-scale| bound
  uint64_t mask_seed = 0;
  Engine engine = Engine::kAuto;  // its passes in plain loops where they apply (Note [Native copies])
  FlowOptions& set_dim(int64_t d) { dim = d; return *this; }
  FlowOptions& set_layers(int64_t k) { layers = k; return *this; }
  FlowOptions& set_hidden(int64_t h) { hidden = h; return *this; }
  FlowOptions& set_mask_seed(uint64_t s) { mask_seed = s; return *this; }
  FlowOptions& set_engine(Engine e) { engine = e; return *this; }
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FlowOptions, dim, layers, hidden, max_log_scale, mask_seed, engine)

/// The conditioners' default width (Note [The flow's size]): clamp(2 D, 32, 64).
int64_t default_flow_hidden(int64_t dim);

/// Above this many dimensions the flow's base map is diagonal (a dense L costs O(D^2) per pass).
constexpr int64_t kMaxDenseBase = 1000;

/// x and log|det dT/dz| [C] of a pass (or z and log|det dT^-1/dx| for the inverse): a
/// Transform's pass (Note [Transform]).
using TransportPass = TransformPass;

/// Note [Flow transport]. Parameters and passes are float64 on the CPU.
class FlowTransportImpl : public torch::nn::Module {
 public:
  explicit FlowTransportImpl(const FlowOptions& options);
  const FlowOptions& options() const { return options_; }
  int64_t dim() const { return options_.dim; }
  /// z [C, D] -> x = T(z), log|det dT/dz| [C].
  TransportPass forward(const torch::Tensor& z) const;
  /// x [C, D] -> z = T^-1(x), log|det dT^-1/dx| [C] (= -log|det dT/dz| at z).
  TransportPass inverse(const torch::Tensor& x) const;
  /// Sets the base map (mu [D], log-scale s [D]: L = diag(exp(s))).
  void set_base(const torch::Tensor& shift, const torch::Tensor& log_scale);
  /// Sets the base map (mu [D], L [D, D] lower triangular with a positive diagonal); a diagonal-only
  /// flow (D > kMaxDenseBase) keeps L's diagonal.
  void set_base_cholesky(const torch::Tensor& shift, const torch::Tensor& lower);
  /// Whether L may be dense (D <= kMaxDenseBase).
  bool dense_base() const { return lower_.defined(); }
  /// The base map x = mu + L y as a value (Note [Transform]), detached: dense, or diagonal above
  /// kMaxDenseBase. The flow's passes compute it in place (the same products, except that the
  /// diagonal inverse multiplies by exp(-s) where the affine map divides by exp(s)).
  AffineTransform base() const;
  /// The coupling layers (0: T is the affine base map alone).
  int64_t layers() const { return static_cast<int64_t>(nets_.size()); }
  /// For a flow without coupling layers, J^T g = g L by rows (the latent gradient of x . g), as
  /// back-propagation through forward() computes it, without a graph. g [C, D] float64.
  torch::Tensor affine_pull_back(const torch::Tensor& g) const;
  /// Adds noise of size `scale` to the coupling layers' output weights (tests: a flow that is not
  /// the identity).
  void perturb(double scale, at::Generator& gen);  // also B's strictly lower part
  /// Sets every coupling layer back to the identity (their output layers to zero, as at
  /// construction); the base map is kept.
  void reset_layers();
  /// The Fisher loss's per-row terms [n] (per coordinate, clipped at kMaxPointLoss) at positions
  /// x [n, D] with energy gradients g [n, D], in the parameters' dtype, computed without a graph;
  /// with `accumulate_grad`, the gradient of their mean in every parameter is added to its grad()
  /// (Note [The fit's own gradient]). Rows with a non-finite x or g must be dropped before.
  torch::Tensor fisher_terms(const torch::Tensor& x, const torch::Tensor& g, bool accumulate_grad) const;
  /// The weights as a NativeFlowPass (Note [The flow's native pass]), copied again whenever a
  /// parameter has changed since the last call (the tensors' version counters see every in-place
  /// change: an optimiser's step, a load, the setters); null unless they are float64 on the CPU,
  /// and with engine libtorch (Note [Native copies]).
  std::shared_ptr<const NativeFlowPass> native() const;
  /// Which pass the pulled-back target takes (Note [Native copies]; auto and native alike: the
  /// native pass wherever it applies).
  void set_engine(Engine engine) { options_.engine = engine; }
  Engine engine() const { return options_.engine; }

 private:
  struct NativeCache {
    std::mutex mutex;
    std::shared_ptr<const NativeFlowPass> pass;
    std::vector<std::pair<const void*, int64_t>> stamp;  // each parameter's (data, version)
    std::vector<torch::Tensor> params;                    // parameters(), taken once
  };
  std::unique_ptr<NativeCache> native_cache_ = std::make_unique<NativeCache>();
  std::pair<torch::Tensor, torch::Tensor> scale_shift(int64_t k, const torch::Tensor& y_cond) const;
  FlowOptions options_;
  torch::Tensor base_matrix() const;  // L [D, D]
  torch::Tensor shift_, log_scale_;   // [D]
  torch::Tensor lower_;               // B [D, D] (its strictly lower part), undefined above kMaxDenseBase
  std::vector<torch::Tensor> masks_;  // [D] float64 0/1 (1: conditioning half), not parameters
  std::vector<torch::nn::Sequential> nets_;
};
TORCH_MODULE(FlowTransport);

/// Fitting settings (Note [Flow transport]).
struct FitOptions {
  int64_t steps = 600;        // Adam steps at most
  int64_t batch = 256;
  double learning_rate = 2e-3;
  int64_t check_every = 25;   // held-out loss every this many steps; stop after `patience` checks without a gain
  int64_t patience = 3;
  /// A check is a gain when it lowers the best held-out loss by at least this fraction (Note
  /// [Flow transport]); a smaller drop keeps its parameters but counts towards the patience.
  double min_gain = 0.02;
  /// Stop once the held-out loss is below this (per coordinate; also before the first step): a
  /// score error of sqrt(1e-3) ~ 3 % of N(0, I)'s own, a scale off by ~1.6 %, which NUTS's step
  /// size absorbs (Note [Flow transport]). 0: run until the patience or the steps run out.
  double tolerance = 1e-3;
  double holdout = 0.1;
  bool init_base = true;      // set (mu, s) from the points first (else keep the current ones)
  /// The loss's gradient by FlowTransportImpl::fisher_terms (Note [The fit's own gradient]); false:
  /// by LibTorch's double back-propagation (the reference; the same values, 1.4-3.1x the time per step
  /// at D = 5-100: `nmcmc_bench fit`).
  bool own_gradient = true;
  uint64_t seed = 0;
  /// Called at every held-out check: (step, steps at most, held-out loss).
  std::function<void(int64_t, int64_t, double)> progress;
};

/// What a fit did.
struct FitReport {
  int64_t points = 0, steps = 0;
  std::string stopped;  // "tolerance", "patience" or "steps"
  double loss_start = 0, loss_end = 0;          // held-out Fisher loss before and after (per coordinate)
  double train_loss_end = 0;
  double seconds = 0;
};
nlohmann::json to_json_value(const FitReport& r);

/// The largest per-point loss term (per coordinate) a fit lets count (Note [Flow transport]).
constexpr double kMaxPointLoss = 1e4;

/// The Fisher loss (per coordinate, mean over rows) of `flow` at positions x [n, D] with energy
/// gradients g [n, D]; differentiable in the flow's parameters when grad mode is on. Rows with a
/// non-finite x or g must be dropped before.
torch::Tensor fisher_loss(const FlowTransportImpl& flow, const torch::Tensor& x, const torch::Tensor& g);

/// Fits `flow` to the points (rows of x with energy gradients g; non-finite rows are dropped).
FitReport fit_transport(FlowTransportImpl& flow, const torch::Tensor& x, const torch::Tensor& g,
                        const FitOptions& options);

/// The flow as a Transform (Note [Transform]): its passes in float64 on the CPU, the pulled-back
/// energy by the native pass where it applies (Note [The flow's native pass]) and in closed form
/// without coupling layers, by LibTorch's graph otherwise. It shares the flow, which must not
/// change while a kernel runs on it.
class FlowTransform : public Transform {
 public:
  explicit FlowTransform(FlowTransport flow) : flow_(std::move(flow)) {}
  const FlowTransport& flow() const { return flow_; }
  int64_t dim() const override { return flow_->dim(); }
  TransformPass forward(const torch::Tensor& z) const override;
  TransformPass inverse(const torch::Tensor& x) const override;
  bool constant_log_det() const override { return flow_->layers() == 0; }
  torch::Tensor pulled_energy(Target& inner, const torch::Tensor& z, bool jacobian) const override;
  EnergyGrad pulled_energy_and_grad(Target& inner, const torch::Tensor& z, bool create_graph,
                                    bool jacobian) const override;
  std::pair<torch::Tensor, torch::Tensor> latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const override;
  std::pair<torch::Tensor, torch::Tensor> ambient_pairs(const torch::Tensor& z, const torch::Tensor& g_z) const override;

 private:
  FlowTransport flow_;
};

/// The target pulled back through the flow T: U_z(z) = U(T(z)) - log|det dT/dz| (Note [Flow
/// transport]): the one TransformedTarget on a FlowTransform.
class TransportedTarget : public TransformedTarget {
 public:
  TransportedTarget(Target& inner, FlowTransport flow)
      : TransformedTarget(inner, std::make_shared<FlowTransform>(std::move(flow))) {}
};

}  // namespace nmcmc
