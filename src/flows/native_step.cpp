// The learned proposal's sampling step in plain loops (Note [The learned step's native pass]).
#include "nmcmc/flows/native_step.hpp"

#include <algorithm>
#include <cmath>

#include "nmcmc/core/fast_exp.hpp"
#include "nmcmc/core/target.hpp"
#include "nmcmc/core/target_clones.hpp"

namespace nmcmc {

namespace {

/// out [R, n_out] = b + in [R, n_in] W, W [n_in, n_out] row-major: W's row i is read once for all
/// R rows (it stays in L1 while each row's running sum takes it), so the weights stream from
/// memory once per layer and call, not once per row.
NMCMC_CLONES void layer_rows(const double* __restrict in, int64_t rows, int64_t n_in, const double* __restrict w,
                             const double* __restrict b, int64_t n_out, double* __restrict out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n_out; ++j) out[r * n_out + j] = b[j];
  }
  for (int64_t i = 0; i < n_in; ++i) {
    const double* __restrict wi = w + i * n_out;
    for (int64_t r = 0; r < rows; ++r) {
      const double a = in[r * n_in + i];
      double* __restrict o = out + r * n_out;
      for (int64_t j = 0; j < n_out; ++j) o[j] += a * wi[j];
    }
  }
}

/// elu, tanh, softplus (beta 1, threshold 20, as torch's) and silu in place; NaN passes through.
NMCMC_CLONES void elu_row(double* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = h[i];
    const double e = exp_core(x < -700.0 ? -700.0 : (x < 0.0 ? x : 0.0)) - 1.0;
    h[i] = x <= 0.0 ? e : x;
  }
}
NMCMC_CLONES void tanh_row(double* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = h[i];
    const double a = x < 0.0 ? -x : x;
    const double t = 1.0 - 2.0 / (exp_core(2.0 * (a < 20.0 ? a : 20.0)) + 1.0);
    h[i] = x != x ? x : (x < 0.0 ? -t : t);
  }
}
NMCMC_CLONES void softplus_row(double* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = h[i];
    h[i] = x > 20.0 || x != x ? x : std::log1p(exp_core(clamp700(x)));
  }
}
NMCMC_CLONES void silu_row(double* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = h[i];
    h[i] = x != x ? x : x / (1.0 + exp_core(clamp700(-x)));
  }
}

void activate_row(double* h, int64_t n, Activation a) {
  switch (a) {
    case Activation::kElu: return elu_row(h, n);
    case Activation::kTanh: return tanh_row(h, n);
    case Activation::kSoftplus: return softplus_row(h, n);
    case Activation::kSilu: return silu_row(h, n);
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) h[i] = h[i] < 0.0 ? 0.0 : h[i];  // NaN passes through
      return;
  }
}

/// Rows as a [rows, cols] tensor of its own (copy = true: a float64 result must not alias v).
torch::Tensor tensor_of(const std::vector<double>& v, int64_t rows, int64_t cols, const torch::TensorOptions& options) {
  return torch::from_blob(const_cast<double*>(v.data()), {rows, cols}, torch::kFloat64).to(options, false, true);
}
}  // namespace

std::vector<double> native_rows(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

void NativeStepNet::forward(int64_t k, const double* input, int64_t rows, double* output, double* h1, double* h2) const {
  const size_t shared = w_shared.size();
  layer_rows(input, rows, in, w_in[k].data(), b_in[k].data(), hidden, h1);
  activate_row(h1, rows * hidden, shared == 0 && tanh_last ? Activation::kTanh : activation);
  for (size_t i = 0; i < shared; ++i) {
    layer_rows(h1, rows, hidden, w_shared[i].data(), b_shared[i].data(), hidden, h2);
    activate_row(h2, rows * hidden, i + 1 == shared && tanh_last ? Activation::kTanh : activation);
    std::swap(h1, h2);
  }
  layer_rows(h1, rows, hidden, w_out[k].data(), b_out[k].data(), out, output);
}

namespace {
/// out = in + ((in Q) coef) Q^T for one row (the low-rank factor I + Q diag(coef) Q^T; in and out
/// may be the same row), Q [D, k] row-major; tmp: k doubles.
void low_rank_factor(const double* in, double* out, const std::vector<double>& q, const std::vector<double>& coef,
                     int64_t d, int64_t k, double* tmp) {
  std::fill(tmp, tmp + k, 0.0);
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < k; ++j) tmp[j] += in[i] * q[i * k + j];
  }
  for (int64_t j = 0; j < k; ++j) tmp[j] *= coef[j];
  for (int64_t i = 0; i < d; ++i) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += q[i * k + j] * tmp[j];
    out[i] = in[i] + s;
  }
}
}  // namespace

