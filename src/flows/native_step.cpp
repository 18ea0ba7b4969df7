// The learned proposal's sampling step in plain loops (Note [The learned step's native pass]).
#include "nmcmc/flows/native_step.hpp"

#include <algorithm>
#include <cmath>

#include "nmcmc/core/fast_exp.hpp"
#include "nmcmc/core/target.hpp"
#include "nmcmc/core/target_clones.hpp"

namespace nmcmc {

namespace {

/// out [n_out] = b + in [n_in] W, W [n_in, n_out] row-major: running sums over W's rows.
NMCMC_CLONES void layer_row(const double* __restrict in, int64_t n_in, const double* __restrict w,
                            const double* __restrict b, int64_t n_out, double* __restrict out) {
  for (int64_t j = 0; j < n_out; ++j) out[j] = b[j];
  for (int64_t i = 0; i < n_in; ++i) {
    const double a = in[i];
    const double* __restrict row = w + i * n_out;
    for (int64_t j = 0; j < n_out; ++j) out[j] += a * row[j];
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

/// A [C, D] tensor as contiguous float64 rows.
std::vector<double> rows_of(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

/// Rows as a [rows, cols] tensor of its own (copy = true: a float64 result must not alias v).
torch::Tensor tensor_of(const std::vector<double>& v, int64_t rows, int64_t cols, const torch::TensorOptions& options) {
  return torch::from_blob(const_cast<double*>(v.data()), {rows, cols}, torch::kFloat64).to(options, false, true);
}
}  // namespace

void NativeStepNet::forward(int64_t k, const double* input, double* output, double* h1, double* h2) const {
  const size_t shared = w_shared.size();
  layer_row(input, in, w_in[k].data(), b_in[k].data(), hidden, h1);
  activate_row(h1, hidden, shared == 0 && tanh_last ? Activation::kTanh : activation);
  for (size_t i = 0; i < shared; ++i) {
    layer_row(h1, hidden, w_shared[i].data(), b_shared[i].data(), hidden, h2);
    activate_row(h2, hidden, i + 1 == shared && tanh_last ? Activation::kTanh : activation);
    std::swap(h1, h2);
  }
  layer_row(h1, hidden, w_out[k].data(), b_out[k].data(), out, output);
}

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
    case Kind::kLowRank: {  // u = (x - m) / scale; y = u + ((u Q) (exp(-t) - 1)) Q^T
      for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m[i]) / scale[i];
      std::fill(tmp, tmp + rank, 0.0);
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < rank; ++j) tmp[j] += y[i] * q[i * rank + j];
      }
      for (int64_t j = 0; j < rank; ++j) tmp[j] *= em1_nt[j];
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j) s += q[i * rank + j] * tmp[j];
        y[i] += s;
      }
      return;
    }
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
    case Kind::kLowRank: {  // x = m + (y + ((y Q) (exp(t) - 1)) Q^T) scale
      std::fill(tmp, tmp + rank, 0.0);
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < rank; ++j) tmp[j] += y[i] * q[i * rank + j];
      }
      for (int64_t j = 0; j < rank; ++j) tmp[j] *= em1_t[j];
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j) s += q[i * rank + j] * tmp[j];
        x[i] = m[i] + (y[i] + s) * scale[i];
      }
      return;
    }
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
    case Kind::kLowRank: {  // v = g scale; gy = v + ((v Q) (exp(t) - 1)) Q^T
      for (int64_t i = 0; i < d; ++i) gy[i] = g[i] * scale[i];
      std::fill(tmp, tmp + rank, 0.0);
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < rank; ++j) tmp[j] += gy[i] * q[i * rank + j];
      }
      for (int64_t j = 0; j < rank; ++j) tmp[j] *= em1_t[j];
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j) s += q[i * rank + j] * tmp[j];
        gy[i] += s;
      }
      return;
    }
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
  const std::vector<double> xs = rows_of(x), zs = rows_of(z0);
  const std::vector<double> gs = langevin ? rows_of(grad) : std::vector<double>();
  const int64_t width = std::max<int64_t>({sqt.hidden, drift.hidden, 1});
  const int64_t scratch = std::max<int64_t>({d, affine.rank, 1});
  std::vector<double> y(c * d), z(c * d), y_new(c * d), x_new(c * d), input(sqt.in), out(std::max(sqt.out, drift.out));
  std::vector<double> h1(width), h2(width), tmp(scratch), gy(d), log_det_f(c, 0.0), log_det_r(c, 0.0);
  // The coupling sub-steps of Note [Learned proposal] on one row, at y (the networks' x) and z in place.
  auto coupling = [&](int64_t k, const double* yr, double* zr, double& log_det, bool inverse) {
    std::copy(yr, yr + d, input.begin());
    const std::vector<int64_t>& cd = cond[k];
    for (int64_t j = 0; j < half_max; ++j) input[d + j] = j < static_cast<int64_t>(cd.size()) ? zr[cd[j]] : 0.0;
    sqt.forward(k, input.data(), out.data(), h1.data(), h2.data());
    const std::vector<int64_t>& up = upd[k];
    for (size_t j = 0; j < up.size(); ++j) {
      const double s = out[j], t = out[half_max + j];
      double& zu = zr[up[j]];
      zu = inverse ? (zu + eps_sub * t) * std::exp(-s) : zu * std::exp(s) - eps_sub * t;
      log_det += s;
    }
  };
  // mu(y) = -(eps^2 / 2) gy exp(S_d(y)) + T_d(y), added to dst.
  auto add_drift = [&](const double* yr, const double* gyr, double* dst, double sign) {
    drift.forward(0, yr, out.data(), h1.data(), h2.data());
    for (int64_t i = 0; i < d; ++i) dst[i] += sign * (-0.5 * eps * eps * gyr[i] * std::exp(out[i]) + out[d + i]);
  };
  for (int64_t r = 0; r < c; ++r) {
    double* yr = y.data() + r * d;
    double* zr = z.data() + r * d;
    affine.to_latent(xs.data() + r * d, yr, tmp.data());
    std::copy(zs.begin() + r * d, zs.begin() + (r + 1) * d, zr);
    for (int64_t k = 0; k < substeps; ++k) coupling(k, yr, zr, log_det_f[r], false);
    double* yn = y_new.data() + r * d;
    for (int64_t i = 0; i < d; ++i) yn[i] = yr[i] + eps * zr[i];
    if (langevin) {
      affine.latent_grad(gs.data() + r * d, gy.data(), tmp.data());
      add_drift(yr, gy.data(), yn, 1.0);
    }
    affine.from_latent(yn, x_new.data() + r * d, tmp.data());
  }
  Proposed p;
  p.x_new = tensor_of(x_new, c, d, x.options());
  std::vector<double> g_new;
  if (langevin) {
    EnergyGrad eg = target.energy_and_grad(p.x_new);
    p.energy_new = eg.energy;
    p.grad_new = eg.grad;
    g_new = rows_of(eg.grad);
  } else {
    p.energy_new = target.energy(p.x_new);
  }
  torch::Tensor log_q_fwd = torch::empty({c}, torch::kFloat64), log_q_rev = torch::empty({c}, torch::kFloat64);
  torch::Tensor det_f = torch::empty({c}, torch::kFloat64), det_r = torch::empty({c}, torch::kFloat64);
  double* qf = log_q_fwd.data_ptr<double>();
  double* qr = log_q_rev.data_ptr<double>();
  double* df = det_f.data_ptr<double>();
  double* dr = det_r.data_ptr<double>();
  for (int64_t r = 0; r < c; ++r) {
    const double* yr = y.data() + r * d;
    const double* yn = y_new.data() + r * d;
    double* zr = z.data() + r * d;  // becomes the reverse pass's z
    if (langevin) {                 // z_rev = (y - y' - mu(y')) / eps
      affine.latent_grad(g_new.data() + r * d, gy.data(), tmp.data());
      for (int64_t i = 0; i < d; ++i) zr[i] = yr[i] - yn[i];
      add_drift(yn, gy.data(), zr, -1.0);
      for (int64_t i = 0; i < d; ++i) zr[i] /= eps;
    } else {
      for (int64_t i = 0; i < d; ++i) zr[i] = -zr[i];
    }
    for (int64_t k = substeps - 1; k >= 0; --k) coupling(k, yn, zr, log_det_r[r], true);
    double n0 = 0, n1 = 0;
    for (int64_t i = 0; i < d; ++i) {
      n0 += zs[r * d + i] * zs[r * d + i];
      n1 += zr[i] * zr[i];
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
  return p;
}

}  // namespace nmcmc
