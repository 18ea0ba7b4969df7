#include "nmcmc/flows/learned.hpp"

#include <cmath>
#include <functional>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/core/transform.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/io/config.hpp"

namespace nmcmc {

Variant parse_variant(const std::string& name) {
  if (name == "full") return Variant::kFull;
  if (name == "no-grad") return Variant::kNoGrad;
  if (name == "langevin") return Variant::kLangevin;
  throw UsageError("unknown variant '" + name + "' (full, no-grad, langevin)");
}

std::string variant_name(Variant v) {
  switch (v) {
    case Variant::kFull: return "full";
    case Variant::kNoGrad: return "no-grad";
    case Variant::kLangevin: return "langevin";
  }
  return "full";
}

Precondition resolve_precondition(Precondition precondition, int64_t dim) {
  if (precondition != Precondition::kAuto) return precondition;
  return dim <= kDenseMaxDim ? Precondition::kDense : Precondition::kLowRank;
}

LinearPolicy LearnedOptions::linear_policy() const {
  LinearPolicy p;
  p.matmul = matmul;
  p.gemm = gemm;
  return p;
}

LearnedOptions LearnedOptions::from_json(const nlohmann::json& j) {
  LearnedOptions o = options_from_json<LearnedOptions>(j, "model options");
  if (o.dim < 2) throw UsageError("model: dim must be at least 2");
  if (o.hidden < 0 || o.steps < 1 || o.shared_layers < 0) {
    throw UsageError("model: hidden must be positive (or 0: sized to the dimension) and steps positive");
  }
  if (!(o.eps > 0) || !std::isfinite(o.eps)) throw UsageError("model: eps must be positive");
  if (o.learn_precondition && o.precondition == Precondition::kNone) {
    throw UsageError("model: learn_precondition needs precondition diag, dense, lowrank or auto");
  }
  if (o.precondition_rank < 1) throw UsageError("model: precondition_rank must be positive");
  if (o.native_max_flops < 0) throw UsageError("model: native_max_flops must be non-negative");
  return o;
}

// ------------------------------------------------------------------ StepMLP

LearnedSamplerImpl::LearnedSamplerImpl(const LearnedOptions& o) : options_(o) {
  TORCH_CHECK(o.dim >= 2, "the learned sampler needs dim >= 2, got ", o.dim);
  TORCH_CHECK(o.hidden >= 1, "the learned sampler needs a positive hidden width (0 is sized by train()), got ", o.hidden);
  TORCH_CHECK(o.precondition != Precondition::kAuto,
              "the learned sampler needs precondition none, diag, dense or lowrank (resolve auto first: "
              "resolve_precondition)");
  const int64_t d = o.dim, k = 2 * o.steps;
  const int64_t half_max = (d + 1) / 2;
  log_eps_ = register_parameter("log_eps", torch::tensor(std::log(o.eps), torch::kFloat64));
  // Random half-half masks, one per update step, from mask_seed (saved with the model).
  at::Generator gen = make_generator(o.mask_seed);
  torch::Tensor masks = torch::zeros({o.steps, d}, torch::kFloat64);
  for (int64_t n = 0; n < o.steps; ++n) {
    torch::Tensor perm = torch::randperm(d, gen, torch::kInt64);
    masks[n].index_fill_(0, perm.narrow(0, 0, d / 2), 1.0);
  }
  masks_ = register_buffer("masks", masks);
  for (int64_t n = 0; n < o.steps; ++n) {
    torch::Tensor in_m = masks[n].nonzero().squeeze(1), out_m = (masks[n] == 0).nonzero().squeeze(1);
    upd_idx_.push_back(out_m);  // first sub-step: update the complement of m, conditioned on m
    cond_idx_.push_back(in_m);
    upd_idx_.push_back(in_m);  // second sub-step: update m, conditioned on the rest
    cond_idx_.push_back(out_m);
  }
  const bool grad = o.variant == Variant::kFull;
  const int64_t in = d + half_max + (grad ? d : 0);
  net_sqt_ = register_module("net_sqt", StepMLP(k, in, o.hidden, (grad ? 3 : 2) * half_max, o.shared_layers,
                                                 o.activation, /*tanh_last=*/true, o.linear_policy()));
  if (grad) {
    net_r_ = register_module("net_r", StepMLP(k, d + half_max, o.hidden, d, o.shared_layers, o.activation, false, o.linear_policy()));
  }
  if (o.variant == Variant::kLangevin) {
    net_drift_ = register_module("net_drift", StepMLP(1, d, o.hidden, 2 * d, o.shared_layers, o.activation, true, o.linear_policy()));
  }
  if (o.precondition != Precondition::kNone) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto reg = [&](const std::string& name, torch::Tensor t) {
      return o.learn_precondition ? register_parameter(name, t) : register_buffer(name, t);
    };
    pre_shift_ = register_buffer("precondition_shift", torch::zeros({d}, f64));
    pre_log_scale_ = reg("precondition_log_scale", torch::zeros({d}, f64));
    if (o.precondition == Precondition::kDense) {
      // L = L0 M: L0 (from the warm-up) fixed, M = tril(B, -1) + diag(exp(s)) learned from the
      // identity, so that the optimiser's steps are in whitened units whatever the target's scales.
      pre_base_ = register_buffer("precondition_base", torch::eye(d, f64));
      pre_lower_ = reg("precondition_lower", torch::zeros({d, d}, f64));
    }
    if (o.precondition == Precondition::kLowRank) {
      const int64_t k = std::min(o.precondition_rank, d - 1);
      pre_directions_ = register_buffer("precondition_directions", torch::eye(d, f64).narrow(1, 0, k).clone());
      pre_log_eigen_ = reg("precondition_log_eigen", torch::zeros({k}, f64));
    }
  }
}

