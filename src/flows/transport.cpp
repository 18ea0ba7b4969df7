// The flow transport and the pulled-back target (Note [Flow transport]); its fit, with the
// hand-written gradient of the passes below, is flows/transport_fit.cpp.
#include "nmcmc/flows/transport.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/adaptation.hpp"

namespace nmcmc {

namespace {
const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);

int64_t resolved_hidden(const FlowOptions& o) { return o.hidden > 0 ? o.hidden : default_flow_hidden(o.dim); }
}  // namespace

int64_t default_flow_hidden(int64_t dim) { return std::clamp<int64_t>(2 * dim, 32, 64); }

FlowTransportImpl::FlowTransportImpl(const FlowOptions& options) : options_(options) {
  TORCH_CHECK(options.dim >= 1, "FlowTransport: dim must be >= 1, got ", options.dim);
  TORCH_CHECK(options.layers >= 0, "FlowTransport: layers must be >= 0, got ", options.layers);
  TORCH_CHECK(options.max_log_scale > 0, "FlowTransport: max_log_scale must be positive");
  const int64_t d = options.dim, h = resolved_hidden(options);
  shift_ = register_parameter("shift", torch::zeros({d}, kF64));
  log_scale_ = register_parameter("log_scale", torch::zeros({d}, kF64));
  if (d <= kMaxDenseBase) lower_ = register_parameter("lower", torch::zeros({d, d}, kF64));
  // Masks: a random half of the coordinates conditions each layer; consecutive layers swap the
  // halves, so every coordinate is updated in every second layer (D = 1: nothing to couple).
  at::Generator gen = make_generator(options.mask_seed);
  torch::Tensor mask;
  for (int64_t k = 0; k < (d >= 2 ? options.layers : 0); ++k) {
    if (k % 2 == 0) {
      torch::Tensor perm = torch::randperm(d, gen, torch::TensorOptions().dtype(torch::kLong));
      mask = torch::zeros({d}, kF64);
      mask.index_fill_(0, perm.slice(0, 0, d / 2), 1.0);
    } else {
      mask = 1.0 - mask;
    }
    masks_.push_back(mask.clone());
    torch::nn::Sequential net(torch::nn::Linear(d, h), torch::nn::SiLU(), torch::nn::Linear(h, h), torch::nn::SiLU(),
                              torch::nn::Linear(h, 2 * d));
    net->to(torch::kFloat64);
    {
      // LibTorch's initialisation draws from the global generator: draw the hidden layers' weights
      // from ours instead (the same uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))), so that a seed gives
      // the same flow; the output layer starts at zero (the identity: reset_layers below).
      torch::NoGradGuard no_grad;
      for (int idx : {0, 2}) {
        auto* lin = net[idx]->as<torch::nn::Linear>();
        const double bound = 1.0 / std::sqrt(static_cast<double>(lin->weight.size(1)));
        lin->weight.uniform_(-bound, bound, gen);
        lin->bias.uniform_(-bound, bound, gen);
      }
    }
    nets_.push_back(register_module("coupling" + std::to_string(k), net));
  }
  reset_layers();
}

std::pair<torch::Tensor, torch::Tensor> FlowTransportImpl::scale_shift(int64_t k, const torch::Tensor& y_cond) const {
  const double a = options_.max_log_scale;
  torch::Tensor out = nets_[k].ptr()->forward(y_cond);  // [C, 2D]
  torch::Tensor free = 1.0 - masks_[k].to(out.scalar_type());
  torch::Tensor s = a * torch::tanh(out.slice(1, 0, options_.dim) / a) * free;
  torch::Tensor t = out.slice(1, options_.dim) * free;
  return {s, t};
}

TransportPass FlowTransportImpl::forward(const torch::Tensor& z) const {
  TORCH_CHECK(z.dim() == 2 && z.size(1) == options_.dim, "FlowTransport: expected [C, ", options_.dim, "], got ",
              z.sizes());
  // In the parameters' dtype: float64, except while fit_transport works on a float32 copy.
  torch::Tensor y = z.to(shift_.scalar_type());
  torch::Tensor log_det = torch::zeros({y.size(0)}, shift_.options());
  for (size_t k = 0; k < nets_.size(); ++k) {
    auto [s, t] = scale_shift(static_cast<int64_t>(k), y * masks_[k].to(y.scalar_type()));
    y = y * torch::exp(s) + t;  // s = t = 0 on the conditioning half
    log_det = log_det + s.sum(1);
  }
  torch::Tensor x = dense_base() ? shift_ + y.matmul(base_matrix().t()) : shift_ + y * torch::exp(log_scale_);
  return {x, log_det + log_scale_.sum()};
}

