#pragma once
/// The learned proposal of Li, Chen & Sommer (2021), section 3 and appendix.
//
// Note [Learned proposal]
// x' = x + eps * z with z = f(z0; x, U), z0 ~ N(0, I) (paper eq. 1). f has N update steps;
// step n owns a random half-half mask m_n (images: a checkerboard) and applies two coupling
// sub-steps, first to the coordinates outside m_n (conditioned on m_n * z), then to those
// in m_n. On the updated half u, given the conditioning half c (paper eq. 2):
//   R        = NN_R(x, z_c)                           (where to take the gradient)
//   g        = dU(x + R)                              (one target gradient per sub-step)
//   S, Q, T  = NN_SQT(x, z_c, g)                      (restricted to u)
//   z_u     <- z_u * exp(S) - eps' * (g_u * exp(Q) + T),     eps' = eps / (2N).
// log|dz/dz0| is the sum of S over all sub-steps. The inverse runs the sub-steps backwards:
// z_u = (z_u' + eps' (g_u exp(Q) + T)) * exp(-S), with the same S, Q, T, R (they depend only
// on x and z_c, which the sub-step leaves unchanged).
//   log q(x'|x) = log N(z0) - log|dz/dz0| - D log eps,
//   log q(x|x') = log N(z0') - log|dz/dz0|(z0'; x') - D log eps,  z0' = f^{-1}(-z; x').
// All output layers start at zero: then S = Q = T = R = 0 and x' = x + eps z0 - eps^2/2 dU(x),
// which is MALA with step eps, exactly.
//
// Variants (appendix): kNoGrad drops the gradient term and R (a conditional RealNVP,
// z_u <- z_u exp(S) - eps' T); kLangevin uses x' = x + eps z - (eps^2/2) dU(x) exp(S_d(x)) + T_d(x)
// with z = f(z0; x) a gradient-free conditional RealNVP, so each MH step needs dU(x) (carried
// in the chain state) and dU(x') (for the reverse density).
//
// Note [Affine preconditioner]
// With precondition = diag or dense, everything above runs in coordinates y = L^-1 (x - m), on
// the target U_y(y) = U(m + L y), whose gradient is L^T dU(x) (a TransformedTarget on the
// AffineTransform with its constant log-determinant left out, Note [Transform]; each view
// evaluation is one evaluation of the real target). L is lower triangular with a positive
// diagonal: diag: L = diag(exp(s)); dense: L = L0 M with L0 from the warm-up (fixed) and, when
// learned, M = tril(B, -1) + diag(exp(s)) starting at I, so that the optimiser moves L in
// whitened units (Adam's steps are of fixed size per entry: on L's own entries they wrecked the
// small scales of a target with variances down to 1e-5). m only centres the networks' inputs. Then
//   x' = m + L y' = x + eps L z,   log q(x'|x) = log q_y(y'|y) - log|det L|,  log|det L| = sum log diag(L),
// and log|det L| is added to the flow's log-det, so the entropy objective (training/objective.hpp)
// sees the proposal entropy in x exactly and can learn L (learn_precondition). For a fixed L the
// term cancels in the MH ratio. With zero networks the proposal is MALA with inverse mass matrix
// L L^T; with L = I it is plain MALA. L and m come from a warm-up of the chains
// (services/train.cpp) or set_preconditioner().
// lowrank (for large D; `auto` above kDenseMaxDim): L = diag(exp(s)) (I + Q diag(exp(t) - 1) Q^T)
// with Q [D, k] orthonormal: the symmetric square root of a "diagonal plus k factors" covariance,
// fitted to the warm-up's draws by factor analysis (low_rank_factors: exp(2s) the unique variances
// psi, exp(2t) the factors' eigenvalues in psi-whitened units). The first design (exp(2s) the
// total variances, Q the correlation's top-k, the other directions at 1) left directions unscaled
// whenever the wide ones dominate the variances, and the chains could not move.
// Its inverse is the same form with t -> -t, log|det L| = sum s + sum t, and every product costs
// O(D k); s and t are learned when learn_precondition (Q stays fixed).
//
// Note [Persistent noise]
// The proposal is a map of the base draw: x' = g(x, z0), and its reverse move's base draw z0' (the
// z0' with g(x', z0') = x, which the reverse density computes anyway) makes (x, z0) -> (x', z0') an
// involution of the space of (x, z0) under pi(x) N(z0). Metropolis-Hastings with a fresh z0 each
// step is that involution accepted with the usual ratio, then z0 redrawn. With persistence rho > 0
// (LearnedProposal::set_persistence, `nmcmc sample --persistence`) z0 is carried instead, as
// generalised HMC (Horowitz 1991) carries its momentum: after the MH decision it is negated (z0 ->
// -z0' where the move was accepted, -z0 where it was rejected), and each step starts from
//   z0 <- rho z0 + sqrt(1 - rho^2) xi,   xi ~ N(0, I).
// Each of the three maps leaves pi(x) N(z0) invariant (the involution with its MH test, the negation,
// the autoregressive refresh), so the chain in x is exact for any rho in [0, 1); it is no longer
// reversible. With zero networks the proposal is MALA and -z0' = z0 - (eps/2)(dU(x) + dU(x')), one
// leapfrog step's momentum: the sampler is then Horowitz's one-step GHMC, whose moves keep their
// direction over about 1 / (1 - rho) accepted steps instead of diffusing. Rejections reverse the
// direction. The learned networks make -z0' only roughly the continued direction; what it buys is
// measured, not assumed (BENCHMARKS.md, "Persistent noise"): at rho = 0.6 (kDefaultPersistence)
// bulk-ESS per gradient rose on every one of posteriordb's 16 small posteriors (1.26x on average)
// with tail-ESS about level (0.96x), and 2.5x on irt_2pl (144 parameters); at 0.8 and above the
// spread of the draws mixed worse (tail-ESS 0.76x; diamonds' folded R-hat over 1.01). Training is
// unchanged (the entropy of one step with a fresh z0); the first step of every chain draws z0
// afresh, and a change of the chain batch's size starts afresh too.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "nmcmc/core/engine.hpp"
#include "nmcmc/core/enum_names.hpp"
#include "nmcmc/flows/model.hpp"
#include "nmcmc/flows/native_step.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/policy.hpp"

