#include "stats.hpp"

#include <cstdlib>

#include "nmcmc/core/tensor_options.hpp"

#include "nmcmc/targets/targets.hpp"

#include <functional>

#include <cmath>
#include <sstream>

#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"

namespace nmcmc::test_support {

namespace {
// One intra-op thread: fastest on this project's 2-vCPU machines (see BENCHMARKS.md) and the
// same arithmetic on every run.
const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();
}  // namespace

double ks_uniform_pvalue(const torch::Tensor& u_in) {
  torch::Tensor u = std::get<0>(torch::sort(u_in.to(torch::kFloat64).reshape({-1})));
  const int64_t n = u.numel();
  torch::Tensor i = torch::arange(1, n + 1, torch::kFloat64);
  const double d_plus = (i / n - u).max().item<double>();
  const double d_minus = (u - (i - 1) / n).max().item<double>();
  const double d = std::max(d_plus, d_minus);
  const double sn = std::sqrt(static_cast<double>(n));
  const double lambda = (sn + 0.12 + 0.11 / sn) * d;  // Stephens' small-sample correction
  if (lambda < 0.2) return 1.0;
  double sum = 0.0;
  for (int k = 1; k <= 200; ++k) {
    const double term = std::exp(-2.0 * k * k * lambda * lambda);
    sum += (k % 2 ? 2.0 : -2.0) * term;
    if (term < 1e-300) break;
  }
  return std::min(1.0, std::max(0.0, sum));
}

std::string InvarianceReport::describe() const {
  std::ostringstream s;
  s << "min p = " << min_p << " (" << worst << ") over " << n_tests << " sub-tests; threshold "
    << kFamilyAlpha / n_tests << "; accept " << accept << ", chains moved " << moved;
  return s.str();
}

InvarianceReport normal_tests(const torch::Tensor& z_in, int projections, uint64_t seed) {
  torch::Tensor z = z_in.to(torch::kFloat64);
  const int64_t d = z.size(1);
  InvarianceReport r;
  auto consider = [&](double p, const std::string& what) {
    ++r.n_tests;
    if (p < r.min_p || r.worst.empty()) {
      r.min_p = std::min(p, r.min_p);
      if (p <= r.min_p) r.worst = what;
    }
  };
  for (int64_t j = 0; j < d; ++j) {
    consider(ks_uniform_pvalue(torch::special::ndtr(z.select(1, j))), "coordinate " + std::to_string(j));
  }
  at::Generator gen = make_generator(seed);
  torch::Tensor dirs = torch::randn({d, projections}, gen, torch::kFloat64);
  dirs = dirs / dirs.norm(2, 0, true);
  torch::Tensor proj = torch::matmul(z, dirs);  // [N, P]
  for (int k = 0; k < projections; ++k) {
    consider(ks_uniform_pvalue(torch::special::ndtr(proj.select(1, k))), "projection " + std::to_string(k));
  }
  // |z|^2 ~ chi-square(D): CDF = P(D/2, x/2), the regularised lower incomplete gamma.
  torch::Tensor sq = (z * z).sum(1);
  torch::Tensor cdf = torch::igamma(torch::full_like(sq, 0.5 * d), 0.5 * sq);
  consider(ks_uniform_pvalue(cdf), "|z|^2");
  return r;
}

torch::Tensor run_from_exact(Target& target, std::shared_ptr<Proposal> proposal, int64_t n, int64_t k,
                             uint64_t seed) {
  MetropolisHastings kernel(std::move(proposal));
  return run_from_exact(target, kernel, n, k, seed);
}

torch::Tensor run_from_exact(Target& target, Kernel& kernel, int64_t n, int64_t k, uint64_t seed) {
  return run_from_exact_with_moves(target, kernel, n, k, seed).x;
}

torch::TensorOptions device_options(torch::Dtype dtype) {
  const char* device = std::getenv("NMCMC_TEST_DEVICE");
  return parse_tensor_options(dtype == torch::kFloat64 ? "float64" : "float32", device ? device : "cpu");
}

ExactRun run_from_exact_with_moves(Target& target, Kernel& kernel, int64_t n, int64_t k, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = make_generator(seed, target.options().device());
  ChainState s = kernel.init(target, target.sample(n, gen));
  const torch::Tensor x0 = s.x.clone();
  double accept = 0;
  for (int64_t i = 0; i < k; ++i) {
    auto [next, info] = kernel.step(target, s, gen);
    accept += info.accept_prob.to(torch::kFloat64).mean().item<double>();
    s = next;
  }
  ExactRun r;
  r.x = s.x;
  r.accept = k > 0 ? accept / static_cast<double>(k) : 0.0;
  r.moved = (s.x != x0).any(1).to(torch::kFloat64).mean().item<double>();
  return r;
}

torch::Tensor whiten_known(const nlohmann::json& spec, Target& target, const torch::Tensor& x) {
  if (spec["name"] == "funnel") return whiten_funnel(x, spec["sigma"].get<double>());
  auto* g = dynamic_cast<GaussianTarget*>(&target);
  TORCH_CHECK(g, "whiten_known: a Gaussian or funnel target");
  return whiten_gaussian(x, g->reference_moments()->mean, g->covariance());
}

torch::Tensor whiten_gaussian(const torch::Tensor& x, const torch::Tensor& mean, const torch::Tensor& cov) {
  torch::Tensor l = torch::linalg_cholesky(cov.to(torch::kFloat64));
  torch::Tensor centred = (x.to(torch::kFloat64) - mean.to(torch::kFloat64)).t();  // [D, N]
  return torch::linalg_solve_triangular(l, centred, /*upper=*/false, /*left=*/true, /*unitriangular=*/false).t();
}

torch::Tensor whiten_funnel(const torch::Tensor& x_in, double sigma) {
  torch::Tensor x = x_in.to(torch::kFloat64);
  torch::Tensor x0 = x.narrow(1, 0, 1);
  return torch::cat({x0 / sigma, x.narrow(1, 1, x.size(1) - 1) * torch::exp(0.5 * x0)}, 1);
}

namespace {
/// Adds N(0, (scale / sqrt(fan(p)))^2) to every parameter but the scalar log eps.
void perturb(torch::nn::Module& m, uint64_t seed, double scale, const std::function<double(const torch::Tensor&)>& fan) {
  at::Generator gen = make_generator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    if (p.dim() == 0) continue;  // log eps
    p.add_(torch::randn(p.sizes(), gen, torch::kFloat64) * scale / std::sqrt(fan(p)));
  }
}
}  // namespace