torch::Tensor FlowTransportImpl::affine_pull_back(const torch::Tensor& g) const {
  TORCH_CHECK(nets_.empty(), "FlowTransport: affine_pull_back needs a flow without coupling layers");
  torch::NoGradGuard no_grad;
  // forward()'s last line, differentiated in y: x = mu + y L^T gives g L; x = mu + y exp(s) gives g exp(s).
  return dense_base() ? g.matmul(base_matrix()) : g * torch::exp(log_scale_);
}

TransportPass FlowTransportImpl::inverse(const torch::Tensor& x) const {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == options_.dim, "FlowTransport: expected [C, ", options_.dim, "], got ",
              x.sizes());
  torch::Tensor u = x.to(shift_.scalar_type()) - shift_;
  // rows solve y L^T = x - mu
  torch::Tensor y = dense_base() ? torch::linalg_solve_triangular(base_matrix().t(), u, /*upper=*/true, /*left=*/false)
                                 : u * torch::exp(-log_scale_);
  torch::Tensor log_det = torch::zeros({y.size(0)}, shift_.options()) - log_scale_.sum();
  for (int64_t k = static_cast<int64_t>(nets_.size()) - 1; k >= 0; --k) {
    auto [s, t] = scale_shift(k, y * masks_[k].to(y.scalar_type()));
    y = (y - t) * torch::exp(-s);
    log_det = log_det - s.sum(1);
  }
  return {y, log_det};
}

AffineTransform FlowTransportImpl::base() const {
  torch::NoGradGuard no_grad;
  torch::Tensor log_det = log_scale_.sum().to(torch::kFloat64);
  if (dense_base()) return AffineTransform::dense(shift_.detach(), base_matrix().detach(), torch::Tensor(), log_det);
  return AffineTransform::diagonal(shift_.detach(), log_scale_.exp().detach(), log_det);
}

torch::Tensor FlowTransportImpl::base_matrix() const {
  return torch::tril(lower_, -1) + torch::diag(torch::exp(log_scale_));
}

void FlowTransportImpl::set_base_cholesky(const torch::Tensor& shift, const torch::Tensor& lower) {
  const int64_t d = options_.dim;
  TORCH_CHECK(shift.numel() == d && lower.dim() == 2 && lower.size(0) == d && lower.size(1) == d,
              "set_base_cholesky: expected a shift [", d, "] and L [", d, ", ", d, "]");
  torch::Tensor l = lower.to(torch::kFloat64);
  TORCH_CHECK((l.diagonal() > 0).all().item<bool>(), "set_base_cholesky: L's diagonal must be positive");
  set_base(shift, l.diagonal().log());
  if (dense_base()) {
    torch::NoGradGuard no_grad;
    lower_.copy_(torch::tril(l, -1));
  }
}

void FlowTransportImpl::set_base(const torch::Tensor& shift, const torch::Tensor& log_scale) {
  TORCH_CHECK(shift.numel() == options_.dim && log_scale.numel() == options_.dim, "set_base: expected [",
              options_.dim, "] tensors");
  torch::NoGradGuard no_grad;
  shift_.copy_(shift.reshape({-1}).to(torch::kFloat64));
  log_scale_.copy_(log_scale.reshape({-1}).to(torch::kFloat64));
  if (dense_base()) lower_.zero_();
}

void FlowTransportImpl::perturb(double scale, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  if (dense_base()) lower_.add_(scale * torch::randn(lower_.sizes(), gen, kF64));
  for (auto& net : nets_) {
    auto* last = net[4]->as<torch::nn::Linear>();
    last->weight.add_(scale * torch::randn(last->weight.sizes(), gen, kF64));
    last->bias.add_(scale * torch::randn(last->bias.sizes(), gen, kF64));
  }
}

