// The flow transport, its Fisher-divergence fit and the pulled-back target (Note [Flow transport]).
// Over 600 lines for one reason: the fit's hand-written gradient (fisher_terms, Note [The fit's own
// gradient]) sits beside the passes it differentiates, so that a change to one is read with the other.
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

int64_t resolved_hidden(const FlowOptions& o) {
  return o.hidden > 0 ? o.hidden : std::clamp<int64_t>(2 * o.dim, 32, 256);
}
}  // namespace

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

// Note [The fit's own gradient]
// The Fisher loss (Note [Flow transport]) differentiates the latent score grad U_z, itself a
// vector-Jacobian product through the flow, in the flow's parameters: LibTorch does it by double
// back-propagation (a graph of the inverse, the forward pass and the VJP, then a backward pass
// through that graph), thousands of small operations per step at the fit's batch of 256 rows and
// ~30-unit conditioners, where the arithmetic itself is a few million multiply-adds. Here the
// three sweeps and their reverse are written out as batched matrix products:
//   inverse, layers K..1:  c = y_k m, (h1, a1, h2, a2, o) the conditioner at c, s = a tanh(o_s/a)(1-m),
//                          t = o_t (1-m), y_{k-1} = (y_k - t) exp(-s)            (y_K = L^-1 (x - mu))
//   score, layers K..1:    w = (w_s, w_t), w_s = (v_k (y_k - t) - 1)(1 - tanh^2)(1-m), w_t = v_k (1-m),
//                          r = W1^T (sigma'(h1) W2^T (sigma'(h2) W3^T w)),
//                          v_{k-1} = v_k exp(s) + r m                             (v_K = L^T g)
//   loss:                  l_i = min(|v_0 - y_0|^2 / D, kMaxPointLoss)
// (the conditioner's input at layer k is the same in the inverse and in the forward pass, so one
// evaluation serves both), and the reverse runs layers 1..K, each taking the adjoints of v_{k-1}
// and y_{k-1} to those of v_k, y_k and the layer's weights: through the VJP's dependence on the
// weights and on h1, h2 (sigma'' of the SiLU enters here), through w, through the inverse's
// (y_k - t) exp(-s), and through the conditioner's own forward pass. The base: v_K = L^T g gives
// L's adjoint g^T v_bar; y_K = L^-1 (x - mu) gives q = L^-T y_bar, mu_bar = -sum q, L_bar -= q y_K^T.
// Transport.OwnFisherGradientEqualsAutograd checks every parameter's gradient against LibTorch's
// double back-propagation (dense and diagonal bases, clipped rows) to 1e-10. One function of ~150
// lines: each forward quantity's adjoint is computed next to where the forward pass stored it.
torch::Tensor FlowTransportImpl::fisher_terms(const torch::Tensor& x_in, const torch::Tensor& g_in,
                                              bool accumulate_grad) const {
  torch::NoGradGuard no_grad;
  const auto opts = shift_.options();
  const int64_t d = options_.dim, n = x_in.size(0);
  TORCH_CHECK(x_in.dim() == 2 && x_in.sizes() == g_in.sizes() && x_in.size(1) == d,
              "FlowTransport::fisher_terms: expected x and g [n, ", d, "]");
  const torch::Tensor x = x_in.to(opts), g = g_in.to(opts);
  const double a = options_.max_log_scale;
  const int64_t layers = static_cast<int64_t>(nets_.size());
  struct Tape {
    torch::Tensor m, fm, c, h1, sg1, a1, h2, sg2, a2, th, es, y_out, ymt;  // y_out: y_k, ymt: y_k - t
    torch::Tensor q, w, da2, dh2, da1, dh1, sp1, sp2, v_out;  // q: 1 - tanh^2, v_out: v_k
  };
  std::vector<Tape> tape(static_cast<size_t>(layers));
  auto linear = [&](int64_t k, int idx) { return (*nets_[static_cast<size_t>(k)])[idx]->as<torch::nn::Linear>(); };
  // base: y_K = L^-1 (x - mu), v_K = L^T g (rows)
  const bool dense = dense_base();
  torch::Tensor lmat = dense ? base_matrix() : torch::Tensor();
  torch::Tensor scale = dense ? torch::Tensor() : torch::exp(log_scale_);
  torch::Tensor u = x - shift_;
  torch::Tensor y = dense ? torch::linalg_solve_triangular(lmat.t(), u, /*upper=*/true, /*left=*/false) : u / scale;
  const torch::Tensor y_top = y;
  for (int64_t k = layers - 1; k >= 0; --k) {
    Tape& tp = tape[static_cast<size_t>(k)];
    tp.m = masks_[static_cast<size_t>(k)].to(opts);
    tp.fm = 1.0 - tp.m;
    tp.y_out = y;
    tp.c = y * tp.m;
    auto* l1 = linear(k, 0);
    auto* l2 = linear(k, 2);
    auto* l3 = linear(k, 4);
    tp.h1 = torch::addmm(l1->bias, tp.c, l1->weight.t());
    tp.sg1 = torch::sigmoid(tp.h1);
    tp.a1 = tp.h1 * tp.sg1;
    tp.h2 = torch::addmm(l2->bias, tp.a1, l2->weight.t());
    tp.sg2 = torch::sigmoid(tp.h2);
    tp.a2 = tp.h2 * tp.sg2;
    torch::Tensor o = torch::addmm(l3->bias, tp.a2, l3->weight.t());  // [n, 2D]
    tp.th = torch::tanh(o.slice(1, 0, d) / a);
    torch::Tensor s_k = a * tp.th * tp.fm;
    torch::Tensor t = o.slice(1, d) * tp.fm;
    tp.es = torch::exp(s_k);
    tp.ymt = y - t;
    y = tp.ymt / tp.es;
  }
  const torch::Tensor z = y;  // y_0
  torch::Tensor v = dense ? g.matmul(lmat) : g * scale;
  const torch::Tensor v_top = v;
  for (int64_t k = layers - 1; k >= 0; --k) {
    Tape& tp = tape[static_cast<size_t>(k)];
    tp.v_out = v;
    tp.q = 1.0 - tp.th * tp.th;
    torch::Tensor ws = (v * tp.ymt - 1.0) * tp.q * tp.fm, wt = v * tp.fm;
    tp.w = torch::cat({ws, wt}, 1);  // [n, 2D]
    tp.sp2 = tp.sg2 * (1.0 + tp.h2 * (1.0 - tp.sg2));  // SiLU'
    tp.sp1 = tp.sg1 * (1.0 + tp.h1 * (1.0 - tp.sg1));
    tp.da2 = tp.w.matmul(linear(k, 4)->weight);  // [n, h]
    tp.dh2 = tp.da2 * tp.sp2;
    tp.da1 = tp.dh2.matmul(linear(k, 2)->weight);
    tp.dh1 = tp.da1 * tp.sp1;
    torch::Tensor r = tp.dh1.matmul(linear(k, 0)->weight);  // [n, D]
    v = v * tp.es + r * tp.m;
  }
  torch::Tensor e = v - z;
  torch::Tensor raw = e.pow(2).sum(1) / static_cast<double>(d);
  torch::Tensor terms = raw.clamp_max(kMaxPointLoss);
  if (!accumulate_grad) return terms;

  auto add_grad = [](const torch::Tensor& p, const torch::Tensor& grad) {
    torch::Tensor& slot = const_cast<torch::Tensor&>(p).mutable_grad();
    if (slot.defined()) {
      slot.add_(grad);
    } else {
      slot = grad.clone();
    }
  };
  // adjoints of v_0 and y_0 (the mean over rows; clipped rows give none)
  torch::Tensor active = (raw <= kMaxPointLoss).to(opts).unsqueeze(1);
  torch::Tensor vbar = e * active * (2.0 / (static_cast<double>(d) * static_cast<double>(n)));
  torch::Tensor ybar = -vbar;
  for (int64_t k = 0; k < layers; ++k) {
    const Tape& tp = tape[static_cast<size_t>(k)];
    auto* l1 = linear(k, 0);
    auto* l2 = linear(k, 2);
    auto* l3 = linear(k, 4);
    const torch::Tensor& vk = tp.v_out;
    // score: v_{k-1} = v_k exp(s) + r m
    torch::Tensor sbar = vbar * vk * tp.es;  // free half only matters (masked below)
    torch::Tensor vkbar = vbar * tp.es;
    torch::Tensor rbar = vbar * tp.m;
    // r = dh1 W1, dh1 = da1 sigma'(h1), da1 = dh2 W2, dh2 = da2 sigma'(h2), da2 = w W3
    torch::Tensor gw1 = tp.dh1.t().matmul(rbar);  // [h, D]
    torch::Tensor dh1bar = rbar.matmul(l1->weight.t());  // [n, h]
    torch::Tensor spp1 = tp.sg1 * (1.0 - tp.sg1) * (2.0 + tp.h1 * (1.0 - 2.0 * tp.sg1));  // SiLU''
    torch::Tensor spp2 = tp.sg2 * (1.0 - tp.sg2) * (2.0 + tp.h2 * (1.0 - 2.0 * tp.sg2));
    torch::Tensor da1bar = dh1bar * tp.sp1;
    torch::Tensor h1bar = dh1bar * tp.da1 * spp1;
    torch::Tensor gw2 = tp.dh2.t().matmul(da1bar);  // [h, h]
    torch::Tensor dh2bar = da1bar.matmul(l2->weight.t());
    torch::Tensor da2bar = dh2bar * tp.sp2;
    torch::Tensor h2bar = dh2bar * tp.da2 * spp2;
    torch::Tensor gw3 = tp.w.t().matmul(da2bar);         // [2D, h]
    torch::Tensor wbar = da2bar.matmul(l3->weight.t());  // [n, 2D]
    torch::Tensor wsbar = wbar.slice(1, 0, d) * tp.fm, wtbar = wbar.slice(1, d) * tp.fm;
    // w_t = v_k (1-m); w_s = P q (1-m), P = v_k (y_k - t) - 1, q = 1 - tanh^2
    const torch::Tensor& q = tp.q;
    torch::Tensor pbar = wsbar * q;
    torch::Tensor thbar = -2.0 * tp.th * (wsbar * (vk * tp.ymt - 1.0));
    vkbar = vkbar + wtbar + pbar * tp.ymt;
    torch::Tensor tbar = -pbar * vk;
    torch::Tensor ykbar = pbar * vk;
    // inverse: y_{k-1} = (y_k - t) exp(-s) on the free half, y_k on the conditioning half
    const torch::Tensor& y_prev = (k == 0) ? z : tape[static_cast<size_t>(k - 1)].y_out;
    torch::Tensor yb_free = ybar * tp.fm;
    ykbar = ykbar + ybar * tp.m + yb_free / tp.es;
    tbar = tbar - yb_free / tp.es;
    sbar = sbar - yb_free * y_prev;
    // heads: s = a tanh(o_s / a)(1-m), t = o_t (1-m)
    thbar = thbar + a * sbar * tp.fm;
    torch::Tensor obar = torch::cat({thbar * q / a, tbar * tp.fm}, 1);  // [n, 2D]
    // the conditioner's forward pass
    gw3 = gw3 + obar.t().matmul(tp.a2);
    torch::Tensor gb3 = obar.sum(0);
    torch::Tensor h2tot = obar.matmul(l3->weight) * tp.sp2 + h2bar;
    gw2 = gw2 + h2tot.t().matmul(tp.a1);
    torch::Tensor gb2 = h2tot.sum(0);
    torch::Tensor h1tot = h2tot.matmul(l2->weight) * tp.sp1 + h1bar;
    gw1 = gw1 + h1tot.t().matmul(tp.c);
    torch::Tensor gb1 = h1tot.sum(0);
    ykbar = ykbar + h1tot.matmul(l1->weight) * tp.m;
    add_grad(l1->weight, gw1);
    add_grad(l1->bias, gb1);
    add_grad(l2->weight, gw2);
    add_grad(l2->bias, gb2);
    add_grad(l3->weight, gw3);
    add_grad(l3->bias, gb3);
    vbar = vkbar;
    ybar = ykbar;
  }
  // base
  if (dense) {
    torch::Tensor lbar = g.t().matmul(vbar);  // v_K = g L
    torch::Tensor qb = torch::linalg_solve_triangular(lmat, ybar, /*upper=*/false, /*left=*/false);  // q L = y_bar
    lbar = lbar - qb.t().matmul(y_top);
    add_grad(shift_, -qb.sum(0));
    add_grad(lower_, torch::tril(lbar, -1));
    add_grad(log_scale_, lbar.diagonal() * lmat.diagonal());
  } else {
    add_grad(shift_, -(ybar / scale).sum(0));
    add_grad(log_scale_, (-ybar * y_top + vbar * v_top).sum(0));
  }
  return terms;
}

