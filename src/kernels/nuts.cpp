#include "nmcmc/kernels/nuts.hpp"

#include <cmath>
#include <limits>

#include "nmcmc/core/random.hpp"

namespace nmcmc {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A phase-space point of every chain: position, momentum, dU, U (float64). [C, D] / [C].
struct Phase {
  torch::Tensor x, p, g, u;
};

torch::Tensor col(const torch::Tensor& mask) { return mask.unsqueeze(1); }

Phase select(const torch::Tensor& mask, const Phase& a, const Phase& b) {
  return {torch::where(col(mask), a.x, b.x), torch::where(col(mask), a.p, b.p), torch::where(col(mask), a.g, b.g),
          torch::where(mask, a.u, b.u)};
}

bool any_true(const torch::Tensor& mask) { return mask.any().item<bool>(); }

/// The generalised no-U-turn criterion: p#_minus . rho > 0 and p#_plus . rho > 0, [C] bool.
torch::Tensor no_u_turn(const torch::Tensor& ps_minus, const torch::Tensor& ps_plus, const torch::Tensor& rho) {
  torch::Tensor r = rho.to(torch::kFloat64);
  return ((ps_plus.to(torch::kFloat64) * r).sum(1) > 0) & ((ps_minus.to(torch::kFloat64) * r).sum(1) > 0);
}

/// What one transition shares across the recursion.
struct Transition {
  Target& target;
  const Metric& metric;
  torch::Tensor eps;       // [C, 1] signed step of each chain in this extension
  torch::Tensor h0;        // [C] float64
  double max_delta_h;
  NutsDefect defect;
  at::Generator& gen;
  Phase z;                 // the integrator's current point
  torch::Tensor n_leapfrog, sum_metro, divergent;  // [C] int64, float64, bool
};

/// The subtree ends a build writes: p#, p and the summed momentum (Stan's build_tree arguments).
struct Ends {
  torch::Tensor ps_beg, ps_end, p_beg, p_end, rho;
};

Ends zero_ends(const torch::Tensor& like) {
  return {torch::zeros_like(like), torch::zeros_like(like), torch::zeros_like(like), torch::zeros_like(like),
          torch::zeros_like(like)};
}

/// One leapfrog step of the chains in `alive` (Stan's build_tree base case). Returns which of
/// them are still valid (not divergent).
torch::Tensor leaf(Transition& t, const torch::Tensor& alive, Phase& propose, torch::Tensor& ps_beg,
                   torch::Tensor& ps_end, torch::Tensor& rho, torch::Tensor& p_beg, torch::Tensor& p_end,
                   torch::Tensor& log_sum_weight) {
  torch::Tensor idx = alive.nonzero().squeeze(1);  // the live rows only: waiting chains cost nothing
  torch::Tensor e = t.eps.index_select(0, idx);
  torch::Tensor x = t.z.x.index_select(0, idx), p = t.z.p.index_select(0, idx), g = t.z.g.index_select(0, idx);
  // Leapfrog (Neal 2011, eqs. 5.18-5.20) with the metric's velocity M^{-1} p.
  torch::Tensor p_half = p - 0.5 * e * g;
  torch::Tensor x1 = x + e * t.metric.velocity(p_half);
  EnergyGrad eg = t.target.energy_and_grad(x1);
  torch::Tensor p1 = p_half - 0.5 * e * eg.grad;
  torch::Tensor u1 = eg.energy.to(torch::kFloat64);
  torch::Tensor h = u1 + t.metric.kinetic(p1);
  h = torch::where(torch::isfinite(h), h, torch::full_like(h, kInf));  // NaN or -inf: as Stan's NaN -> +inf
  torch::Tensor w = t.h0.index_select(0, idx) - h;                      // log weight H0 - H
  torch::Tensor div = -w > t.max_delta_h;
  t.z = {t.z.x.index_copy(0, idx, x1), t.z.p.index_copy(0, idx, p1), t.z.g.index_copy(0, idx, eg.grad),
         t.z.u.index_copy(0, idx, u1)};
  t.n_leapfrog.index_add_(0, idx, torch::ones_like(idx));
  t.sum_metro.index_add_(0, idx, torch::exp(torch::clamp_max(w, 0.0)));
  t.divergent.index_copy_(0, idx, t.divergent.index_select(0, idx) | div);
  log_sum_weight = log_sum_weight.index_copy(0, idx, torch::logaddexp(log_sum_weight.index_select(0, idx), w));
  propose = {propose.x.index_copy(0, idx, x1), propose.p.index_copy(0, idx, p1), propose.g.index_copy(0, idx, eg.grad),
             propose.u.index_copy(0, idx, u1)};
  torch::Tensor ps = t.metric.velocity(p1);
  ps_beg = ps_beg.index_copy(0, idx, ps);
  ps_end = ps_end.index_copy(0, idx, ps);
  p_beg = p_beg.index_copy(0, idx, p1);
  p_end = p_end.index_copy(0, idx, p1);
  rho = rho.index_add(0, idx, p1);
  return alive & torch::logical_not(t.divergent);
}

/// Stan's build_tree for every chain in `alive` at once: a subtree of 2^depth leaves in each
/// chain's direction, stopping a chain as soon as its subtree is invalid (divergent or U-turn).
/// Returns the chains whose subtree is valid.
torch::Tensor build(Transition& t, int64_t depth, const torch::Tensor& alive, Phase& propose, torch::Tensor& ps_beg,
                    torch::Tensor& ps_end, torch::Tensor& rho, torch::Tensor& p_beg, torch::Tensor& p_end,
                    torch::Tensor& log_sum_weight) {
  if (!any_true(alive)) return alive;
  if (depth == 0) return leaf(t, alive, propose, ps_beg, ps_end, rho, p_beg, p_end, log_sum_weight);
  // The initial half.
  torch::Tensor lsw_init = torch::full_like(log_sum_weight, -kInf);
  Ends init = zero_ends(rho);
  torch::Tensor valid_init =
      build(t, depth - 1, alive, propose, ps_beg, init.ps_end, init.rho, p_beg, init.p_end, lsw_init);
  if (!any_true(valid_init)) return valid_init;
  // The final half, from where the initial one ended.
  Phase propose_final = propose;
  torch::Tensor lsw_final = torch::full_like(log_sum_weight, -kInf);
  Ends fin = zero_ends(rho);
  torch::Tensor ok = build(t, depth - 1, valid_init, propose_final, fin.ps_beg, ps_end, fin.rho, fin.p_beg, p_end, lsw_final);
  // Multinomial sampling inside the subtree: the final half with probability w_final / w_subtree.
  torch::Tensor lsw_subtree = torch::logaddexp(lsw_init, lsw_final);
  log_sum_weight = torch::where(ok, torch::logaddexp(log_sum_weight, lsw_subtree), log_sum_weight);
  torch::Tensor u = rand({ok.size(0)}, t.gen, t.h0.options());
  torch::Tensor prob = t.defect == NutsDefect::kNoSubtreeWeights ? torch::full_like(u, 0.5) : torch::exp(lsw_final - lsw_subtree);
  propose = select(ok & (u < prob), propose_final, propose);
  torch::Tensor rho_subtree = init.rho + fin.rho;
  rho = torch::where(col(ok), rho + rho_subtree, rho);
  // The U-turn criterion over the merged subtree, and across its two halves (Stan >= 2.23).
  torch::Tensor persist = no_u_turn(ps_beg, ps_end, rho_subtree);
  persist = persist & no_u_turn(ps_beg, fin.ps_beg, init.rho + fin.p_beg);
  persist = persist & no_u_turn(init.ps_end, ps_end, fin.rho + init.p_end);
  return ok & persist;
}

}  // namespace