// ------------------------------------------------------------------ preconditioner

namespace {
/// The view a preconditioned proposal runs on: U(m + L y), gradient L^T dU, the constant log|det L|
/// carried in the proposal's own densities (Note [Affine preconditioner]).
TransformedTarget latent_view(Target& target, const AffineTransform& a) {
  return TransformedTarget(target, std::make_shared<AffineTransform>(a), Jacobian::kOmit);
}

AffineTransform dense_affine(const torch::Tensor& m, const torch::Tensor& l) {
  return AffineTransform::dense(m, l, torch::Tensor(), l.diagonal().abs().log().sum().to(torch::kFloat64));
}
}  // namespace

void LearnedSamplerImpl::set_eps(double eps) {
  TORCH_CHECK(eps > 0 && std::isfinite(eps), "set_eps: eps must be positive, got ", eps);
  torch::NoGradGuard no_grad;
  log_eps_.fill_(std::log(eps));
}

void LearnedSamplerImpl::set_matmul(MatmulOption matmul) {
  options_.matmul = matmul;
  LinearPolicy p = linear_policy();
  p.matmul = matmul;
  set_linear_policy(p);
}

void LearnedSamplerImpl::set_gemm(GemmBackend gemm) {
  options_.gemm = gemm;
  LinearPolicy p = linear_policy();
  p.gemm = gemm;
  set_linear_policy(p);
}

void LearnedSamplerImpl::set_linear_policy(const LinearPolicy& policy) {
  options_.matmul = policy.matmul;
  options_.gemm = policy.gemm;
  for (StepMLP* net : {&net_sqt_, &net_r_, &net_drift_}) {
    if (*net) (*net)->set_policy(policy);
  }
}

LinearPolicy LearnedSamplerImpl::linear_policy() const { return net_sqt_->policy(); }