void FlowTransportImpl::reset_layers() {
  torch::NoGradGuard no_grad;
  for (auto& net : nets_) {
    auto* last = net[4]->as<torch::nn::Linear>();
    last->weight.zero_();
    last->bias.zero_();
  }
}

std::shared_ptr<const NativeFlowPass> FlowTransportImpl::native() const {
  if (options_.engine == Engine::kLibTorch) return nullptr;
  std::lock_guard<std::mutex> lock(native_cache_->mutex);
  // The parameters are registered in the constructor and never replaced (to() and load() change
  // their data in place, which the stamp sees): one list, taken once (parameters() builds an
  // ordered map of names per call).
  std::vector<torch::Tensor>& params = native_cache_->params;
  if (params.empty()) params = parameters();
  bool same = native_cache_->pass != nullptr && native_cache_->stamp.size() == params.size();
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    if (p.scalar_type() != torch::kFloat64 || !p.device().is_cpu()) return nullptr;
    same = same && native_cache_->stamp[i].first == p.data_ptr() && native_cache_->stamp[i].second == p._version();
  }
  if (same) return native_cache_->pass;
  std::vector<std::pair<const void*, int64_t>> stamp;
  stamp.reserve(params.size());
  for (const auto& p : params) stamp.emplace_back(p.data_ptr(), p._version());
  torch::NoGradGuard no_grad;
  auto pass = std::make_shared<NativeFlowPass>();
  const int64_t d = options_.dim;
  auto values = [](const torch::Tensor& t) {
    torch::Tensor c = t.detach().contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  pass->dim = d;
  pass->max_log_scale = options_.max_log_scale;
  pass->dense = dense_base();
  pass->shift = values(shift_);
  if (pass->dense) {
    pass->lower = values(base_matrix());
  } else {
    pass->scale = values(torch::exp(log_scale_));
  }
  pass->base_log_det = log_scale_.sum().item<double>();
  for (size_t k = 0; k < nets_.size(); ++k) {
    const auto& seq = *nets_[k];
    auto* l1 = seq[0]->as<torch::nn::Linear>();
    auto* l2 = seq[2]->as<torch::nn::Linear>();
    auto* l3 = seq[4]->as<torch::nn::Linear>();
    pass->hidden = l1->weight.size(0);
    torch::Tensor mask = masks_[k];
    torch::Tensor cond = mask.nonzero().reshape({-1}), free = (1.0 - mask).nonzero().reshape({-1});
    NativeFlowPass::Layer layer;
    layer.cond.assign(cond.data_ptr<int64_t>(), cond.data_ptr<int64_t>() + cond.numel());
    layer.free.assign(free.data_ptr<int64_t>(), free.data_ptr<int64_t>() + free.numel());
    torch::Tensor w1 = l1->weight.index_select(1, cond);  // [h, nc]
    layer.w1_rows = values(w1);
    layer.w1_cols = values(w1.t());
    layer.b1 = values(l1->bias);
    layer.w2_rows = values(l2->weight);
    layer.w2_cols = values(l2->weight.t());
    layer.b2 = values(l2->bias);
    torch::Tensor w3s = l3->weight.slice(0, 0, d).index_select(0, free);  // [nf, h]
    torch::Tensor w3t = l3->weight.slice(0, d).index_select(0, free);
    layer.w3s_rows = values(w3s);
    layer.w3t_rows = values(w3t);
    layer.w3s_cols = values(w3s.t());
    layer.w3t_cols = values(w3t.t());
    layer.b3s = values(l3->bias.slice(0, 0, d).index_select(0, free));
    layer.b3t = values(l3->bias.slice(0, d).index_select(0, free));
    pass->layers.push_back(std::move(layer));
  }
  native_cache_->pass = pass;
  native_cache_->stamp = std::move(stamp);
  return pass;
}

namespace {
torch::Tensor f64(const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64); }
}  // namespace

TransformPass FlowTransform::forward(const torch::Tensor& z) const { return flow_->forward(f64(z)); }

TransformPass FlowTransform::inverse(const torch::Tensor& x) const { return flow_->inverse(f64(x)); }

std::pair<torch::Tensor, torch::Tensor> FlowTransform::latent_pairs(const torch::Tensor& x, const torch::Tensor& g) const {
  return Transform::latent_pairs(f64(x), f64(g));
}