nlohmann::json to_json_value(const FitReport& r) {
  return {{"points", r.points},
          {"steps", r.steps},
          {"stopped", r.stopped},
          {"loss_start", r.loss_start},
          {"loss_end", r.loss_end},
          {"train_loss_end", r.train_loss_end},
          {"seconds", r.seconds}};
}

namespace {
/// Per-row Fisher loss terms [n] (per coordinate), differentiable by LibTorch's double
/// back-propagation (FitOptions::own_gradient false; the reference for Note [The fit's own gradient]).
torch::Tensor fisher_terms_autograd(const FlowTransportImpl& flow, const torch::Tensor& x, const torch::Tensor& g) {
  torch::AutoGradMode enable(true);
  // z = T^-1(x) depends on the parameters; the score at z is differentiated through both its
  // direct dependence on them and through z (create_graph), so the loss's gradient is exact.
  torch::Tensor z = flow.inverse(x).out;
  TransportPass fwd = flow.forward(z);
  // grad_z [ T(z) . g - log|det| ] = J^T g - grad log|det| (g fixed: the stored gradients).
  torch::Tensor s = (fwd.out * g).sum() - fwd.log_det.sum();
  torch::Tensor gz = torch::autograd::grad({s}, {z}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  return ((gz - z).pow(2).sum(1) / static_cast<double>(flow.dim())).clamp_max(kMaxPointLoss);
}
}  // namespace

torch::Tensor fisher_loss(const FlowTransportImpl& flow, const torch::Tensor& x, const torch::Tensor& g) {
  return fisher_terms_autograd(flow, x.to(torch::kFloat64), g.to(torch::kFloat64)).mean();
}

FitReport fit_transport(FlowTransportImpl& flow, const torch::Tensor& x_in, const torch::Tensor& g_in,
                        const FitOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TORCH_CHECK(x_in.dim() == 2 && x_in.sizes() == g_in.sizes() && x_in.size(1) == flow.dim(),
              "fit_transport: expected x and g [n, ", flow.dim(), "]");
  torch::Tensor x = x_in.to(torch::kCPU, torch::kFloat64), g = g_in.to(torch::kCPU, torch::kFloat64);
  torch::Tensor ok = torch::isfinite(x).all(1) & torch::isfinite(g).all(1);
  x = x.index({ok});
  g = g.index({ok});
  const int64_t n = x.size(0);
  if (n < 8) throw DataError("fit_transport: " + std::to_string(n) + " finite points; at least 8 are needed");
  FitReport report;
  report.points = n;
  if (o.init_base) {
    torch::Tensor var_x = x.var(0, /*unbiased=*/false), var_g = g.var(0, /*unbiased=*/false);
    bool dense = false;
    if (flow.dense_base() && n >= 2) {
      // The dense equivalent of the low-rank-plus-diagonal Fisher estimate, its Cholesky factor.
      torch::Tensor cov = fisher_low_rank(x, g).inv_mass().to(torch::kFloat64);
      auto [l, info] = torch::linalg_cholesky_ex(0.5 * (cov + cov.t()));
      if (info.item<int64_t>() == 0 && torch::isfinite(l).all().item<bool>()) {
        flow.set_base_cholesky(x.mean(0), l);
        dense = true;
      }
    }
    if (!dense) flow.set_base(x.mean(0), 0.5 * fisher_diagonal(var_x, var_g).log());
  }
  at::Generator gen = make_generator(o.seed);
  torch::Tensor perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
  const int64_t n_hold = std::clamp<int64_t>(static_cast<int64_t>(std::lround(o.holdout * n)), 1, n / 2);
  torch::Tensor hold = perm.slice(0, 0, n_hold), train = perm.slice(0, n_hold);
  // Note [Flow transport]: the fit runs on a float32 copy of the flow (about half the time of
  // float64 per step on CPUs; the loss needs no more precision), whose best parameters are then
  // copied back: the flow itself, which sampling evaluates, stays float64.
  FlowTransport work(flow.options());
  {
    torch::NoGradGuard no_grad;
    auto mine = work->named_parameters();
    for (const auto& item : flow.named_parameters()) mine[item.key()].copy_(item.value());
  }
  work->to(torch::kFloat32);
  torch::Tensor xh = x.index({hold}).to(torch::kFloat32), gh = g.index({hold}).to(torch::kFloat32);
  torch::Tensor xt = x.index({train}).to(torch::kFloat32), gt = g.index({train}).to(torch::kFloat32);
  const int64_t n_train = xt.size(0);
  auto held_out = [&] {
    // Evaluated with graphs (the loss needs grad_z) but nothing kept.
    if (o.own_gradient) return work->fisher_terms(xh, gh, /*accumulate_grad=*/false).mean().item<double>();
    return fisher_terms_autograd(*work, xh, gh).mean().item<double>();
  };
  report.loss_start = held_out();
  double best = report.loss_start;
  // The work copy's parameters become views of one flat buffer, and their gradients views of
  // another: Adam and the gradient's clipping are then a handful of operations on two vectors
  // (torch::optim::Adam and clip_grad_norm_ cost ~10 operations per parameter tensor, 50 tensors
  // for 8 layers: about a third of a step at D = 5). The same arithmetic as torch::optim::Adam.
  std::vector<torch::Tensor> params = work->parameters();
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const auto work_options = params.front().options();  // the work copy's float32
  torch::Tensor flat = torch::empty({total}, work_options), flat_grad = torch::zeros({total}, work_options);
  {
    torch::NoGradGuard no_grad;
    int64_t off = 0;
    for (auto& p : params) {
      const int64_t len = p.numel();
      torch::Tensor view = flat.slice(0, off, off + len).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
      if (o.own_gradient) p.mutable_grad() = flat_grad.slice(0, off, off + len).view(p.sizes());
      off += len;
    }
  }
  torch::Tensor best_flat = flat.clone();
  torch::Tensor adam_m = torch::zeros({total}, work_options), adam_v = torch::zeros({total}, work_options);
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, max_norm = 10.0;
  int64_t since_best = 0, step = 0;
  double train_loss = 0;
  report.stopped = "steps";
  int64_t max_steps = o.steps;
  if (std::isfinite(best) && best < o.tolerance) {
    max_steps = 0;
    report.stopped = "tolerance";
  }
  for (step = 0; step < max_steps; ++step) {
    torch::NoGradGuard no_grad;
    torch::Tensor idx = torch::randint(n_train, {std::min(o.batch, n_train)}, gen, torch::TensorOptions().dtype(torch::kLong));
    torch::Tensor loss;
    if (o.own_gradient) {
      flat_grad.zero_();
      loss = work->fisher_terms(xt.index({idx}), gt.index({idx}), /*accumulate_grad=*/true).mean();
    } else {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      {
        torch::AutoGradMode enable(true);
        loss = fisher_terms_autograd(*work, xt.index({idx}), gt.index({idx})).mean();
        loss.backward();
      }
      int64_t off = 0;
      for (auto& p : params) {
        const int64_t len = p.numel();
        if (p.grad().defined()) {
          flat_grad.slice(0, off, off + len).copy_(p.grad().reshape({-1}));
        } else {
          flat_grad.slice(0, off, off + len).zero_();
        }
        off += len;
      }
    }
    // clip_grad_norm_(10), then Adam(lr, betas (0.9, 0.999), eps 1e-8)
    const double norm = flat_grad.norm().item<double>();
    const double clip = max_norm / (norm + 1e-6);
    if (clip < 1.0) flat_grad.mul_(clip);
    adam_m.mul_(beta1).add_(flat_grad, 1.0 - beta1);
    adam_v.mul_(beta2).addcmul_(flat_grad, flat_grad, 1.0 - beta2);
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step + 1));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step + 1));
    flat.addcdiv_(adam_m, (adam_v.sqrt() / std::sqrt(bc2)).add_(eps), -o.learning_rate / bc1);
    train_loss = loss.item<double>();
    if ((step + 1) % o.check_every == 0) {
      const double h = held_out();
      if (o.progress) o.progress(step + 1, o.steps, h);
      if (std::isfinite(h) && h < best) {
        best = h;
        since_best = 0;
        best_flat.copy_(flat);
        if (best < o.tolerance) {
          report.stopped = "tolerance";
          ++step;
          break;
        }
      } else if (++since_best >= o.patience) {
        report.stopped = "patience";
        ++step;
        break;
      }
    }
  }
  {
    torch::NoGradGuard no_grad;
    flat.copy_(best_flat);
    auto theirs = flow.named_parameters();
    for (const auto& item : work->named_parameters()) theirs[item.key()].copy_(item.value());  // to float64
  }
  report.steps = step;
  report.loss_end = best;
  report.train_loss_end = train_loss;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