void LearnedSamplerImpl::set_preconditioner(const torch::Tensor& shift, const torch::Tensor& covariance) {
  TORCH_CHECK(preconditioned(), "set_preconditioner: the model has precondition = none");
  const int64_t d = options_.dim;
  torch::NoGradGuard no_grad;
  torch::Tensor m = shift.to(torch::kCPU, torch::kFloat64).reshape({-1});
  torch::Tensor c = covariance.to(torch::kCPU, torch::kFloat64);
  const bool shape_ok = (c.dim() == 1 && c.size(0) == d) || (c.dim() == 2 && c.size(0) == d && c.size(1) == d);
  if (m.size(0) != d || !shape_ok) {
    throw DataError("preconditioner: expected a shift [" + std::to_string(d) + "] and a covariance [" +
                    std::to_string(d) + "] or [" + std::to_string(d) + ", " + std::to_string(d) + "]");
  }
  if (!torch::isfinite(m).all().item<bool>() || !torch::isfinite(c).all().item<bool>()) {
    throw DataError("preconditioner: the shift or covariance is not finite");
  }
  if (options_.precondition == Precondition::kDiag) {
    torch::Tensor var = c.dim() == 1 ? c : c.diagonal();
    if (!(var > 0).all().item<bool>()) throw DataError("preconditioner: the variances must be positive");
    pre_log_scale_.copy_(0.5 * var.log());
  } else if (options_.precondition == Precondition::kLowRank) {
    torch::Tensor var = c.dim() == 1 ? c : c.diagonal();
    if (!(var > 0).all().item<bool>()) throw DataError("preconditioner: the variances must be positive");
    if (c.dim() == 1) {
      set_low_rank_preconditioner(m, var, torch::zeros({d, 0}, torch::kFloat64), torch::zeros({0}, torch::kFloat64));
      return;
    }
    auto [l, info] = torch::linalg_cholesky_ex(0.5 * (c + c.t()));
    if (info.item<int64_t>() != 0) throw DataError("preconditioner: the covariance is not positive definite");
    LowRankFactors f = low_rank_factors_of_covariance(c, pre_directions_.size(1));
    set_low_rank_preconditioner(m, f.variances, f.directions, f.eigenvalues);
    return;
  } else {
    torch::Tensor base;
    if (c.dim() == 1) {
      if (!(c > 0).all().item<bool>()) throw DataError("preconditioner: the variances must be positive");
      base = torch::diag(c.sqrt());
    } else {
      auto [l, info] = torch::linalg_cholesky_ex(0.5 * (c + c.t()));
      if (info.item<int64_t>() != 0) throw DataError("preconditioner: the covariance is not positive definite");
      base = l;
    }
    pre_base_.copy_(base);
    pre_log_scale_.zero_();
    pre_lower_.zero_();
  }
  pre_shift_.copy_(m);
}