Nuts::Nuts(NutsOptions options, NutsDefect defect) : options_(options), defect_(defect), eps_(options.step_size) {
  TORCH_CHECK(options.max_depth >= 1, "NUTS needs a maximum tree depth of at least 1, got ", options.max_depth);
  TORCH_CHECK(options.step_size >= 0, "NUTS step size must be non-negative");
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

torch::Tensor Nuts::probe_accept(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Metric metric = metric_.to(state.x.options());
  torch::Tensor p = metric.momentum(randn(state.x.sizes(), gen, state.x.options()));
  torch::Tensor h0 = state.energy + metric.kinetic(p);
  torch::Tensor p_half = p - 0.5 * eps_ * state.grad;
  torch::Tensor x1 = state.x + eps_ * metric.velocity(p_half);
  EnergyGrad eg = target.energy_and_grad(x1);
  torch::Tensor p1 = p_half - 0.5 * eps_ * eg.grad;
  torch::Tensor dh = h0 - (eg.energy.to(torch::kFloat64) + metric.kinetic(p1));
  return torch::exp(torch::clamp_max(torch::nan_to_num(dh, -kInf, 0.0, -kInf), 0.0));
}

std::pair<ChainState, StepInfo> Nuts::step(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(eps_ > 0, "NUTS needs a positive step size");
  const int64_t c = state.x.size(0);
  const auto f64 = state.energy.options().dtype(torch::kFloat64);
  const auto i64 = f64.dtype(torch::kInt64);
  const Metric metric = metric_.to(state.x.options());
  torch::Tensor p0 = metric.momentum(randn(state.x.sizes(), gen, state.x.options()));  // p ~ N(0, M)
  Phase start{state.x, p0, state.grad, state.energy.to(torch::kFloat64)};
  Transition t{target,
               metric,
               torch::Tensor(),
               start.u + metric.kinetic(p0),
               options_.max_delta_h,
               defect_,
               gen,
               start,
               torch::zeros({c}, i64),
               torch::zeros({c}, f64),
               torch::zeros({c}, f64.dtype(torch::kBool))};
  // Stan's transition: the trajectory's two ends, the momenta at the ends and at the seam
  // between the backward and forward parts, and the summed momentum.
  Phase z_fwd = start, z_bck = start, sample = start;
  const torch::Tensor ps0 = metric.velocity(p0);
  torch::Tensor p_fwd_fwd = p0, ps_fwd_fwd = ps0, p_fwd_bck = p0, ps_fwd_bck = ps0;
  torch::Tensor p_bck_fwd = p0, ps_bck_fwd = ps0, p_bck_bck = p0, ps_bck_bck = ps0;
  torch::Tensor rho = p0;
  torch::Tensor log_sum_weight = torch::zeros({c}, f64);  // log exp(H0 - H0)
  torch::Tensor depth = torch::zeros({c}, i64);
  torch::Tensor active = torch::ones({c}, f64.dtype(torch::kBool));
  for (int64_t d = 0; d < options_.max_depth && any_true(active); ++d) {
    const torch::Tensor forward = rand({c}, gen, f64) > 0.5;
    t.eps = torch::where(col(forward), torch::full({1, 1}, eps_, state.x.options()),
                         torch::full({1, 1}, -eps_, state.x.options()));
    t.z = select(forward, z_fwd, z_bck);
    // The old trajectory becomes the backward part (forward extension) or the forward part.
    torch::Tensor rho_fwd = torch::where(col(forward), torch::zeros_like(rho), rho);
    torch::Tensor rho_bck = torch::where(col(forward), rho, torch::zeros_like(rho));
    p_bck_fwd = torch::where(col(forward), p_fwd_fwd, p_bck_fwd);
    ps_bck_fwd = torch::where(col(forward), ps_fwd_fwd, ps_bck_fwd);
    p_fwd_bck = torch::where(col(forward), p_fwd_bck, p_bck_bck);
    ps_fwd_bck = torch::where(col(forward), ps_fwd_bck, ps_bck_bck);
    // The new subtree: its near end is "beg", its far end "end".
    Phase propose = start;
    Ends sub = zero_ends(rho);
    torch::Tensor lsw_subtree = torch::full({c}, -kInf, f64);
    torch::Tensor valid = build(t, d, active, propose, sub.ps_beg, sub.ps_end, sub.rho, sub.p_beg, sub.p_end, lsw_subtree);
    const torch::Tensor fwd_live = forward & active, bck_live = torch::logical_not(forward) & active;
    z_fwd = select(fwd_live, t.z, z_fwd);
    z_bck = select(bck_live, t.z, z_bck);
    rho_fwd = torch::where(col(fwd_live), sub.rho, rho_fwd);
    rho_bck = torch::where(col(bck_live), sub.rho, rho_bck);
    p_fwd_bck = torch::where(col(fwd_live), sub.p_beg, p_fwd_bck);
    ps_fwd_bck = torch::where(col(fwd_live), sub.ps_beg, ps_fwd_bck);
    p_fwd_fwd = torch::where(col(fwd_live), sub.p_end, p_fwd_fwd);
    ps_fwd_fwd = torch::where(col(fwd_live), sub.ps_end, ps_fwd_fwd);
    p_bck_fwd = torch::where(col(bck_live), sub.p_beg, p_bck_fwd);
    ps_bck_fwd = torch::where(col(bck_live), sub.ps_beg, ps_bck_fwd);
    p_bck_bck = torch::where(col(bck_live), sub.p_end, p_bck_bck);
    ps_bck_bck = torch::where(col(bck_live), sub.ps_end, ps_bck_bck);
    const torch::Tensor ok = active & valid;  // an invalid subtree ends the chain's trajectory, unused
    depth = depth + ok.to(torch::kInt64);
    // Biased progressive sampling between the old trajectory and the new subtree.
    torch::Tensor u = rand({c}, gen, f64);
    torch::Tensor take;
    switch (defect_) {
      case NutsDefect::kUniformTopLevel:
        take = u < torch::exp(lsw_subtree - torch::logaddexp(log_sum_weight, lsw_subtree));
        break;
      case NutsDefect::kNoProgressiveBias:
        take = torch::ones_like(ok);
        break;
      default:
        take = (lsw_subtree > log_sum_weight) | (u < torch::exp(lsw_subtree - log_sum_weight));
    }
    sample = select(ok & take, propose, sample);
    log_sum_weight = torch::where(ok, torch::logaddexp(log_sum_weight, lsw_subtree), log_sum_weight);
    rho = torch::where(col(ok), rho_bck + rho_fwd, rho);
    // The U-turn criterion over the merged trajectory and across the seam.
    torch::Tensor persist = torch::ones_like(ok);
    if (defect_ != NutsDefect::kNoMergedCheck) persist = no_u_turn(ps_bck_bck, ps_fwd_fwd, rho);
    persist = persist & no_u_turn(ps_bck_bck, ps_fwd_bck, rho_bck + p_fwd_bck);
    persist = persist & no_u_turn(ps_bck_fwd, ps_fwd_fwd, rho_fwd + p_bck_fwd);
    active = ok & persist;
  }
  ChainState next{sample.x, sample.u, sample.g};
  StepInfo info;
  torch::Tensor accept = t.sum_metro / t.n_leapfrog.to(torch::kFloat64);
  info.accept_prob = torch::clamp(torch::nan_to_num(accept, 0.0, 0.0, 0.0), 0.0, 1.0);
  info.accepted = (sample.x != state.x).any(1);
  info.divergent = t.divergent;
  info.n_grad_chain = t.n_leapfrog;
  info.n_grad = t.n_leapfrog.max().item<int64_t>();
  info.tree_depth = depth;
  info.energy = sample.u + metric.kinetic(sample.p);
  return {next, info};
}

}  // namespace nmcmc
