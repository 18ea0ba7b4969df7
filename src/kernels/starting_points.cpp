// Where the chains start: the starting box, finite starting points, the screening of points no step
// size can move (Note [Starting points that cannot move]), and Stan's search for a first step size.
#include <fmt/format.h>

#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/run.hpp"
#include "starting_points.hpp"

namespace nmcmc {

torch::Tensor initial_positions(Target& target, const std::string& scheme, int64_t chains, at::Generator& gen) {
  const auto& opts = target.options();
  if (scheme == "uniform") return rand({chains, target.dim()}, gen, opts) * 4.0 - 2.0;
  if (scheme == "zero") return torch::zeros({chains, target.dim()}, opts);
  if (scheme == "exact") {
    if (!target.has_sampler()) throw UsageError("--init exact: target '" + target.name() + "' has no exact sampler");
    return target.sample(chains, gen);
  }
  throw UsageError("unknown --init '" + scheme + "' (uniform, exact, zero)");
}

torch::Tensor finite_starting_points(Target& target, torch::Tensor x0, const std::string& scheme, at::Generator& gen) {
  // Stan's rule: a random initial point whose log density or gradient is not finite is drawn
  // again, up to 100 times; a given point is never replaced.
  auto bad_rows = [&](const torch::Tensor& x) {
    EnergyGrad eg = target.energy_and_grad(x);
    return torch::logical_not(torch::isfinite(eg.energy) & torch::isfinite(eg.grad).all(1));
  };
  torch::Tensor bad = bad_rows(x0);
  const bool random = scheme == "uniform" || scheme == "exact";
  for (int attempt = 0; attempt < 100 && random && bad.any().item<bool>(); ++attempt) {
    torch::Tensor fresh = initial_positions(target, scheme, x0.size(0), gen);
    x0 = torch::where(bad.unsqueeze(1), fresh, x0);
    bad = bad_rows(x0);
  }
  if (bad.any().item<bool>()) {
    const int64_t chain = bad.nonzero()[0][0].item<int64_t>();
    const std::string raised = target.first_density_failure().empty()
                                   ? std::string()
                                   : " (the density raised: " + target.first_density_failure() + ")";
    throw UsageError(fmt::format(
        "the target's energy or gradient is not finite at the starting point of chain {}{}{}: give starting points "
        "inside the support (init_x, or --init zero|exact where they apply)",
        chain + 1, random ? " after 100 random draws (" + scheme + ")" : "", raised));
  }
  return x0;
}

// Note [Starting points that cannot move]
// A random starting point can be finite and still hopeless: posteriordb's ARMA(1,1) with its
// moving-average coefficient theta ~ uniform(-2, 2) and |theta| > 1 has errors growing like
// theta^200 over its recursion, an energy near 1e70 and a gradient to match; no step size a
// leapfrog can take there conserves the Hamiltonian, so every transition is rejected. Under the
// pooled adaptation (one step size for all chains) such chains also drag everyone's step size
// down: with 10 of 16 arma11 chains starting so, the initial step-size search ended at 1e-10
// (their accept rate 0 kept the mean below 0.5), dual averaging took it to 1e-23 within 30
// iterations, every tree ran to the depth limit, and the warm-up's estimated time was 1.5 hours.
// So before warm-up, random starting points (not given ones) are screened: each chain's accept
// statistic for one transition is taken at the step sizes 1, 0.1, ..., 1e-8 (nine batched
// gradient calls), and a chain that accepts with probability below 0.001 at all of them is
// drawn again (a finite point, as Stan's rule), up to 20 rounds; when every chain is stuck all of
// them are redrawn. A chain that is merely slow accepts at some step size of the ladder. The
// screening draws from a random stream of its own (where it redraws nothing, the run's draws are
// those of a run without it) and its gradients count as warm-up.
constexpr int kScreenRounds = 20;
constexpr double kStuckAccept = 1e-3;

torch::Tensor screen_starting_points(Target& target, Kernel& kernel, torch::Tensor x0, const std::string& scheme,
                                     at::Generator& gen, int64_t& redrawn) {
  if (!kernel.has_tunable_step_size()) return x0;
  const double eps_before = kernel.step_size();
  for (int round = 0; round < kScreenRounds; ++round) {
    ChainState state = kernel.init(target, x0);
    torch::Tensor best = torch::zeros({x0.size(0)}, torch::TensorOptions().dtype(torch::kFloat64));
    for (double eps = 1.0; eps > 1e-8 / 2; eps /= 10) {
      kernel.set_step_size(eps);
      torch::Tensor a = kernel.probe_accept(target, state, gen).detach().to(torch::kCPU, torch::kFloat64).reshape({-1});
      best = torch::maximum(best, torch::nan_to_num(a, 0.0));
      if ((best >= kStuckAccept).all().item<bool>()) break;
    }
    const torch::Tensor stuck = best < kStuckAccept;
    const int64_t n_stuck = stuck.sum().item<int64_t>();
    if (n_stuck == 0) break;
    redrawn += n_stuck;
    torch::Tensor fresh = finite_starting_points(target, initial_positions(target, scheme, x0.size(0), gen), scheme, gen);
    x0 = torch::where(stuck.to(x0.device()).unsqueeze(1), fresh, x0);
  }
  kernel.set_step_size(eps_before);
  return x0;
}

double find_reasonable_step_size(Target& target, Kernel& kernel, const ChainState& state, at::Generator& gen,
                                 double start) {
  Kernel& prop = kernel;
  double eps = start > 0 ? start : 1.0;
  auto mean_accept = [&](double e) {
    prop.set_step_size(e);
    return kernel.probe_accept(target, state, gen).mean().item<double>();
  };
  double a = mean_accept(eps);
  const int direction = a > 0.5 ? 1 : -1;
  for (int i = 0; i < 60; ++i) {
    const double next = direction > 0 ? eps * 2.0 : eps * 0.5;
    const double an = mean_accept(next);
    if ((direction > 0 && an < 0.5) || (direction < 0 && an > 0.5)) {
      eps = direction > 0 ? eps : next;
      break;
    }
    eps = next;
    if (eps > 1e7 || eps < 1e-10) break;
  }
  prop.set_step_size(eps);
  return eps;
}


}  // namespace nmcmc