void LearnedSamplerImpl::set_low_rank_preconditioner(const torch::Tensor& shift, const torch::Tensor& variances,
                                                     const torch::Tensor& directions, const torch::Tensor& eigenvalues) {
  TORCH_CHECK(options_.precondition == Precondition::kLowRank, "set_low_rank_preconditioner: the model's precondition is ",
              enum_name(options_.precondition));
  const int64_t d = options_.dim, k = pre_directions_.size(1);
  torch::NoGradGuard no_grad;
  torch::Tensor m = shift.to(torch::kCPU, torch::kFloat64).reshape({-1});
  torch::Tensor var = variances.to(torch::kCPU, torch::kFloat64).reshape({-1});
  torch::Tensor q = directions.to(torch::kCPU, torch::kFloat64);
  torch::Tensor lam = eigenvalues.to(torch::kCPU, torch::kFloat64).reshape({-1});
  if (m.size(0) != d || var.size(0) != d || q.dim() != 2 || q.size(0) != d || q.size(1) > k || lam.size(0) != q.size(1)) {
    throw DataError("preconditioner: expected a shift and variances [" + std::to_string(d) + "], directions [" +
                    std::to_string(d) + ", k <= " + std::to_string(k) + "] and k eigenvalues");
  }
  for (const auto& t : {m, var, q, lam}) {
    if (!torch::isfinite(t).all().item<bool>()) throw DataError("preconditioner: non-finite values");
  }
  if (!(var > 0).all().item<bool>() || !(lam > 0).all().item<bool>()) {
    throw DataError("preconditioner: the variances and eigenvalues must be positive");
  }
  const int64_t given = q.size(1);
  if (given > 0 && (q.t().matmul(q) - torch::eye(given, torch::kFloat64)).abs().max().item<double>() > 1e-6) {
    throw DataError("preconditioner: the directions must be orthonormal");
  }
  // Complete Q to k orthonormal columns (eigenvalue 1: no effect) so that its shape stays fixed.
  torch::Tensor full = q;
  if (given < k) {
    torch::Tensor extra = torch::randn({d, k - given}, make_generator(77), torch::kFloat64);
    if (given > 0) extra = extra - q.matmul(q.t().matmul(extra));
    full = std::get<0>(torch::linalg_qr(torch::cat({q, extra}, 1)));
    if (given > 0) full.narrow(1, 0, given).copy_(q);
  }
  pre_shift_.copy_(m);
  pre_log_scale_.copy_(0.5 * var.log());
  pre_directions_.copy_(full);
  torch::Tensor t = torch::zeros({k}, torch::kFloat64);
  if (given > 0) t.narrow(0, 0, given).copy_(0.5 * lam.log());
  pre_log_eigen_.copy_(t);
}

namespace {
AffineTransform model_affine(const torch::Tensor& m, const torch::Tensor& base, const torch::Tensor& log_scale,
                             const torch::Tensor& lower, bool learned, const torch::Tensor& directions = {},
                             const torch::Tensor& log_eigen = {}) {
  if (directions.defined()) {
    return AffineTransform::low_rank(m, log_scale.exp(), directions, log_eigen,
                                     (log_scale.sum() + log_eigen.sum()).to(torch::kFloat64));
  }
  if (!base.defined()) return AffineTransform::diagonal(m, log_scale.exp(), log_scale.sum().to(torch::kFloat64));
  torch::Tensor log_det = base.diagonal().log().sum().to(torch::kFloat64);
  if (!learned) return AffineTransform::dense(m, base, torch::Tensor(), log_det);
  return AffineTransform::dense(m, base, torch::tril(lower, -1) + torch::diag_embed(log_scale.exp()),
                                log_det + log_scale.sum().to(torch::kFloat64));
}
}  // namespace

torch::Tensor LearnedSamplerImpl::precondition_matrix() const {
  if (!preconditioned()) return torch::eye(options_.dim, log_eps_.options());
  return model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition, pre_directions_,
                      pre_log_eigen_)
      .matrix();
}

torch::Tensor LearnedSamplerImpl::precondition_shift() const {
  return preconditioned() ? pre_shift_ : torch::zeros({options_.dim}, log_eps_.options());
}

torch::Tensor LearnedSamplerImpl::precondition_log_det() const {
  if (!preconditioned()) return torch::zeros({}, torch::kFloat64);
  return model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition, pre_directions_, pre_log_eigen_).log_det();
}

torch::Tensor LearnedSamplerImpl::to_latent(const torch::Tensor& x) const {
  return preconditioned() ? model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition, pre_directions_, pre_log_eigen_).to_latent(x) : x;
}

torch::Tensor LearnedSamplerImpl::from_latent(const torch::Tensor& y) const {
  return preconditioned() ? model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition, pre_directions_, pre_log_eigen_).from_latent(y) : y;
}