TransportedTarget::TransportedTarget(Target& inner, FlowTransport flow)
    : Target(inner.options()), inner_(&inner), flow_(std::move(flow)) {
  TORCH_CHECK(flow_->dim() == inner.dim(), "TransportedTarget: the flow has dimension ", flow_->dim(),
              ", the target ", inner.dim());
}

torch::Tensor TransportedTarget::to_ambient(const torch::Tensor& z) const {
  torch::NoGradGuard no_grad;
  return flow_->forward(z.to(torch::kCPU, torch::kFloat64)).out.to(inner_->options());
}

torch::Tensor TransportedTarget::to_latent(const torch::Tensor& x) const {
  torch::NoGradGuard no_grad;
  return flow_->inverse(x.to(torch::kCPU, torch::kFloat64)).out.to(options_);
}

torch::Tensor TransportedTarget::log_det(const torch::Tensor& z) const {
  torch::NoGradGuard no_grad;
  return flow_->forward(z.to(torch::kCPU, torch::kFloat64)).log_det;
}

std::pair<torch::Tensor, torch::Tensor> TransportedTarget::ambient_pairs(const torch::Tensor& z,
                                                                         const torch::Tensor& g_z) const {
  torch::AutoGradMode enable(true);
  torch::Tensor zl = z.to(torch::kCPU, torch::kFloat64).detach().requires_grad_(true);
  TransportPass fwd = flow_->forward(zl);
  // Without coupling layers log|det| does not depend on z (allow_unused: its gradient is zero).
  torch::Tensor grad_ld = torch::autograd::grad({fwd.log_det.sum()}, {zl}, {}, c10::nullopt, false, /*allow_unused=*/true)[0];
  if (!grad_ld.defined()) grad_ld = torch::zeros_like(zl);
  torch::Tensor x = fwd.out.detach().requires_grad_(true);
  torch::Tensor z_back = flow_->inverse(x).out;
  torch::Tensor v = g_z.to(torch::kCPU, torch::kFloat64) + grad_ld;
  torch::Tensor g = torch::autograd::grad({z_back}, {x}, {v})[0];  // J^-T v
  return {x.detach(), g.detach()};
}

