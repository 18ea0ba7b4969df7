#include "nmcmc/kernels/nuts.hpp"

#include <cmath>
#include <limits>

#include "nmcmc/core/random.hpp"

namespace nmcmc {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

torch::Tensor col(const torch::Tensor& mask) { return mask.unsqueeze(1); }

PhasePoint select(const torch::Tensor& mask, const PhasePoint& a, const PhasePoint& b) {
  return {torch::where(col(mask), a.x, b.x), torch::where(col(mask), a.p, b.p), torch::where(col(mask), a.grad, b.grad),
          torch::where(mask, a.energy, b.energy)};
}

PhasePoint rows(const PhasePoint& z, const torch::Tensor& idx) {
  return {z.x.index_select(0, idx), z.p.index_select(0, idx), z.grad.index_select(0, idx), z.energy.index_select(0, idx)};
}

PhasePoint with_rows(const PhasePoint& z, const torch::Tensor& idx, const PhasePoint& r) {
  return {z.x.index_copy(0, idx, r.x), z.p.index_copy(0, idx, r.p), z.grad.index_copy(0, idx, r.grad),
          z.energy.index_copy(0, idx, r.energy)};
}

bool any_true(const torch::Tensor& mask) { return mask.any().item<bool>(); }

/// The generalised no-U-turn criterion: p#_minus . rho > 0 and p#_plus . rho > 0, [C] bool.
torch::Tensor no_u_turn(const torch::Tensor& ps_minus, const torch::Tensor& ps_plus, const torch::Tensor& rho) {
  torch::Tensor r = rho.to(torch::kFloat64);
  return ((ps_plus.to(torch::kFloat64) * r).sum(1) > 0) & ((ps_minus.to(torch::kFloat64) * r).sum(1) > 0);
}

/// A subtree as it is built, in the direction of its chain's extension: the momenta p and
/// p# = M^{-1} p at its first ("beg") and last ("end") leaves, its summed momentum, the
/// multinomial sample drawn from it and the log of its summed weights exp(H0 - H).
/// (Stan's build_tree arguments.) [C, D] and [C].
struct Subtree {
  torch::Tensor ps_beg, ps_end, p_beg, p_end, rho;
  PhasePoint sample;
  torch::Tensor log_sum_weight;
};

/// An empty subtree whose sample starts as `sample`.
Subtree empty_subtree(const PhasePoint& sample) {
  const torch::Tensor zeros = torch::zeros_like(sample.p);
  return {zeros, zeros, zeros, zeros, zeros, sample, torch::full_like(sample.energy, -kInf)};
}

/// What one transition shares across the recursion.
struct Transition {
  Transition(Target& target, const Metric& metric, const NutsRules& rules, at::Generator& gen)
      : target(target), metric(metric), rules(rules), gen(gen) {}
  Target& target;
  const Metric& metric;
  const NutsRules& rules;
  at::Generator& gen;
  double max_delta_h = 1000.0;
  torch::Tensor eps;  // [C, 1] signed step of each chain in this extension
  torch::Tensor h0;   // [C] float64
  PhasePoint z;       // the integrator's current point
  torch::Tensor n_leapfrog, sum_metro, divergent;  // [C] int64, float64, bool
};

/// One leapfrog step of the chains in `alive` (Stan's build_tree base case), written into `s`.
/// Returns which of them are still valid (not divergent).
torch::Tensor leaf(Transition& t, const torch::Tensor& alive, Subtree& s) {
  torch::Tensor idx = alive.nonzero().squeeze(1);  // the live rows only: waiting chains cost nothing
  const PhasePoint z1 = leapfrog(t.target, t.metric, rows(t.z, idx), t.eps.index_select(0, idx), 1);
  torch::Tensor w = t.h0.index_select(0, idx) - hamiltonian(t.metric, z1);  // log weight H0 - H
  torch::Tensor div = -w > t.max_delta_h;
  t.z = with_rows(t.z, idx, z1);
  t.n_leapfrog.index_add_(0, idx, torch::ones_like(idx));
  t.sum_metro.index_add_(0, idx, torch::exp(torch::clamp_max(w, 0.0)));
  t.divergent.index_copy_(0, idx, t.divergent.index_select(0, idx) | div);
  s.log_sum_weight = s.log_sum_weight.index_copy(0, idx, torch::logaddexp(s.log_sum_weight.index_select(0, idx), w));
  s.sample = with_rows(s.sample, idx, z1);
  torch::Tensor ps = t.rules.sharp ? t.metric.velocity(z1.p) : z1.p;
  s.ps_beg = s.ps_beg.index_copy(0, idx, ps);
  s.ps_end = s.ps_end.index_copy(0, idx, ps);
  s.p_beg = s.p_beg.index_copy(0, idx, z1.p);
  s.p_end = s.p_end.index_copy(0, idx, z1.p);
  s.rho = s.rho.index_add(0, idx, z1.p);
  return alive & torch::logical_not(t.divergent);
}

/// Stan's build_tree for every chain in `alive` at once: a subtree of 2^depth leaves in each
/// chain's direction, written into `s`, stopping a chain as soon as its subtree is invalid
/// (divergent or U-turn). Returns the chains whose subtree is valid; what `s` holds for the
/// others is never used.
torch::Tensor build(Transition& t, int64_t depth, const torch::Tensor& alive, Subtree& s) {
  if (!any_true(alive)) return alive;
  if (depth == 0) return leaf(t, alive, s);
  // The initial half: its first leaf is the subtree's first.
  Subtree init = empty_subtree(s.sample);
  init.ps_beg = s.ps_beg;
  init.p_beg = s.p_beg;
  const torch::Tensor valid_init = build(t, depth - 1, alive, init);
  s.ps_beg = init.ps_beg;
  s.p_beg = init.p_beg;
  s.sample = init.sample;
  if (!any_true(valid_init)) return valid_init;
  // The final half, from where the initial one ended: its last leaf is the subtree's last.
  Subtree fin = empty_subtree(init.sample);
  fin.ps_end = s.ps_end;
  fin.p_end = s.p_end;
  const torch::Tensor ok = build(t, depth - 1, valid_init, fin);
  s.ps_end = fin.ps_end;
  s.p_end = fin.p_end;
  // Multinomial sampling inside the subtree: the final half with probability w_final / w_subtree.
  const torch::Tensor lsw_subtree = torch::logaddexp(init.log_sum_weight, fin.log_sum_weight);
  s.log_sum_weight = torch::where(ok, torch::logaddexp(s.log_sum_weight, lsw_subtree), s.log_sum_weight);
  torch::Tensor u = rand({ok.size(0)}, t.gen, t.h0.options());
  s.sample = select(ok & (u < t.rules.inside(fin.log_sum_weight, init.log_sum_weight)), fin.sample, init.sample);
  const torch::Tensor rho_subtree = init.rho + fin.rho;
  s.rho = torch::where(col(ok), s.rho + rho_subtree, s.rho);
  // The U-turn criterion over the merged subtree, and across its two halves (Stan >= 2.23).
  torch::Tensor persist = no_u_turn(s.ps_beg, s.ps_end, rho_subtree);
  persist = persist & no_u_turn(s.ps_beg, fin.ps_beg, init.rho + fin.p_beg);
  persist = persist & no_u_turn(init.ps_end, s.ps_end, fin.rho + init.p_end);
  return ok & persist;
}

/// The trajectory so far, as two parts either side of the starting point: the forward part
/// (built with positive steps) and the backward part. For each part the momenta p and p# at its
/// seam end (nearest the start) and its far end, and its summed momentum. [C, D]
struct Trajectory {
  PhasePoint fwd_end, bck_end;  // the integrator's points at the two far ends
  torch::Tensor p_fwd_fwd, ps_fwd_fwd, p_fwd_bck, ps_fwd_bck;  // forward part: far end, seam end
  torch::Tensor p_bck_fwd, ps_bck_fwd, p_bck_bck, ps_bck_bck;  // backward part: seam end, far end
  torch::Tensor rho;                                            // summed momentum of the whole
};

}  // namespace