namespace {
/// z[:, idx], padded with zero columns to `width`.
torch::Tensor gather_padded(const torch::Tensor& z, const torch::Tensor& idx, int64_t width) {
  torch::Tensor g = z.index_select(1, idx);
  if (g.size(1) < width) g = torch::cat({g, torch::zeros({z.size(0), width - g.size(1)}, z.options())}, 1);
  return g;
}
}  // namespace

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> LearnedSamplerImpl::coupling(
    Target& target, int64_t k, const torch::Tensor& x, const torch::Tensor& z, bool create_graph) {
  const int64_t d = options_.dim, half_max = (d + 1) / 2;
  const torch::Tensor& upd = upd_idx_[k];
  const int64_t nu = upd.size(0);
  if (upd.device() != x.device()) {
    upd_idx_[k] = upd_idx_[k].to(x.device());
    cond_idx_[k] = cond_idx_[k].to(x.device());
  }
  torch::Tensor zc = gather_padded(z, cond_idx_[k], half_max);  // [C, half_max]
  if (options_.variant == Variant::kFull) {
    torch::Tensor r = net_r_->forward(k, torch::cat({x, zc}, 1));  // [C, D]
    torch::Tensor g = target.energy_and_grad(x + r, create_graph).grad;  // dU(x + R)
    torch::Tensor out = net_sqt_->forward(k, torch::cat({x, zc, g}, 1));  // [C, 3 half_max]
    return {out.narrow(1, 0, nu), out.narrow(1, half_max, nu), out.narrow(1, 2 * half_max, nu),
            g.index_select(1, upd_idx_[k])};
  }
  torch::Tensor out = net_sqt_->forward(k, torch::cat({x, zc}, 1));  // [C, 2 half_max]
  return {out.narrow(1, 0, nu), torch::Tensor(), out.narrow(1, half_max, nu), torch::Tensor()};
}

FlowPass LearnedSamplerImpl::forward_flow(Target& target, const torch::Tensor& x, const torch::Tensor& z0,
                                          bool create_graph) {
  const torch::Tensor eps_sub = log_eps_.exp() / static_cast<double>(substeps());  // eps' = eps / (2N)
  torch::Tensor z = z0;
  torch::Tensor log_det = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat64));
  for (int64_t k = 0; k < substeps(); ++k) {
    auto [s, q, t, gu] = coupling(target, k, x, z, create_graph);
    torch::Tensor zu = z.index_select(1, upd_idx_[k]);
    torch::Tensor shift = gu.defined() ? gu * torch::exp(q) + t : t;
    z = z.index_copy(1, upd_idx_[k], zu * torch::exp(s) - eps_sub * shift);
    log_det = log_det + s.sum(1).to(torch::kFloat64);
  }
  return {z, log_det};
}

FlowPass LearnedSamplerImpl::inverse_flow(Target& target, const torch::Tensor& x, const torch::Tensor& z_in,
                                          bool create_graph) {
  const torch::Tensor eps_sub = log_eps_.exp() / static_cast<double>(substeps());
  torch::Tensor z = z_in;
  torch::Tensor log_det = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat64));
  for (int64_t k = substeps() - 1; k >= 0; --k) {
    auto [s, q, t, gu] = coupling(target, k, x, z, create_graph);
    torch::Tensor zu = z.index_select(1, upd_idx_[k]);
    torch::Tensor shift = gu.defined() ? gu * torch::exp(q) + t : t;
    z = z.index_copy(1, upd_idx_[k], (zu + eps_sub * shift) * torch::exp(-s));
    log_det = log_det + s.sum(1).to(torch::kFloat64);
  }
  return {z, log_det};
}

torch::Tensor LearnedSamplerImpl::langevin_drift(const torch::Tensor& x, const torch::Tensor& grad) {
  const int64_t d = options_.dim;
  torch::Tensor out = net_drift_->forward(0, x);  // [C, 2D]
  torch::Tensor eps = log_eps_.exp();
  return -0.5 * eps * eps * grad * torch::exp(out.narrow(1, 0, d)) + out.narrow(1, d, d);
}