std::pair<torch::Tensor, torch::Tensor> TransportedTarget::latent_pairs(const torch::Tensor& x_in,
                                                                        const torch::Tensor& g_in) const {
  torch::Tensor x = x_in.to(torch::kCPU, torch::kFloat64), g = g_in.to(torch::kCPU, torch::kFloat64);
  const torch::Tensor ok = torch::isfinite(x).all(1) & torch::isfinite(g).all(1);
  x = x.index({ok});
  g = g.index({ok});
  torch::Tensor z;
  {
    torch::NoGradGuard no_grad;
    z = flow_->inverse(x).out;
  }
  torch::AutoGradMode enable(true);
  z = z.detach().requires_grad_(true);
  const TransportPass fwd = flow_->forward(z);
  std::vector<torch::Tensor> outs{fwd.out}, vs{g};
  if (fwd.log_det.requires_grad()) {  // without coupling layers log|det| does not depend on z
    outs.push_back(fwd.log_det);
    vs.push_back(-torch::ones_like(fwd.log_det));
  }
  torch::Tensor gz = torch::autograd::grad(outs, {z}, vs, c10::nullopt, false, /*allow_unused=*/true)[0];
  if (!gz.defined()) gz = torch::zeros_like(z);
  return {z.detach(), gz.detach()};
}

