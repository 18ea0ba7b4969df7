// The flow transport's pass and its adjoint in plain loops (Note [The flow's native pass]).
#include "nmcmc/flows/native_flow.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nmcmc/core/fast_exp.hpp"
#include "nmcmc/core/target_clones.hpp"

namespace nmcmc {

namespace {

/// sig = sigmoid(pre), act = pre sig (silu); NaN passes through.
NMCMC_CLONES void silu_loop(const double* __restrict pre, double* __restrict sig, double* __restrict act, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double p = pre[i];
    const double sg = 1.0 / (1.0 + exp_core(clamp700(-p)));
    sig[i] = p != p ? p : sg;
    act[i] = p * sig[i];
  }
}

/// The coupling's scale: th = tanh(o / a) in place of o, e = exp(a th) (the caller sums the
/// log-scales a th). tanh(u) = sign(u) (1 - 2 / (exp(2|u|) + 1)) (absolute error ~1e-16).
NMCMC_CLONES void scale_loop(double* __restrict o, double* __restrict e, double a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double u = o[i] / a;
    const double au = u < 0 ? -u : u;
    const double t = 1.0 - 2.0 / (exp_core(2.0 * (au < 20.0 ? au : 20.0)) + 1.0);
    const double th = u != u ? u : (u < 0 ? -t : t);
    o[i] = th;
    e[i] = th != th ? th : exp_core(clamp700(a * th));
  }
}

/// out[c, :] += sum_j in[c, j] * w[j, :] for the rows c < n: w by input column [m, h], in [n, m],
/// out [n, h]. Each column of w is read once for all rows; the inner loop is a vector update,
/// compiled for AVX-512, AVX2 + FMA and the baseline, chosen at run time (the build targets the
/// baseline x86-64).
NMCMC_CLONES void accumulate_columns(const double* __restrict w, int64_t m, int64_t h, int64_t n,
                                     const double* __restrict in, double* __restrict out) {
  for (int64_t j = 0; j < m; ++j) {
    const double* wj = w + j * h;
    for (int64_t c = 0; c < n; ++c) {
      const double v = in[c * m + j];
      if (v == 0.0) continue;
      double* o = out + c * h;
      for (int64_t i = 0; i < h; ++i) o[i] += v * wj[i];
    }
  }
}
}  // namespace

void NativeFlowPass::forward(const double* z, int64_t n, double* x, double* log_det, Tape* tape) const {
  const int64_t d = dim, h = hidden;
  std::vector<double> y(z, z + n * d);
  std::fill(log_det, log_det + n, 0.0);
  std::vector<double> pre1(n * h), pre2(n * h), sig1(n * h), sig2(n * h), act(n * h), os, ot, es, yc;
  if (tape) {
    tape->rows = n;
    const size_t k = layers.size();
    for (auto* v : {&tape->y, &tape->pre1, &tape->pre2, &tape->sig1, &tape->sig2, &tape->th, &tape->es}) v->resize(k);
  }
  for (size_t k = 0; k < layers.size(); ++k) {
    const Layer& l = layers[k];
    const int64_t nc = static_cast<int64_t>(l.cond.size()), nf = static_cast<int64_t>(l.free.size());
    if (tape) tape->y[k] = y;
    for (int64_t c = 0; c < n; ++c) std::copy(l.b1.begin(), l.b1.end(), pre1.begin() + c * h);
    yc.resize(n * nc);
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t j = 0; j < nc; ++j) yc[c * nc + j] = y[c * d + l.cond[j]];
    }
    accumulate_columns(l.w1_cols.data(), nc, h, n, yc.data(), pre1.data());
    silu_loop(pre1.data(), sig1.data(), act.data(), n * h);
    for (int64_t c = 0; c < n; ++c) std::copy(l.b2.begin(), l.b2.end(), pre2.begin() + c * h);
    accumulate_columns(l.w2_cols.data(), h, h, n, act.data(), pre2.data());
    silu_loop(pre2.data(), sig2.data(), act.data(), n * h);
    os.assign(n * nf, 0.0);
    ot.assign(n * nf, 0.0);
    for (int64_t c = 0; c < n; ++c) {
      std::copy(l.b3s.begin(), l.b3s.end(), os.begin() + c * nf);
      std::copy(l.b3t.begin(), l.b3t.end(), ot.begin() + c * nf);
    }
    accumulate_columns(l.w3s_cols.data(), h, nf, n, act.data(), os.data());
    accumulate_columns(l.w3t_cols.data(), h, nf, n, act.data(), ot.data());
    // os becomes tanh(o_s / a); es = exp(s), s = a tanh(o_s / a)
    es.resize(n * nf);
    scale_loop(os.data(), es.data(), max_log_scale, n * nf);
    for (int64_t c = 0; c < n; ++c) {
      double sum = 0;
      for (int64_t f = 0; f < nf; ++f) {
        double& yf = y[c * d + l.free[f]];
        yf = yf * es[c * nf + f] + ot[c * nf + f];
        sum += max_log_scale * os[c * nf + f];
      }
      log_det[c] += sum;
    }
    if (tape) {
      tape->pre1[k] = pre1;
      tape->pre2[k] = pre2;
      tape->sig1[k] = sig1;
      tape->sig2[k] = sig2;
      tape->th[k] = os;
      tape->es[k] = es;
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    const double* yc = y.data() + c * d;
    double* xc = x + c * d;
    if (dense) {
      for (int64_t j = 0; j < d; ++j) {
        const double* lj = lower.data() + j * d;
        double acc = 0;
        for (int64_t i = 0; i <= j; ++i) acc += lj[i] * yc[i];
        xc[j] = shift[j] + acc;
      }
    } else {
      for (int64_t j = 0; j < d; ++j) xc[j] = shift[j] + yc[j] * scale[j];
    }
    log_det[c] += base_log_det;
  }
}