LearnedSamplerImpl::Proposed LearnedSamplerImpl::propose(Target& target, const torch::Tensor& x,
                                                         const torch::Tensor& grad, at::Generator& gen,
                                                         bool create_graph) {
  const int64_t d = options_.dim;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == d, "learned sampler: expected x [C, ", d, "], got ", x.sizes());
  torch::Tensor z0 = randn(x.sizes(), gen, x.options());
  if (!create_graph && native_step_applies(x)) return propose_native(target, x, grad, z0);
  return propose_from(target, x, grad, z0, create_graph);
}

LearnedSamplerImpl::Proposed LearnedSamplerImpl::propose_given(Target& target, const torch::Tensor& x,
                                                               const torch::Tensor& grad, const torch::Tensor& z0) {
  torch::NoGradGuard no_grad;
  if (native_step_applies(x)) return propose_native(target, x, grad, z0);
  return propose_from(target, x, grad, z0, /*create_graph=*/false);
}

bool LearnedSamplerImpl::native_step_applies(const torch::Tensor& x) const {
  if (options_.engine == Engine::kLibTorch) return false;
  const bool pays = options_.engine == Engine::kNative || x.size(0) * flops_per_step() <= options_.native_max_flops;
  return !torch::GradMode::is_enabled() && x.is_cpu() && x.dim() == 2 && pays && options_.variant != Variant::kFull &&
         log_eps_.is_cpu() &&
         // model.matmul auto, or native (the model's dtype) when that is float64 as the pass is
         (options_.matmul == MatmulOption::kAuto ||
          (options_.matmul == MatmulOption::kNative && log_eps_.scalar_type() == torch::kFloat64));
}

LearnedSamplerImpl::Proposed LearnedSamplerImpl::propose_native(Target& target, const torch::Tensor& x,
                                                                const torch::Tensor& grad, const torch::Tensor& z0) {
  TORCH_CHECK(options_.variant != Variant::kFull && x.is_cpu(), "propose_native: the ", variant_name(options_.variant),
              " variant on ", x.device(), " has no native pass");
  torch::NoGradGuard no_grad;
  // Note [The learned step's native pass]: the copy is remade when a parameter or buffer was
  // written (an optimiser step, set_eps, set_preconditioner, to()) since it was made.
  std::vector<std::pair<const void*, int64_t>> key;
  for (const auto& t : parameters()) key.emplace_back(t.data_ptr(), static_cast<int64_t>(t._version()));
  for (const auto& t : buffers()) key.emplace_back(t.data_ptr(), static_cast<int64_t>(t._version()));
  if (!native_ || key != native_key_) {
    auto n = std::make_shared<NativeLearnedStep>();
    const int64_t d = options_.dim;
    n->dim = d;
    n->substeps = substeps();
    n->half_max = (d + 1) / 2;
    n->langevin = options_.variant == Variant::kLangevin;
    for (int64_t k = 0; k < substeps(); ++k) {
      torch::Tensor u = upd_idx_[k].to(torch::kCPU).contiguous(), c = cond_idx_[k].to(torch::kCPU).contiguous();
      n->upd.emplace_back(u.data_ptr<int64_t>(), u.data_ptr<int64_t>() + u.numel());
      n->cond.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }
    n->sqt = net_sqt_->native();
    if (net_drift_) n->drift = net_drift_->native();
    NativeAffine& na = n->affine;
    na.dim = d;
    if (preconditioned()) {
      auto f64 = [](const torch::Tensor& t) { return t.defined() ? t.detach().to(torch::kCPU, torch::kFloat64) : t; };
      AffineTransform a = model_affine(f64(pre_shift_), f64(pre_base_), f64(pre_log_scale_), f64(pre_lower_),
                              options_.learn_precondition, f64(pre_directions_), f64(pre_log_eigen_));
      na.m = native_rows(a.shift());
      na.log_det = a.log_det().item<double>();
      if (a.is_low_rank()) {
        na.kind = NativeAffine::Kind::kLowRank;
        na.rank = a.directions().size(1);
        na.scale = native_rows(a.scale());
        na.q = native_rows(a.directions());
        na.em1_t = native_rows(torch::expm1(a.log_eigen()));
        na.em1_nt = native_rows(torch::expm1(-a.log_eigen()));
      } else if (a.is_dense()) {
        na.kind = NativeAffine::Kind::kDense;
        na.lower = native_rows(a.matrix());
      } else {
        na.kind = NativeAffine::Kind::kDiag;
        na.scale = native_rows(a.scale());
      }
    }
    native_ = std::move(n);
    native_key_ = std::move(key);
  }
  return native_->propose(target, x, grad, z0, log_eps_.item<double>());
}