torch::Tensor TransportedTarget::compute_energy(const torch::Tensor& z) const {
  torch::NoGradGuard no_grad;
  if (auto pass = flow_->native()) {
    // Note [The flow's native pass]
    torch::Tensor zc = z.to(torch::kCPU, torch::kFloat64).contiguous();
    const int64_t n = zc.size(0);
    torch::Tensor x = torch::empty({n, dim()}, kF64), ld = torch::empty({n}, kF64);
    pass->forward(zc.data_ptr<double>(), n, x.data_ptr<double>(), ld.data_ptr<double>(), nullptr);
    torch::Tensor u = inner_->energy(x.to(inner_->options())).to(torch::kCPU, torch::kFloat64);
    return (u - ld).to(options_);
  }
  TransportPass fwd = flow_->forward(z.to(torch::kCPU, torch::kFloat64));
  torch::Tensor u = inner_->energy(fwd.out.to(inner_->options())).to(torch::kCPU, torch::kFloat64);
  return (u - fwd.log_det).to(options_);
}

EnergyGrad TransportedTarget::compute_energy_and_grad(const torch::Tensor& z, bool create_graph) const {
  torch::AutoGradMode enable(true);
  if (create_graph) {
    // Training through the gradient (the learned proposal in the latent space): grad U_z =
    // J^T g(T(z)) - grad log|det| as a differentiable function of z, by one vector-Jacobian
    // product whose vector g carries its own graph (the inner target's create_graph).
    torch::Tensor zl = z.to(torch::kCPU, torch::kFloat64);
    if (!zl.requires_grad()) zl = zl.detach().requires_grad_(true);
    TransportPass fwd = flow_->forward(zl);
    EnergyGrad eg = inner_->energy_and_grad(fwd.out.to(inner_->options()), true);
    torch::Tensor g = eg.grad.to(torch::kCPU, torch::kFloat64);
    // Without coupling layers (the affine map the trials can keep) and with the parameters frozen,
    // as training freezes them, log|det| does not depend on z and has no graph: asking for its
    // gradient threw, and training counted every proposal as a failed density.
    std::vector<torch::Tensor> outs{fwd.out}, vs{g};
    if (fwd.log_det.requires_grad()) {
      outs.push_back(fwd.log_det);
      vs.push_back(-torch::ones_like(fwd.log_det));
    }
    torch::Tensor gz = torch::autograd::grad(outs, {zl}, vs, /*retain_graph=*/true, /*create_graph=*/true,
                                             /*allow_unused=*/true)[0];
    if (!gz.defined()) gz = torch::zeros_like(zl);
    torch::Tensor u = eg.energy.to(torch::kCPU, torch::kFloat64) - fwd.log_det;
    return {u.to(options_), gz.to(options_)};
  }
  if (flow_->layers() == 0) {
    // The affine map alone (Note [The flow or its affine base], the transport's first round): the
    // same values as the graph below, without one (a graph through the flow cost ~10x the pass).
    torch::NoGradGuard no_grad;
    TransportPass fwd = flow_->forward(z.to(torch::kCPU, torch::kFloat64));
    EnergyGrad eg = inner_->energy_and_grad(fwd.out.to(inner_->options()), false);
    torch::Tensor g = eg.grad.to(torch::kCPU, torch::kFloat64);
    torch::Tensor gz = flow_->affine_pull_back(g.nan_to_num(0.0, 0.0, 0.0));
    gz = gz.masked_fill((~(torch::isfinite(g).all(1))).unsqueeze(1), std::numeric_limits<double>::quiet_NaN());
    torch::Tensor u = eg.energy.to(torch::kCPU, torch::kFloat64) - fwd.log_det;
    return {u.to(options_), gz.to(options_)};
  }
  if (auto pass = flow_->native()) {
    // Note [The flow's native pass]: the same values as the graph below, with as few tensor
    // operations around the pass as can be (each costs microseconds; the pass at D = 5 about 30).
    torch::NoGradGuard no_grad;
    torch::Tensor zc = z.detach().to(torch::kCPU, torch::kFloat64).contiguous();
    const int64_t n = zc.size(0), d = dim();
    torch::Tensor x = torch::empty({n, d}, kF64);
    std::vector<double> ld(n);
    NativeFlowPass::Tape tape;
    pass->forward(zc.data_ptr<double>(), n, x.data_ptr<double>(), ld.data(), &tape);
    EnergyGrad eg = inner_->energy_and_grad(x.to(inner_->options()), false);
    torch::Tensor g = eg.grad.to(torch::kCPU, torch::kFloat64).contiguous();
    torch::Tensor e = eg.energy.to(torch::kCPU, torch::kFloat64).contiguous();
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
    return {u.to(options_), gz.to(options_)};
  }
  torch::Tensor zl = z.detach().to(torch::kCPU, torch::kFloat64).requires_grad_(true);
  TransportPass fwd = flow_->forward(zl);
  EnergyGrad eg = inner_->energy_and_grad(fwd.out.detach().to(inner_->options()), false);
  torch::Tensor g = eg.grad.to(torch::kCPU, torch::kFloat64);
  // A failed row (NaN) stays NaN; the kernels reject it.
  torch::Tensor s = (fwd.out * g.nan_to_num(0.0, 0.0, 0.0)).sum() - fwd.log_det.sum();
  torch::Tensor gz = torch::autograd::grad({s}, {zl})[0];
  torch::Tensor bad = ~(torch::isfinite(g).all(1));
  gz = gz.masked_fill(bad.unsqueeze(1), std::numeric_limits<double>::quiet_NaN());
  torch::Tensor u = eg.energy.to(torch::kCPU, torch::kFloat64) - fwd.log_det.detach();
  return {u.to(options_), gz.to(options_)};
}

}  // namespace nmcmc