NutsRules NutsRules::stan() {
  NutsRules r;
  r.top_level = [](const torch::Tensor& log_w_new, const torch::Tensor& log_w_old) {
    return torch::clamp_max(torch::exp(log_w_new - log_w_old), 1.0);
  };
  r.inside = [](const torch::Tensor& log_w_new, const torch::Tensor& log_w_old) {
    return torch::exp(log_w_new - torch::logaddexp(log_w_old, log_w_new));
  };
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

std::pair<ChainState, StepInfo> Nuts::step(Target& target, const ChainState& state, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Metric metric = metric_.to(state.x.options());
  return transition(target, state, metric.momentum(randn(state.x.sizes(), gen, state.x.options())), gen);  // p ~ N(0, M)
}

std::pair<ChainState, StepInfo> Nuts::transition(Target& target, const ChainState& state, const torch::Tensor& p0,
                                                 at::Generator& gen) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(eps_ > 0, "NUTS needs a positive step size");
  TORCH_CHECK(p0.sizes() == state.x.sizes(), "NUTS transition: p0 must be [C, D] as x");
  const int64_t c = state.x.size(0);
  const auto f64 = state.energy.options().dtype(torch::kFloat64);
  const auto i64 = f64.dtype(torch::kInt64);
  const Metric metric = metric_.to(state.x.options());
  const PhasePoint start{state.x, p0, state.grad, state.energy.to(torch::kFloat64)};
  Transition t(target, metric, rules_, gen);
  t.max_delta_h = options_.max_delta_h;
  t.h0 = start.energy + metric.kinetic(p0);
  t.z = start;
  t.n_leapfrog = torch::zeros({c}, i64);
  t.sum_metro = torch::zeros({c}, f64);
  t.divergent = torch::zeros({c}, f64.dtype(torch::kBool));
  // Stan's transition: both parts start as the starting point alone.
  const torch::Tensor ps0 = rules_.sharp ? metric.velocity(p0) : p0;
  Trajectory tr{start, start, p0, ps0, p0, ps0, p0, ps0, p0, ps0, p0};
  PhasePoint sample = start;
  torch::Tensor log_sum_weight = torch::zeros({c}, f64);  // log exp(H0 - H0)
  torch::Tensor depth = torch::zeros({c}, i64);
  torch::Tensor active = torch::ones({c}, f64.dtype(torch::kBool));
  for (int64_t d = 0; d < options_.max_depth && any_true(active); ++d) {
    const torch::Tensor forward = rand({c}, gen, f64) > 0.5;
    t.eps = torch::where(col(forward), torch::full({1, 1}, eps_, state.x.options()),
                         torch::full({1, 1}, -eps_, state.x.options()));
    t.z = select(forward, tr.fwd_end, tr.bck_end);
    // The old trajectory becomes the backward part (forward extension) or the forward part.
    torch::Tensor rho_fwd = torch::where(col(forward), torch::zeros_like(tr.rho), tr.rho);
    torch::Tensor rho_bck = torch::where(col(forward), tr.rho, torch::zeros_like(tr.rho));
    tr.p_bck_fwd = torch::where(col(forward), tr.p_fwd_fwd, tr.p_bck_fwd);
    tr.ps_bck_fwd = torch::where(col(forward), tr.ps_fwd_fwd, tr.ps_bck_fwd);
    tr.p_fwd_bck = torch::where(col(forward), tr.p_fwd_bck, tr.p_bck_bck);
    tr.ps_fwd_bck = torch::where(col(forward), tr.ps_fwd_bck, tr.ps_bck_bck);
    // The new subtree: its near end is "beg", its far end "end".
    Subtree sub = empty_subtree(start);
    const torch::Tensor valid = build(t, d, active, sub);
    const torch::Tensor fwd_live = forward & active, bck_live = torch::logical_not(forward) & active;
    tr.fwd_end = select(fwd_live, t.z, tr.fwd_end);
    tr.bck_end = select(bck_live, t.z, tr.bck_end);
    rho_fwd = torch::where(col(fwd_live), sub.rho, rho_fwd);
    rho_bck = torch::where(col(bck_live), sub.rho, rho_bck);
    tr.p_fwd_bck = torch::where(col(fwd_live), sub.p_beg, tr.p_fwd_bck);
    tr.ps_fwd_bck = torch::where(col(fwd_live), sub.ps_beg, tr.ps_fwd_bck);
    tr.p_fwd_fwd = torch::where(col(fwd_live), sub.p_end, tr.p_fwd_fwd);
    tr.ps_fwd_fwd = torch::where(col(fwd_live), sub.ps_end, tr.ps_fwd_fwd);
    tr.p_bck_fwd = torch::where(col(bck_live), sub.p_beg, tr.p_bck_fwd);
    tr.ps_bck_fwd = torch::where(col(bck_live), sub.ps_beg, tr.ps_bck_fwd);
    tr.p_bck_bck = torch::where(col(bck_live), sub.p_end, tr.p_bck_bck);
    tr.ps_bck_bck = torch::where(col(bck_live), sub.ps_end, tr.ps_bck_bck);
    const torch::Tensor ok = active & valid;  // an invalid subtree ends the chain's trajectory, unused
    depth = depth + ok.to(torch::kInt64);
    // Between the old trajectory and the new subtree (Stan: biased progressive sampling).
    torch::Tensor u = rand({c}, gen, f64);
    sample = select(ok & (u < rules_.top_level(sub.log_sum_weight, log_sum_weight)), sub.sample, sample);
    log_sum_weight = torch::where(ok, torch::logaddexp(log_sum_weight, sub.log_sum_weight), log_sum_weight);
    tr.rho = torch::where(col(ok), rho_bck + rho_fwd, tr.rho);
    // The U-turn criterion over the merged trajectory and across the seam.
    torch::Tensor persist = torch::ones_like(ok);
    if (rules_.check_merged) persist = no_u_turn(tr.ps_bck_bck, tr.ps_fwd_fwd, tr.rho);
    persist = persist & no_u_turn(tr.ps_bck_bck, tr.ps_fwd_bck, rho_bck + tr.p_fwd_bck);
    persist = persist & no_u_turn(tr.ps_bck_fwd, tr.ps_fwd_fwd, rho_fwd + tr.p_bck_fwd);
    active = ok & persist;
  }
  ChainState next{sample.x, sample.energy, sample.grad};
  StepInfo info;
  torch::Tensor accept = t.sum_metro / t.n_leapfrog.to(torch::kFloat64);
  info.accept_prob = torch::clamp(torch::nan_to_num(accept, 0.0, 0.0, 0.0), 0.0, 1.0);
  info.accepted = (sample.x != state.x).any(1);
  info.divergent = t.divergent;
  info.n_grad_chain = t.n_leapfrog;
  info.n_grad = t.n_leapfrog.max().item<int64_t>();
  info.tree_depth = depth;
  info.energy = sample.energy + metric.kinetic(sample.p);
  return {next, info};
}

}  // namespace nmcmc