namespace nmcmc {

enum class Variant { kFull, kNoGrad, kLangevin };
/// "full" | "no-grad" | "langevin"; UsageError for anything else.
Variant parse_variant(const std::string& name);
std::string variant_name(Variant v);
/// JSON as the variant's name (strict: an unknown name is a UsageError, never a default).
inline void to_json(nlohmann::json& j, Variant v) { j = variant_name(v); }
inline void from_json(const nlohmann::json& j, Variant& v) { v = parse_variant(j.get<std::string>()); }

/// The affine preconditioner's form (Note [Affine preconditioner]); `auto` is resolved before a
/// model is built (resolve_precondition).
enum class Precondition { kNone, kDiag, kDense, kLowRank, kAuto };
template <>
struct EnumNames<Precondition> {
  static constexpr const char* what = "precondition";
  static std::vector<std::pair<Precondition, const char*>> values() {
    return {{Precondition::kNone, "none"},
            {Precondition::kDiag, "diag"},
            {Precondition::kDense, "dense"},
            {Precondition::kLowRank, "lowrank"},
            {Precondition::kAuto, "auto"}};
  }
};
NMCMC_ENUM_JSON(Precondition)

/// "auto": dense up to kDenseMaxDim dimensions, lowrank above (Note [Where the dense map stops]).
//
// Note [Where the dense map stops]
// The dense map is the warm-up's covariance, estimated from its last window's draws: some 16
// chains x a few hundred autocorrelated draws, a few rows per dimension at D = 1,000, where the
// estimate is mostly noise and whitening by it leaves the learned sampler a badly scaled target
// (and L costs O(D^2) per proposal). Measured with train's defaults, 4 x 1,000 draws, AMD EPYC 2
// vCPUs (`bench/d_scan.py`): on the 1,000-d ill-conditioned diagonal
// Gaussian the dense map gave 0.004 bulk-ESS per gradient (R-hat 1.168), the low-rank one 0.243
// (R-hat 1.011; warm-up 17 s instead of 48 s); at D = 300 the dense map 0.126, the low-rank one
// 0.384. But where the posterior's correlations are not a few factors the low-rank map cannot
// whiten it: on the 300-d rotated Gaussian it failed (R-hat 2.16) where the dense one nearly
// converged (R-hat 1.03, 0.052 per gradient). So the dense map is kept up to 500 dimensions,
// between the two sizes measured, and the low-rank map taken above (it was 1,000).
constexpr int64_t kDenseMaxDim = 500;
Precondition resolve_precondition(Precondition precondition, int64_t dim);

/// A factor-analysis fit of a covariance, S ~ diag(psi) + W W^T with k' <= k factors, in the form the
/// low-rank L takes: S ~ diag(sqrt psi) (I + Q diag(Lambda - 1) Q^T) diag(sqrt psi) with Q [D, k']
/// orthonormal and Lambda [k'] > 1. The maximum-likelihood fixed point (scikit-learn's
/// FactorAnalysis): whiten by psi, take the top-k eigenpairs of the whitened covariance, keep the
/// eigenvalues above the noise edge (1 + sqrt(D/n))^2 (below it a sample eigenvalue is
/// indistinguishable from noise), set psi = diag(S - W W^T); until psi settles (at most 1000
/// iterations of O(n D k) time, O(D k) memory). Where S is diagonal plus k wide factors (a few
/// dominant directions over unequal variances), the fit is exact.
struct LowRankFactors {
  torch::Tensor variances;    // psi [D] float64
  torch::Tensor directions;   // Q [D, k'] float64
  torch::Tensor eigenvalues;  // Lambda [k'] float64, descending
};
/// From draws [n, D] (S their covariance, regularised as Stan's metric: (n S + 5e-3 I) / (n + 5);
/// Lambda shrunk the same way towards 1); through the n x n Gram matrix when n < D, never a D x D
/// matrix. With `chains` >= 2 (rows are draw-major: row i belongs to chain i % chains) the number
/// of factors is cross-fitted first: a factor fitted on half of the chains is kept only if the
/// other half's (whitened) variance along it is at least 1.5 times their mean variance in the
/// directions orthogonal to all the factors, both ways round (autocorrelated draws put sample
/// noise above the noise edge for independent draws).
LowRankFactors low_rank_factors(const torch::Tensor& draws, int64_t k, int64_t chains = 1);
/// From an exact covariance [D, D] (no noise edge, no shrinkage).
LowRankFactors low_rank_factors_of_covariance(const torch::Tensor& covariance, int64_t k);

/// Model hyper-parameters (the paper's "hidden width / steps N", plus the rest).
struct LearnedOptions {
  int64_t dim = 2;
  Variant variant = Variant::kFull;
  int64_t hidden = 256;        // MLP width (0 in a training config: sized to D, Note [Training budget])
  int64_t steps = 1;           // N update steps (2N coupling sub-steps)
  int64_t shared_layers = 2;   // hidden-to-hidden layers shared across sub-steps
  Activation activation = Activation::kElu;
  double eps = 0.1;            // initial step size (learned, stored as log eps)
  uint64_t mask_seed = 0;      // seed of the random half-half masks
  Precondition precondition = Precondition::kNone;  // Note [Affine preconditioner]
  bool learn_precondition = false;    // L is trained with the entropy objective (else fixed)
  int64_t precondition_rank = 16;     // lowrank: k factors (at most D - 1)
  MatmulOption matmul = MatmulOption::kAuto;  // the networks' GEMMs' precision (Note [Bfloat16 matmul])
  GemmBackend gemm = GemmBackend::kAuto;      // where their float32 GEMMs run (Note [oneDNN GEMM])
  Engine engine = Engine::kAuto;              // the sampling step's native pass (Note [Native copies])
  int64_t native_max_flops = kNativeStepMaxFlops;  // auto: the native pass up to this many network flops a step
  LearnedOptions& set_dim(int64_t d) { dim = d; return *this; }
  LearnedOptions& set_variant(Variant v) { variant = v; return *this; }
  LearnedOptions& set_hidden(int64_t h) { hidden = h; return *this; }
  LearnedOptions& set_steps(int64_t n) { steps = n; return *this; }
  LearnedOptions& set_shared_layers(int64_t n) { shared_layers = n; return *this; }
  LearnedOptions& set_activation(Activation a) { activation = a; return *this; }
  LearnedOptions& set_eps(double e) { eps = e; return *this; }
  LearnedOptions& set_mask_seed(uint64_t s) { mask_seed = s; return *this; }
  LearnedOptions& set_precondition(Precondition p) { precondition = p; return *this; }
  LearnedOptions& set_learn_precondition(bool b) { learn_precondition = b; return *this; }
  LearnedOptions& set_precondition_rank(int64_t k) { precondition_rank = k; return *this; }
  LearnedOptions& set_matmul(MatmulOption m) { matmul = m; return *this; }
  LearnedOptions& set_gemm(GemmBackend g) { gemm = g; return *this; }
  LearnedOptions& set_engine(Engine e) { engine = e; return *this; }
  LearnedOptions& set_native_max_flops(int64_t f) { native_max_flops = f; return *this; }
  /// The networks' linear-layer policy (Note [Linear-layer policy]).
  LinearPolicy linear_policy() const;
  nlohmann::json to_json() const;
  static LearnedOptions from_json(const nlohmann::json& j);  // throws UsageError
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LearnedOptions, dim, variant, hidden, steps, shared_layers, activation,
                                                eps, mask_seed, precondition, learn_precondition, precondition_rank, matmul,
                                                gemm, engine, native_max_flops)

/// An MLP whose first and last layers have separate weights per sub-step k and whose middle
/// layers are shared. The output layer starts at zero. With `tanh_last`, the last hidden
/// activation is tanh (the S/Q/T network).
class StepMLPImpl : public torch::nn::Module {
 public:
  StepMLPImpl(int64_t substeps, int64_t in, int64_t hidden, int64_t out, int64_t shared_layers,
              Activation activation, bool tanh_last, LinearPolicy policy = {});
  /// input [C, in] -> [C, out] for sub-step k.
  torch::Tensor forward(int64_t k, const torch::Tensor& input);
  /// Flops (multiply-adds x 2) per row of one forward call.
  int64_t flops_per_row() const;
  /// Its weights as float64 arrays (Note [The learned step's native pass]).
  NativeStepNet native() const;
  /// How the layers multiply (Note [Linear-layer policy]).
  const LinearPolicy& policy() const { return policy_; }
  void set_policy(const LinearPolicy& policy) { policy_ = policy; }