LearnedSamplerImpl::Proposed LearnedSamplerImpl::propose_from(Target& target, const torch::Tensor& x,
                                                              const torch::Tensor& grad, const torch::Tensor& z0,
                                                              bool create_graph) {
  const int64_t d = options_.dim;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == d && z0.sizes() == x.sizes(), "learned sampler: expected x and z0 [C, ", d,
              "], got ", x.sizes(), " and ", z0.sizes());
  if (!preconditioned()) return propose_latent(target, x, grad, z0, create_graph);
  AffineTransform a = model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition, pre_directions_, pre_log_eigen_);
  TransformedTarget view = latent_view(target, a);
  Proposed p = propose_latent(view, a.to_latent(x), grad.defined() ? a.latent_grad(grad) : grad, z0, create_graph);
  p.x_new = a.from_latent(p.x_new);
  if (p.grad_new.defined()) p.grad_new = a.ambient_grad(p.grad_new);
  p.log_det = p.log_det + a.log_det();
  p.log_det_rev = p.log_det_rev + a.log_det();
  p.log_q_fwd = p.log_q_fwd - a.log_det();
  p.log_q_rev = p.log_q_rev - a.log_det();
  return p;
}

LearnedSamplerImpl::Proposed LearnedSamplerImpl::propose_latent(Target& target, const torch::Tensor& x,
                                                                const torch::Tensor& grad, const torch::Tensor& z0,
                                                                bool create_graph) {
  const int64_t d = options_.dim;
  torch::Tensor eps = log_eps_.exp();
  const torch::Tensor d_log_eps = static_cast<double>(d) * log_eps_.to(torch::kFloat64);
  Proposed p;
  FlowPass fwd = forward_flow(target, x, z0, create_graph);
  torch::Tensor z_rev_target;
  if (options_.variant == Variant::kLangevin) {
    TORCH_CHECK(grad.defined(), "the langevin variant needs dU(x)");
    p.x_new = x + eps * fwd.z + langevin_drift(x, grad);
    auto eg = target.energy_and_grad(p.x_new, create_graph);
    p.energy_new = eg.energy;
    p.grad_new = eg.grad;
    z_rev_target = (x - p.x_new - langevin_drift(p.x_new, eg.grad)) / eps;
  } else {
    p.x_new = x + eps * fwd.z;
    p.energy_new = target.energy(p.x_new);
    z_rev_target = -fwd.z;
  }
  FlowPass rev = inverse_flow(target, p.x_new, z_rev_target, create_graph);
  set_flow_densities(p, z0, fwd, rev, d_log_eps);
  return p;
}

torch::Tensor LearnedSamplerImpl::log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                                              const torch::Tensor& x_to) {
  if (!preconditioned()) return log_density_latent(target, x_from, grad_from, x_to);
  if (options_.precondition == Precondition::kLowRank) {
    AffineTransform a = model_affine(pre_shift_, pre_base_, pre_log_scale_, pre_lower_, options_.learn_precondition,
                                     pre_directions_, pre_log_eigen_);
    TransformedTarget view = latent_view(target, a);
    return log_density_latent(view, a.to_latent(x_from), grad_from.defined() ? a.latent_grad(grad_from) : grad_from,
                              a.to_latent(x_to)) -
           a.log_det();
  }
  return log_density_with(target, x_from, grad_from, x_to, precondition_matrix());
}

