// The flow transport's fit: the Fisher divergence, its hand-written gradient and the fitting loop
// (Note [Flow transport], flows/transport.hpp). The passes fisher_terms differentiates (forward,
// inverse and the conditioners) are FlowTransportImpl's, in flows/transport.cpp: a change to one
// is a change to the other, and Transport.OwnFisherGradientEqualsAutograd holds them together.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/adaptation.hpp"

namespace nmcmc {
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
      const bool better = std::isfinite(h) && h < best;
      const bool gain = better && h <= best * (1.0 - o.min_gain);
      if (better) {
        best = h;
        best_flat.copy_(flat);
        if (best < o.tolerance) {
          report.stopped = "tolerance";
          ++step;
          break;
        }
      }
      if (gain) {
        since_best = 0;
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

}  // namespace nmcmc