 private:
  torch::Tensor activate(torch::Tensor h, bool last) const;
  std::vector<torch::Tensor> w_in_, b_in_, w_out_, b_out_;  // per sub-step: [in, H], [H], [H, out], [out]
  std::vector<torch::nn::Linear> shared_;
  std::vector<WeightCache> in_caches_, shared_caches_, out_caches_;  // one per weight (Note [Linear-layer policy])
  Activation activation_;
  bool tanh_last_;
  LinearPolicy policy_;
  int64_t in_, hidden_, out_;
};
TORCH_MODULE(StepMLP);

/// The learned sampler's networks and masks. Parameters are created in float64; move the module
/// to the target's dtype and device with to() before use (Trainer and load_model do). Call forward/inverse for the flow, or wrap it in
/// LearnedProposal for MH sampling.
class LearnedSamplerImpl : public torch::nn::Module, public ProposalModel {
 public:
  explicit LearnedSamplerImpl(const LearnedOptions& options);

  const LearnedOptions& options() const { return options_; }
  torch::nn::Module& module() override { return *this; }
  nlohmann::json options_json() const override { return options_.to_json(); }
  int64_t dim() const override { return options_.dim; }
  torch::Tensor log_eps() const override { return log_eps_; }
  /// Sets the step size eps (> 0).
  void set_eps(double eps);
  /// Sets how the networks multiply (options().matmul), e.g. to sample a model in another
  /// precision than it was trained in. The proposal stays exact either way (Note [Bfloat16 matmul]).
  void set_matmul(MatmulOption matmul);
  /// Sets where their float32 GEMMs run (options().gemm; Note [oneDNN GEMM]).
  void set_gemm(GemmBackend gemm);
  /// The networks' linear-layer policy (Note [Linear-layer policy]): from the options, with the
  /// zero-gradient-row settings given here (tests and A/B benchmarks change them).
  void set_linear_policy(const LinearPolicy& policy);
  LinearPolicy linear_policy() const;
  bool needs_grad() const override { return options_.variant == Variant::kLangevin; }
  /// Number of coupling sub-steps 2N.
  int64_t substeps() const { return 2 * options_.steps; }