std::pair<torch::Tensor, torch::Tensor> FlowTransform::ambient_pairs(const torch::Tensor& z, const torch::Tensor& g_z) const {
  return Transform::ambient_pairs(f64(z), f64(g_z));
}

torch::Tensor FlowTransform::pulled_energy(Target& inner, const torch::Tensor& z, bool jacobian) const {
  auto pass = jacobian ? flow_->native() : nullptr;
  if (!pass) return Transform::pulled_energy(inner, z, jacobian);
  // Note [The flow's native pass]
  torch::NoGradGuard no_grad;
  torch::Tensor zc = f64(z).contiguous();
  const int64_t n = zc.size(0);
  torch::Tensor x = torch::empty({n, dim()}, kF64), ld = torch::empty({n}, kF64);
  pass->forward(zc.data_ptr<double>(), n, x.data_ptr<double>(), ld.data_ptr<double>(), nullptr);
  torch::Tensor u = f64(inner.energy(x.to(inner.options())));
  return (u - ld).to(inner.options());
}

EnergyGrad FlowTransform::pulled_energy_and_grad(Target& inner, const torch::Tensor& z, bool create_graph,
                                                 bool jacobian) const {
  // Training through the gradient (the learned proposal in the latent space) takes the graph.
  if (create_graph || !jacobian) return Transform::pulled_energy_and_grad(inner, f64(z), create_graph, jacobian);
  if (flow_->layers() == 0) {
    // The affine map alone (Note [The flow or its affine base], the transport's first round): the
    // same values as the graph, without one (a graph through the flow cost ~10x the pass).
    torch::NoGradGuard no_grad;
    TransportPass fwd = flow_->forward(f64(z));
    EnergyGrad eg = inner.energy_and_grad(fwd.out.to(inner.options()), false);
    torch::Tensor g = f64(eg.grad);
    torch::Tensor gz = flow_->affine_pull_back(g.nan_to_num(0.0, 0.0, 0.0));
    gz = gz.masked_fill((~(torch::isfinite(g).all(1))).unsqueeze(1), std::numeric_limits<double>::quiet_NaN());
    torch::Tensor u = f64(eg.energy) - fwd.log_det;
    return {u.to(inner.options()), gz.to(inner.options())};
  }
  auto pass = flow_->native();
  if (!pass) return Transform::pulled_energy_and_grad(inner, f64(z), false, true);
  // Note [The flow's native pass]: the same values as the graph, with as few tensor operations
  // around the pass as can be (each costs microseconds; the pass at D = 5 about 30).
  torch::NoGradGuard no_grad;
  torch::Tensor zc = f64(z.detach()).contiguous();
  const int64_t n = zc.size(0), d = dim();
  torch::Tensor x = torch::empty({n, d}, kF64);
  std::vector<double> ld(n);
  NativeFlowPass::Tape tape;
  pass->forward(zc.data_ptr<double>(), n, x.data_ptr<double>(), ld.data(), &tape);
  EnergyGrad eg = inner.energy_and_grad(x.to(inner.options()), false);
  torch::Tensor g = f64(eg.grad).contiguous();
  torch::Tensor e = f64(eg.energy).contiguous();
  std::vector<double> gv(g.data_ptr<double>(), g.data_ptr<double>() + n * d);
  std::vector<char> bad(n, 0);
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t j = 0; j < d; ++j) bad[c] |= !std::isfinite(gv[c * d + j]);
    if (bad[c]) std::fill(gv.begin() + c * d, gv.begin() + (c + 1) * d, 0.0);
  }
  torch::Tensor gz = torch::empty({n, d}, kF64), u = torch::empty({n}, kF64);
  pass->pull_back(tape, gv.data(), gz.data_ptr<double>());
  double* gzp = gz.data_ptr<double>();
  double* up = u.data_ptr<double>();
  const double* ep = e.data_ptr<double>();
  for (int64_t c = 0; c < n; ++c) {
    // A failed row (NaN) stays NaN; the kernels reject it.
    if (bad[c]) std::fill(gzp + c * d, gzp + (c + 1) * d, std::numeric_limits<double>::quiet_NaN());
    up[c] = ep[c] - ld[c];
  }
  return {u.to(inner.options()), gz.to(inner.options())};
}

}  // namespace nmcmc