torch::Tensor LearnedSamplerImpl::log_density_with(Target& target, const torch::Tensor& x_from,
                                                   const torch::Tensor& grad_from, const torch::Tensor& x_to,
                                                   const torch::Tensor& l) {
  AffineTransform a = dense_affine(pre_shift_, l);
  TransformedTarget view = latent_view(target, a);
  return log_density_latent(view, a.to_latent(x_from), grad_from.defined() ? a.latent_grad(grad_from) : grad_from,
                            a.to_latent(x_to)) -
         a.log_det();
}

torch::Tensor LearnedSamplerImpl::log_density_latent(Target& target, const torch::Tensor& x_from,
                                                     const torch::Tensor& grad_from, const torch::Tensor& x_to) {
  torch::Tensor eps = log_eps_.exp();
  torch::Tensor drift = options_.variant == Variant::kLangevin ? langevin_drift(x_from, grad_from) : torch::zeros_like(x_from);
  FlowPass inv = inverse_flow(target, x_from, (x_to - x_from - drift) / eps, /*create_graph=*/false);
  return flow_log_density(inv.z, inv.log_det, static_cast<double>(options_.dim) * log_eps_.to(torch::kFloat64));
}

int64_t LearnedSamplerImpl::grads_per_step() const {
  switch (options_.variant) {
    case Variant::kFull: return 4 * options_.steps;
    case Variant::kNoGrad: return 0;
    case Variant::kLangevin: return 1;
  }
  return 0;
}

int64_t LearnedSamplerImpl::flops_per_step() const {
  int64_t per_substep = net_sqt_->flops_per_row() + (net_r_ ? net_r_->flops_per_row() : 0);
  int64_t total = 2 * substeps() * per_substep;
  if (net_drift_) total += 2 * net_drift_->flops_per_row();
  // Preconditioner: per proposal about 4 (diag) or 4 D (dense) multiply-adds per coordinate
  // (to and from the flow's coordinates, the gradients and the reverse pass's solves).
  if (preconditioned()) {
    const int64_t per = options_.precondition == Precondition::kDense     ? 4 * options_.dim
                        : options_.precondition == Precondition::kLowRank ? 4 + 8 * pre_directions_.size(1)
                                                             : 4;
    total += 2 * options_.dim * per;
  }
  return total;
}

void LearnedProposal::set_persistence(double rho) {
  if (!(rho >= 0.0 && rho < 1.0)) throw UsageError("persistence must be in [0, 1), got " + std::to_string(rho));
  rho_ = rho;
  z_ = pending_z0_ = pending_rev_ = torch::Tensor();
}

ProposalResult LearnedProposal::propose(Target& target, const ChainState& state, at::Generator& gen) {
  if (rho_ == 0.0) return ModelProposal::propose(target, state, gen);
  // Note [Persistent noise]: z0 = rho z + sqrt(1 - rho^2) xi, from the carried z (a fresh draw at first)
  torch::NoGradGuard no_grad;
  torch::Tensor z0 = randn(state.x.sizes(), gen, state.x.options());
  if (z_.defined() && z_.sizes() == state.x.sizes()) z0 = rho_ * z_ + std::sqrt(1.0 - rho_ * rho_) * z0;
  Proposed p = sampler_->propose_given(target, state.x, state.grad, z0);
  pending_z0_ = z0;
  pending_rev_ = p.z0_rev.to(z0.dtype());
  return as_proposal_result(p);
}

void LearnedProposal::observe(const StepInfo& info) {
  if (rho_ == 0.0 || !pending_z0_.defined()) return;
  // accepted: the reverse move's base draw, negated (the move goes on); rejected: the draw, negated
  z_ = -torch::where(info.accepted.unsqueeze(1), pending_rev_, pending_z0_);
  pending_z0_ = pending_rev_ = torch::Tensor();
}

}  // namespace nmcmc