  /// z = f(z0; x). With create_graph, target gradients stay differentiable (training).
  FlowPass forward_flow(Target& target, const torch::Tensor& x, const torch::Tensor& z0, bool create_graph);
  /// z0 = f^{-1}(z; x); log_det is log|dz/dz0| at that z0.
  FlowPass inverse_flow(Target& target, const torch::Tensor& x, const torch::Tensor& z, bool create_graph);

  /// Langevin variant: the drift mu(x) = -(eps^2/2) dU(x) exp(S_d(x)) + T_d(x), given dU(x).
  torch::Tensor langevin_drift(const torch::Tensor& x, const torch::Tensor& grad);

  using Proposed = nmcmc::Proposed;
  /// Draws z0 from gen and builds x' with both densities. `grad` is dU(x) (Langevin only).
  Proposed propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad, at::Generator& gen,
                   bool create_graph) override;
  /// The same from a given base draw z0 [C, D] (tests take Jacobians through it).
  Proposed propose_from(Target& target, const torch::Tensor& x, const torch::Tensor& grad, const torch::Tensor& z0,
                        bool create_graph);
  /// Note [The learned step's native pass]: whether propose() takes it for a batch x (a CPU batch
  /// of at most native_max_flops network flops under engine auto, no autograd graph, the langevin or no-grad
  /// variant, model.matmul auto (or native for a float64 model: the pass runs in float64), and
  /// model.engine not libtorch; Note [Native copies]).
  bool native_step_applies(const torch::Tensor& x) const;
  /// propose() from a given base draw z0 [C, D] without an autograd graph (the native pass where it applies).
  Proposed propose_given(Target& target, const torch::Tensor& x, const torch::Tensor& grad, const torch::Tensor& z0);
  /// propose_from(target, x, grad, z0, false) by the native pass (the same kernel; the values
  /// agree to rounding). The variant must be langevin or no-grad and x on the CPU.
  Proposed propose_native(Target& target, const torch::Tensor& x, const torch::Tensor& grad, const torch::Tensor& z0);
  /// Which pass propose() takes (Note [Native copies]): auto (the default) the native pass where it
  /// applies and the batch is within native_max_flops, native wherever it applies, libtorch never.
  void set_engine(Engine engine) { options_.engine = engine; }
  /// engine auto's threshold (model.native_max_flops), measured for another CPU.
  void set_native_max_flops(int64_t flops) { options_.native_max_flops = flops; }

