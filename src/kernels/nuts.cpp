#include "nmcmc/kernels/nuts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nmcmc/core/random.hpp"
#include "nmcmc/kernels/chain_stream.hpp"
#include "nuts_engine.hpp"

namespace nmcmc {

namespace detail {
namespace {
/// The ziggurat's tables for N(0, 1), 128 layers (Marsaglia & Tsang 2000): kn, the accept
/// thresholds of a layer's rectangle on a 31-bit magnitude; wn, the scale from that magnitude to
/// x; fn, the density exp(-x^2 / 2) at each layer's edge.
struct Ziggurat {
  static constexpr double kR = 3.442619855899;         // the base layer's edge
  static constexpr double kV = 9.91256303526217e-3;    // each layer's area
  uint32_t kn[128];
  double wn[128], fn[128];
  Ziggurat() {
    const double m1 = 2147483648.0;  // 2^31
    double dn = kR, tn = dn;
    const double q = kV / std::exp(-0.5 * dn * dn);
    kn[0] = static_cast<uint32_t>((dn / q) * m1);
    kn[1] = 0;
    wn[0] = q / m1;
    wn[127] = dn / m1;
    fn[0] = 1.0;
    fn[127] = std::exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(kV / dn + std::exp(-0.5 * dn * dn)));
      kn[i + 1] = static_cast<uint32_t>((dn / tn) * m1);
      tn = dn;
      fn[i] = std::exp(-0.5 * dn * dn);
      wn[i] = dn / m1;
    }
  }
};
const Ziggurat& ziggurat() {
  static const Ziggurat z;
  return z;
}
}  // namespace

double ChainStream::normal() {
  const Ziggurat& z = ziggurat();
  for (;;) {
    const uint64_t b = next();
    const int layer = static_cast<int>(b & 127);
    const auto hz = static_cast<int32_t>(static_cast<uint32_t>(b >> 32));  // a signed 32-bit value
    const uint32_t magnitude = hz < 0 ? 0u - static_cast<uint32_t>(hz) : static_cast<uint32_t>(hz);
    const double x = static_cast<double>(hz) * z.wn[layer];
    if (magnitude < z.kn[layer]) return x;  // inside the layer's rectangle
    if (layer == 0) {  // the tail beyond r (Marsaglia 1964)
      double t = 0, y = 0;
      do {
        t = -std::log(1.0 - uniform()) / Ziggurat::kR;
        y = -std::log(1.0 - uniform());
      } while (y + y < t * t);
      return hz > 0 ? Ziggurat::kR + t : -Ziggurat::kR - t;
    }
    if (z.fn[layer] + uniform() * (z.fn[layer - 1] - z.fn[layer]) < std::exp(-0.5 * x * x)) return x;  // the wedge
  }
}
}  // namespace detail


using nuts_engine::Engine;
using nuts_engine::kInf;
using nuts_engine::biased_progressive;
using nuts_engine::multinomial_choice;

NutsRules NutsRules::stan() {
  NutsRules r;
  r.top_level = biased_progressive;
  r.inside = multinomial_choice;
  return r;
}

NutsRules NutsRules::multinomial() {
  NutsRules r = stan();
  r.top_level = r.inside;
  return r;
}

Nuts::Nuts(NutsOptions options, NutsRules rules) : options_(options), rules_(std::move(rules)), eps_(options.step_size) {
  TORCH_CHECK(options.max_depth >= 1, "NUTS needs a maximum tree depth of at least 1, got ", options.max_depth);
  TORCH_CHECK(options.step_size >= 0, "NUTS step size must be non-negative");
  TORCH_CHECK(options.lookahead >= 0, "NUTS lookahead must be non-negative, got ", options.lookahead);
  TORCH_CHECK(rules_.top_level && rules_.inside, "NUTS rules need both choices");
}