void NativeFlowPass::pull_back(const Tape& tape, const double* g, double* gz) const {
  const int64_t d = dim, h = hidden, n = tape.rows;
  // ybar = g L (x = mu + y L^T), or g exp(s)
  std::vector<double> ybar(n * d, 0.0);
  for (int64_t c = 0; c < n; ++c) {
    const double* gc = g + c * d;
    double* bc = ybar.data() + c * d;
    if (dense) {
      for (int64_t j = 0; j < d; ++j) {
        const double gj = gc[j];
        const double* lj = lower.data() + j * d;
        for (int64_t i = 0; i <= j; ++i) bc[i] += gj * lj[i];
      }
    } else {
      for (int64_t j = 0; j < d; ++j) bc[j] = gc[j] * scale[j];
    }
  }
  std::vector<double> obar_s, obar_t, bar(n * h), bar2(n * h), ycbar;
  for (int64_t k = static_cast<int64_t>(layers.size()) - 1; k >= 0; --k) {
    const Layer& l = layers[k];
    const int64_t nc = static_cast<int64_t>(l.cond.size()), nf = static_cast<int64_t>(l.free.size());
    const std::vector<double>& y_in = tape.y[k];
    const std::vector<double>& th = tape.th[k];
    const std::vector<double>& es = tape.es[k];
    obar_s.assign(n * nf, 0.0);
    obar_t.assign(n * nf, 0.0);
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t f = 0; f < nf; ++f) {
        const int64_t at = c * d + l.free[f];
        const double e = es[c * nf + f], t = th[c * nf + f];
        const double yb = ybar[at];
        const double sbar = yb * y_in[at] * e - 1.0;  // d/ds of y e^s . ybar - s
        obar_s[c * nf + f] = sbar * (1.0 - t * t);      // s = a tanh(o / a)
        obar_t[c * nf + f] = yb;
        ybar[at] = yb * e;
      }
    }
    // bar = (W3_s^T obar_s + W3_t^T obar_t) * silu'(pre2)
    std::fill(bar.begin(), bar.end(), 0.0);
    accumulate_columns(l.w3s_rows.data(), nf, h, n, obar_s.data(), bar.data());
    accumulate_columns(l.w3t_rows.data(), nf, h, n, obar_t.data(), bar.data());
    const std::vector<double>& pre2 = tape.pre2[k];
    const std::vector<double>& sig2 = tape.sig2[k];
    for (int64_t i = 0; i < n * h; ++i) bar[i] *= sig2[i] * (1.0 + pre2[i] * (1.0 - sig2[i]));
    // bar2 = (W2^T bar) * silu'(pre1)
    std::fill(bar2.begin(), bar2.end(), 0.0);
    accumulate_columns(l.w2_rows.data(), h, h, n, bar.data(), bar2.data());
    const std::vector<double>& pre1 = tape.pre1[k];
    const std::vector<double>& sig1 = tape.sig1[k];
    for (int64_t i = 0; i < n * h; ++i) bar2[i] *= sig1[i] * (1.0 + pre1[i] * (1.0 - sig1[i]));
    // the conditioning half: W1^T bar2
    ycbar.assign(n * nc, 0.0);
    accumulate_columns(l.w1_rows.data(), h, nc, n, bar2.data(), ycbar.data());
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t j = 0; j < nc; ++j) ybar[c * d + l.cond[j]] += ycbar[c * nc + j];
    }
  }
  std::copy(ybar.begin(), ybar.end(), gz);
}

}  // namespace nmcmc