  /// log q(x_to | x_from) by the inverse pass (an independent route to the same density the
  /// forward pass gives). For the Langevin variant `grad_from` is dU(x_from).
  torch::Tensor log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                            const torch::Tensor& x_to) override;
  /// log_density with another preconditioner matrix L [D, D] in place of the model's (tests pass a
  /// wrong one to prove the invariance tests' power).
  torch::Tensor log_density_with(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                                 const torch::Tensor& x_to, const torch::Tensor& l);

  /// Target gradient evaluations per MH step (per chain): 4N (full), 0 (no-grad), 1 (langevin,
  /// with dU(x) carried in the chain state).
  int64_t grads_per_step() const override;
  /// Approximate network flops per chain for one MH step (forward and reverse pass).
  int64_t flops_per_step() const;
  /// The masks as a [N, D] 0/1 tensor (1 = in m_n).
  torch::Tensor masks() const { return masks_; }

  /// Whether the flow runs in preconditioned coordinates (Note [Affine preconditioner]).
  bool preconditioned() const { return options_.precondition != Precondition::kNone; }
  /// Sets m [D] and L from a covariance: [D, D] (L = its Cholesky factor; a diagonal model keeps
  /// only the variances) or variances [D]. DataError if the covariance is not positive definite.
  /// lowrank: the factor-analysis fit of the covariance (low_rank_factors_of_covariance; from [D, D]).
  void set_preconditioner(const torch::Tensor& shift, const torch::Tensor& covariance);
  /// lowrank: m [D], variances psi [D], Q [D, k'] orthonormal and eigenvalues Lambda [k'] > 0:
  /// L L^T = diag(sqrt psi) (I + Q diag(Lambda - 1) Q^T) diag(sqrt psi) (k' <= k; missing factors
  /// get eigenvalue 1). DataError for bad values.
  void set_low_rank_preconditioner(const torch::Tensor& shift, const torch::Tensor& variances,
                                   const torch::Tensor& directions, const torch::Tensor& eigenvalues);
  /// L [D, D] (identity without a preconditioner), in the model's dtype.
  torch::Tensor precondition_matrix() const;
  /// m [D] (zero without a preconditioner).
  torch::Tensor precondition_shift() const;
  /// log|det L| (a float64 scalar; 0 without a preconditioner).
  torch::Tensor precondition_log_det() const;
  /// y = L^-1 (x - m), [C, D].
  torch::Tensor to_latent(const torch::Tensor& x) const;
  /// x = m + L y, [C, D].
  torch::Tensor from_latent(const torch::Tensor& y) const;

 private:
  /// propose / log_density in the flow's own coordinates (y = x without a preconditioner).
  Proposed propose_latent(Target& target, const torch::Tensor& y, const torch::Tensor& grad, const torch::Tensor& z0,
                          bool create_graph);
  torch::Tensor log_density_latent(Target& target, const torch::Tensor& y_from, const torch::Tensor& grad_from,
                                   const torch::Tensor& y_to);
  /// Coupling parameters of sub-step k at (x, z): returns (S, Q, T, g_u) restricted to the
  /// updated half; Q and g_u undefined for gradient-free variants.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> coupling(Target& target, int64_t k,
                                                                                  const torch::Tensor& x,
                                                                                  const torch::Tensor& z,
                                                                                  bool create_graph);

  LearnedOptions options_;
  torch::Tensor log_eps_;                   // scalar parameter
  torch::Tensor masks_;                     // [N, D] buffer
  torch::Tensor pre_shift_;                 // m [D] (buffer), when preconditioned
  torch::Tensor pre_base_;                  // dense: L0 [D, D] (buffer, from the warm-up)
  torch::Tensor pre_log_scale_;             // s [D]: diag: L = diag(exp(s)); dense: diag(M) = exp(s)
  torch::Tensor pre_lower_;                 // dense: B [D, D], M = tril(B, -1) + diag(exp(s)); L = L0 M
                                            // (s, B parameters if learned, else zero buffers)
  torch::Tensor pre_directions_;            // lowrank: Q [D, k] (buffer)
  torch::Tensor pre_log_eigen_;             // lowrank: t [k] (parameter if learned)
  std::vector<torch::Tensor> upd_idx_, cond_idx_;  // per sub-step index sets (int64)
  StepMLP net_sqt_{nullptr}, net_r_{nullptr}, net_drift_{nullptr};
  // Note [The learned step's native pass]: the copy, and the parameters' and buffers' storage and
  // version counters it was made from (remade when they change).
  std::shared_ptr<const NativeLearnedStep> native_;
  std::vector<std::pair<const void*, int64_t>> native_key_;
};
TORCH_MODULE(LearnedSampler);

/// Note [Persistent noise]: the persistence a trained model samples with unless told otherwise
/// (`nmcmc sample`, compare, and training's mixing check, which predicts how `sample` will mix).
/// A LearnedProposal built directly starts at 0, the paper's sampler (reproduce keeps that).
constexpr double kDefaultPersistence = 0.6;

/// The learned sampler as an uncalibrated proposal for MetropolisHastings.
class LearnedProposal : public ModelProposal {
 public:
  explicit LearnedProposal(LearnedSampler sampler) : ModelProposal(sampler.ptr(), "learned"), sampler_(std::move(sampler)) {}
  LearnedSampler& sampler() { return sampler_; }
  /// Note [Persistent noise]: the base draw's persistence rho in [0, 1) (0, the default: a fresh
  /// draw each step, the paper's sampler). UsageError outside.
  void set_persistence(double rho);
  double persistence() const { return rho_; }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
  void observe(const StepInfo& info) override;

 private:
  LearnedSampler sampler_;
  double rho_ = 0.0;
  torch::Tensor z_;                         // [C, D] the carried base draw (undefined: none yet)
  torch::Tensor pending_z0_, pending_rev_;  // [C, D] the last proposal's base draw and its reverse move's
};

}  // namespace nmcmc