LearnedSampler perturbed_sampler(const LearnedOptions& options, uint64_t seed, double scale) {
  LearnedSampler s(options);
  s->to(torch::kFloat64);
  perturb(*s, seed, scale, [](const torch::Tensor& p) { return static_cast<double>(p.size(-1)); });
  return s;
}

ConvSampler perturbed_conv_sampler(const ConvSamplerOptions& options, uint64_t seed, double scale) {
  ConvSampler s(options);
  s->to(torch::kFloat64);
  perturb(*s, seed, scale, [](const torch::Tensor& p) {
    return p.dim() > 1 ? static_cast<double>(p[0].numel()) : static_cast<double>(p.size(0));
  });
  return s;
}

torch::Tensor finite_difference_grad(Target& target, const torch::Tensor& x, double h) {
  torch::NoGradGuard no_grad;
  torch::Tensor g = torch::zeros_like(x);
  for (int64_t j = 0; j < x.size(1); ++j) {
    torch::Tensor e = torch::zeros_like(x);
    e.select(1, j).fill_(h);
    g.select(1, j).copy_((target.energy(x + e) - target.energy(x - e)) / (2 * h));
  }
  return g;
}

std::string moments_within(const torch::Tensor& draws, const torch::Tensor& mean, const torch::Tensor& sd, double z) {
  const StanSummary s = stan_summary(draws.detach().to(torch::kCPU, torch::kFloat64).contiguous());
  const torch::Tensor m = mean.to(torch::kFloat64).cpu(), v = sd.to(torch::kFloat64).cpu();
  std::ostringstream why;
  for (int64_t k = 0; k < draws.size(2); ++k) {
    const double zm = std::abs(s.mean[k].item<double>() - m[k].item<double>()) / s.mcse_mean[k].item<double>();
    const double zs = std::abs(s.sd[k].item<double>() - v[k].item<double>()) / s.mcse_sd[k].item<double>();
    if (!(zm <= z)) why << " x" << k << " mean " << s.mean[k].item<double>() << " vs " << m[k].item<double>() << " (" << zm << " MCSE);";
    if (!(zs <= z)) why << " x" << k << " sd " << s.sd[k].item<double>() << " vs " << v[k].item<double>() << " (" << zs << " MCSE);";
  }
  return why.str();
}

}  // namespace nmcmc::test_support