void NativeAffine::to_latent(const double* x, double* y, double* tmp) const {
  const int64_t d = dim;
  switch (kind) {
    case Kind::kNone:
      std::copy(x, x + d, y);
      return;
    case Kind::kDiag:
      for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m[i]) / scale[i];
      return;
    case Kind::kDense:  // forward substitution: L y = x - m
      for (int64_t i = 0; i < d; ++i) {
        double s = x[i] - m[i];
        const double* row = lower.data() + i * d;
        for (int64_t j = 0; j < i; ++j) s -= row[j] * y[j];
        y[i] = s / row[i];
      }
      return;
    case Kind::kLowRank:  // u = (x - m) / scale; y = u + ((u Q) (exp(-t) - 1)) Q^T
      for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m[i]) / scale[i];
      low_rank_factor(y, y, q, em1_nt, d, rank, tmp);
      return;
  }
}

void NativeAffine::from_latent(const double* y, double* x, double* tmp) const {
  const int64_t d = dim;
  switch (kind) {
    case Kind::kNone:
      std::copy(y, y + d, x);
      return;
    case Kind::kDiag:
      for (int64_t i = 0; i < d; ++i) x[i] = m[i] + y[i] * scale[i];
      return;
    case Kind::kDense:
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        const double* row = lower.data() + i * d;
        for (int64_t j = 0; j <= i; ++j) s += row[j] * y[j];
        x[i] = m[i] + s;
      }
      return;
    case Kind::kLowRank:  // x = m + (y + ((y Q) (exp(t) - 1)) Q^T) scale
      low_rank_factor(y, x, q, em1_t, d, rank, tmp);
      for (int64_t i = 0; i < d; ++i) x[i] = m[i] + x[i] * scale[i];
      return;
  }
}

void NativeAffine::latent_grad(const double* g, double* gy, double* tmp) const {
  const int64_t d = dim;
  switch (kind) {
    case Kind::kNone:
      std::copy(g, g + d, gy);
      return;
    case Kind::kDiag:
      for (int64_t i = 0; i < d; ++i) gy[i] = g[i] * scale[i];
      return;
    case Kind::kDense:  // gy_j = sum_{i >= j} L_ij g_i
      std::fill(gy, gy + d, 0.0);
      for (int64_t i = 0; i < d; ++i) {
        const double* row = lower.data() + i * d;
        for (int64_t j = 0; j <= i; ++j) gy[j] += row[j] * g[i];
      }
      return;
    case Kind::kLowRank:  // v = g scale; gy = v + ((v Q) (exp(t) - 1)) Q^T
      for (int64_t i = 0; i < d; ++i) gy[i] = g[i] * scale[i];
      low_rank_factor(gy, gy, q, em1_t, d, rank, tmp);
      return;
  }
}