ChainState Nuts::init(Target& target, const torch::Tensor& x) const {
  torch::NoGradGuard no_grad;
  ChainState s;
  s.x = x.to(target.options()).contiguous();
  auto eg = target.energy_and_grad(s.x);
  s.energy = eg.energy.to(torch::kFloat64);
  s.grad = eg.grad;
  return s;
}

void Nuts::set_step_sizes(const std::vector<double>& eps) {
  TORCH_CHECK(!eps.empty(), "NUTS: no step sizes given");
  double sum = 0;
  for (double e : eps) {
    TORCH_CHECK(e > 0 && std::isfinite(e), "NUTS step sizes must be positive and finite, got ", e);
    sum += e;
  }
  eps_chain_ = eps;
  eps_ = sum / static_cast<double>(eps.size());
}

torch::Tensor Nuts::probe_accept(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Metric metric = metric_.to(state.x.options());
  torch::Tensor p = metric.momentum(randn(state.x.sizes(), gen, state.x.options()));
  torch::Tensor h0 = state.energy + metric.kinetic(p);
  const PhasePoint z1 =
      leapfrog(target, metric, {state.x, p, state.grad, state.energy}, torch::full({1, 1}, eps_, state.x.options()), 1);
  torch::Tensor dh = h0 - (z1.energy + metric.kinetic(z1.p));
  return torch::exp(torch::clamp_max(torch::nan_to_num(dh, -kInf, 0.0, -kInf), 0.0));
}

ChainState Nuts::run(Target& target, const ChainState& state, int64_t n, int64_t lookahead, at::Generator& gen,
                     const torch::Tensor& p0, const StepCallback& on_step) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(eps_ > 0, "NUTS needs a positive step size");
  TORCH_CHECK(state.x.dim() == 2 && state.grad.defined(), "NUTS needs a [C, D] state with its gradient");
  if (n <= 0) return state;
  const Metric metric = metric_.to(target.options());
  const auto chains = static_cast<size_t>(state.x.size(0));
  TORCH_CHECK(eps_chain_.empty() || eps_chain_.size() == chains, "NUTS: ", eps_chain_.size(), " step sizes for ",
              chains, " chains");
  Engine engine(target, metric, rules_, options_, eps_chain_.empty() ? std::vector<double>(chains, eps_) : eps_chain_,
                state, gen);
  engine.run(n, lookahead, p0, on_step);
  return engine.last.x.defined() ? engine.last : state;
}

std::pair<ChainState, StepInfo> Nuts::transition(Target& target, const ChainState& state, const torch::Tensor& p0,
                                                 at::Generator& gen) {
  TORCH_CHECK(p0.sizes() == state.x.sizes(), "NUTS transition: p0 must be [C, D] as x");
  StepInfo info;
  ChainState next = run(target, state, 1, 1, gen, p0, [&](const ChainState&, const StepInfo& i) {
    info = i;
    return true;
  });
  return {next, info};
}

std::pair<ChainState, StepInfo> Nuts::step(Target& target, const ChainState& state, at::Generator& gen) {
  StepInfo info;
  ChainState next = run(target, state, 1, 1, gen, torch::Tensor(), [&](const ChainState&, const StepInfo& i) {
    info = i;
    return true;
  });
  return {next, info};
}

ChainState Nuts::run_steps(Target& target, ChainState state, int64_t n, at::Generator& gen,
                           const StepCallback& on_step) {
  int64_t lookahead = options_.lookahead;
  if (lookahead == 0) {  // as many as 64, while the queued draws (x and dU) take at most 64 MiB
    const double bytes_per_transition =
        static_cast<double>(state.x.size(0)) * (16.0 * static_cast<double>(state.x.size(1)) + 128.0);
    lookahead = std::clamp<int64_t>(static_cast<int64_t>(double(int64_t{64} << 20) / bytes_per_transition), 1, 64);
  }
  return run(target, state, n, lookahead, gen, torch::Tensor(), on_step);
}

}  // namespace nmcmc