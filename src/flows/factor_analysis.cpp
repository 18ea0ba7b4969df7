// The low-rank part of the preconditioner: a factor-analysis fit (Note [Affine preconditioner]).
#include "nmcmc/flows/learned.hpp"

#include <cmath>
#include <functional>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/deferred_linear.hpp"

namespace nmcmc {

namespace {

/// The factor-analysis fit shared by draws and covariances. `apply_s(M)` is S M for the [D, D]
/// (sample) covariance S, `v` its diagonal, (w, q) the top-k eigenpairs of its correlation matrix
/// (descending), `n` the number of draws (0: S is exact). The maximum-likelihood fixed point (as
/// scikit-learn's FactorAnalysis): whiten by psi, take the top-k eigenpairs (Lambda, Q) of
/// C = psi^-1/2 S psi^-1/2 (one warm-started subspace step each time), keep those above the noise
/// edge (1 + sqrt(D / n))^2, and set psi = diag(S - W W^T) with W = psi^1/2 Q (Lambda - 1)^1/2.
LowRankFactors fit_factors(const std::function<torch::Tensor(const torch::Tensor&)>& apply_s, const torch::Tensor& v,
                           torch::Tensor w, torch::Tensor q, int64_t n) {
  const int64_t d = v.size(0), k = q.size(1);
  const double edge = n > 0 ? std::pow(1.0 + std::sqrt(static_cast<double>(d) / static_cast<double>(n)), 2) : 1.0;
  torch::Tensor psi = v.clone();
  auto whitened = [&](const torch::Tensor& m) {  // C m
    torch::Tensor root = psi.rsqrt().unsqueeze(1);
    return apply_s(m * root) * root;
  };
  torch::Tensor keep = torch::zeros({k}, torch::kBool);
  for (int it = 0; it < 1000 && k > 0; ++it) {
    if (it > 0) {  // one subspace step, then Rayleigh-Ritz
      q = std::get<0>(torch::linalg_qr(whitened(q)));
      auto [bw, bv] = torch::linalg_eigh(q.t().matmul(whitened(q)));
      w = bw.flip(0);
      q = q.matmul(bv.flip(1));
    }
    keep = w > edge;
    torch::Tensor excess = torch::where(keep, w - 1.0, torch::zeros_like(w));
    torch::Tensor next = torch::maximum(v - psi * q.pow(2).matmul(excess), 1e-3 * v);
    const double change = (next.log() - psi.log()).abs().max().item<double>();
    psi = next;
    if (change < 1e-11) break;
  }
  torch::Tensor idx = keep.nonzero().squeeze(1);
  LowRankFactors f;
  f.variances = psi;
  f.directions = q.index_select(1, idx).contiguous();
  torch::Tensor lam = w.index_select(0, idx);
  if (n > 0) lam = (static_cast<double>(n) * lam + 5.0) / (static_cast<double>(n) + 5.0);  // towards 1, as Stan
  f.eigenvalues = lam;
  return f;
}

LowRankFactors fit_draws(const torch::Tensor& x, int64_t k) {
  const int64_t n = x.size(0), d = x.size(1);
  k = std::max<int64_t>(0, std::min({k, d - 1, n - 1}));
  const double nn = static_cast<double>(n);
  torch::Tensor a = (x - x.mean(0)) / std::sqrt(nn - 1.0);  // a^T a = S
  // Stan's regularisation of a metric: S = (n S_draws + 5e-3 I) / (n + 5).
  const double keep = nn / (nn + 5.0), ridge = 5e-3 / (nn + 5.0);
  torch::Tensor v = keep * a.pow(2).sum(0) + ridge;
  torch::Tensor z = a * std::sqrt(keep) / v.sqrt();         // z^T z = correlation of S, less its ridge
  torch::Tensor w, q;
  if (n < d) {
    auto [gw, gv] = torch::linalg_eigh(z.matmul(z.t()));  // ascending
    w = gw.narrow(0, n - k, k).flip(0).clamp_min(1e-12);
    q = z.t().matmul(gv.narrow(1, n - k, k).flip(1)) / w.sqrt();
  } else {
    auto [cw, cv] = torch::linalg_eigh(z.t().matmul(z));
    w = cw.narrow(0, d - k, k).flip(0).clamp_min(1e-12);
    q = cv.narrow(1, d - k, k).flip(1);
  }
  return fit_factors([&](const torch::Tensor& m) { return keep * a.t().matmul(a.matmul(m)) + ridge * m; }, v, w, q, n);
}

/// How many of `f`'s factors the held-out draws `x` confirm: whitened by f's psi, the variance of x
/// along the factor at least kConfirm times the mean variance of the directions orthogonal to all
/// of f's factors (psi itself is biased when noise factors take a share of the variances).
constexpr double kConfirm = 1.5;
int64_t confirmed(const LowRankFactors& f, const torch::Tensor& x) {
  const int64_t kf = f.directions.size(1), d = x.size(1);
  if (kf == 0 || x.size(0) < 2) return 0;
  torch::Tensor z = (x - x.mean(0)) / f.variances.sqrt();
  torch::Tensor along = z.matmul(f.directions).pow(2).sum(0) / static_cast<double>(x.size(0) - 1);  // [k']
  const double total = z.pow(2).sum().item<double>() / static_cast<double>(x.size(0) - 1);
  const double rest = (total - along.sum().item<double>()) / static_cast<double>(d - kf);
  return (along >= kConfirm * rest).sum().item<int64_t>();
}
}  // namespace

LowRankFactors low_rank_factors(const torch::Tensor& draws, int64_t k, int64_t chains) {
  torch::NoGradGuard no_grad;
  torch::Tensor x = draws.to(torch::kCPU, torch::kFloat64);
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 2 && x.size(1) >= 2, "low_rank_factors: need draws [n >= 2, D >= 2]");
  TORCH_CHECK(chains >= 1 && x.size(0) % chains == 0, "low_rank_factors: ", x.size(0), " rows are not draws of ", chains, " chains");
  if (chains >= 2 && x.size(0) / chains >= 2) {
    // Cross-fitting: factors fitted on one half of the chains and confirmed on the other. MCMC
    // draws are autocorrelated, so the noise edge (computed for independent draws) lets sample
    // noise through; a noise direction of one half is an ordinary direction in the other.
    torch::Tensor chain = torch::arange(x.size(0)) % chains;
    torch::Tensor first = (chain < chains / 2).nonzero().squeeze(1), second = (chain >= chains / 2).nonzero().squeeze(1);
    torch::Tensor xa = x.index_select(0, first), xb = x.index_select(0, second);
    k = std::min(confirmed(fit_draws(xa, k), xb), confirmed(fit_draws(xb, k), xa));
  }
  return fit_draws(x, k);
}

LowRankFactors low_rank_factors_of_covariance(const torch::Tensor& covariance, int64_t k) {
  torch::NoGradGuard no_grad;
  torch::Tensor c = covariance.to(torch::kCPU, torch::kFloat64);
  TORCH_CHECK(c.dim() == 2 && c.size(0) == c.size(1) && c.size(0) >= 2, "low_rank_factors_of_covariance: need [D, D]");
  const int64_t d = c.size(0);
  k = std::max<int64_t>(0, std::min(k, d - 1));
  c = 0.5 * (c + c.t());
  torch::Tensor v = c.diagonal().clone();
  torch::Tensor sd = v.sqrt();
  auto [cw, cv] = torch::linalg_eigh(c / sd.unsqueeze(0) / sd.unsqueeze(1));  // ascending
  torch::Tensor w = cw.narrow(0, d - k, k).flip(0), q = cv.narrow(1, d - k, k).flip(1);
  return fit_factors([&](const torch::Tensor& m) { return c.matmul(m); }, v, w, q, 0);
}

nlohmann::json LearnedOptions::to_json() const { return nlohmann::json(*this); }

}  // namespace nmcmc