Proposed NativeLearnedStep::propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad,
                                    const torch::Tensor& z0, double log_eps) const {
  const int64_t c = x.size(0), d = dim;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == d && z0.sizes() == x.sizes(), "native step: expected x and z0 [C, ", d,
              "], got ", x.sizes(), " and ", z0.sizes());
  TORCH_CHECK(!langevin || (grad.defined() && grad.sizes() == x.sizes()), "native step: the langevin variant needs dU(x) [C, ",
              d, "]");
  const double eps = std::exp(log_eps), eps_sub = eps / static_cast<double>(substeps);
  const double d_log_eps = static_cast<double>(d) * log_eps;
  const std::vector<double> xs = native_rows(x), zs = native_rows(z0);
  const std::vector<double> gs = langevin ? native_rows(grad) : std::vector<double>();
  const int64_t width = std::max<int64_t>({sqt.hidden, drift.hidden, 1});
  const int64_t scratch = std::max<int64_t>({d, affine.rank, 1});
  std::vector<double> y(c * d), z(c * d), y_new(c * d), x_new(c * d), gy(c * d), input(c * sqt.in);
  std::vector<double> out(c * std::max(sqt.out, drift.out)), h1(c * width), h2(c * width), tmp(scratch);
  std::vector<double> log_det_f(c, 0.0), log_det_r(c, 0.0);
  // The coupling sub-step k of Note [Learned proposal] on every row, at y (the networks' x), z in place.
  auto coupling = [&](int64_t k, const double* ys, double* zs_, std::vector<double>& log_det, bool inverse) {
    const std::vector<int64_t>& cd = cond[k];
    const int64_t nc = static_cast<int64_t>(cd.size());
    for (int64_t r = 0; r < c; ++r) {
      double* row = input.data() + r * sqt.in;
      std::copy(ys + r * d, ys + (r + 1) * d, row);
      for (int64_t j = 0; j < half_max; ++j) row[d + j] = j < nc ? zs_[r * d + cd[j]] : 0.0;
    }
    sqt.forward(k, input.data(), c, out.data(), h1.data(), h2.data());
    const std::vector<int64_t>& up = upd[k];
    for (int64_t r = 0; r < c; ++r) {
      const double* o = out.data() + r * sqt.out;
      for (size_t j = 0; j < up.size(); ++j) {
        const double sj = o[j], tj = o[half_max + j];
        double& zu = zs_[r * d + up[j]];
        zu = inverse ? (zu + eps_sub * tj) * std::exp(-sj) : zu * std::exp(sj) - eps_sub * tj;
        log_det[r] += sj;
      }
    }
  };
  // dst += sign mu(y), mu(y) = -(eps^2 / 2) gy exp(S_d(y)) + T_d(y), on every row.
  auto add_drift = [&](const double* ys, const double* gys, double* dst, double sign) {
    drift.forward(0, ys, c, out.data(), h1.data(), h2.data());
    for (int64_t r = 0; r < c; ++r) {
      const double* o = out.data() + r * drift.out;
      for (int64_t i = 0; i < d; ++i) {
        dst[r * d + i] += sign * (-0.5 * eps * eps * gys[r * d + i] * std::exp(o[i]) + o[d + i]);
      }
    }
  };
  for (int64_t r = 0; r < c; ++r) {
    affine.to_latent(xs.data() + r * d, y.data() + r * d, tmp.data());
    if (langevin) affine.latent_grad(gs.data() + r * d, gy.data() + r * d, tmp.data());
  }
  std::copy(zs.begin(), zs.end(), z.begin());
  for (int64_t k = 0; k < substeps; ++k) coupling(k, y.data(), z.data(), log_det_f, false);
  for (int64_t i = 0; i < c * d; ++i) y_new[i] = y[i] + eps * z[i];
  if (langevin) add_drift(y.data(), gy.data(), y_new.data(), 1.0);
  for (int64_t r = 0; r < c; ++r) affine.from_latent(y_new.data() + r * d, x_new.data() + r * d, tmp.data());
  Proposed p;
  p.x_new = tensor_of(x_new, c, d, x.options());
  std::vector<double> g_new;
  if (langevin) {
    EnergyGrad eg = target.energy_and_grad(p.x_new);
    p.energy_new = eg.energy;
    p.grad_new = eg.grad;
    g_new = native_rows(eg.grad);
  } else {
    p.energy_new = target.energy(p.x_new);
  }
  torch::Tensor log_q_fwd = torch::empty({c}, torch::kFloat64), log_q_rev = torch::empty({c}, torch::kFloat64);
  torch::Tensor det_f = torch::empty({c}, torch::kFloat64), det_r = torch::empty({c}, torch::kFloat64);
  double* qf = log_q_fwd.data_ptr<double>();
  double* qr = log_q_rev.data_ptr<double>();
  double* df = det_f.data_ptr<double>();
  double* dr = det_r.data_ptr<double>();
  // The reverse pass from y': z_rev = (y - y' - mu(y')) / eps (Langevin) or -z, then f^-1.
  if (langevin) {
    for (int64_t r = 0; r < c; ++r) affine.latent_grad(g_new.data() + r * d, gy.data() + r * d, tmp.data());
    for (int64_t i = 0; i < c * d; ++i) z[i] = y[i] - y_new[i];
    add_drift(y_new.data(), gy.data(), z.data(), -1.0);
    for (int64_t i = 0; i < c * d; ++i) z[i] /= eps;
  } else {
    for (int64_t i = 0; i < c * d; ++i) z[i] = -z[i];
  }
  for (int64_t k = substeps - 1; k >= 0; --k) coupling(k, y_new.data(), z.data(), log_det_r, true);
  for (int64_t r = 0; r < c; ++r) {
    double n0 = 0, n1 = 0;
    for (int64_t i = 0; i < d; ++i) {
      n0 += zs[r * d + i] * zs[r * d + i];
      n1 += z[r * d + i] * z[r * d + i];
    }
    // flow_log_density, less log|det L| (Note [Affine preconditioner])
    qf[r] = -0.5 * n0 - log_det_f[r] - d_log_eps - affine.log_det;
    qr[r] = -0.5 * n1 - log_det_r[r] - d_log_eps - affine.log_det;
    df[r] = log_det_f[r] + affine.log_det;
    dr[r] = log_det_r[r] + affine.log_det;
  }
  p.log_q_fwd = log_q_fwd;
  p.log_q_rev = log_q_rev;
  p.log_det = det_f;
  p.log_det_rev = det_r;
  p.z0_rev = tensor_of(z, c, d, z0.options());
  return p;
}

}  // namespace nmcmc
