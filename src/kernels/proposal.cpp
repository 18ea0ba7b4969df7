#include "nmcmc/kernels/proposal.hpp"

#include <limits>

#include "nmcmc/core/random.hpp"

namespace nmcmc {

MetropolisHastings::MetropolisHastings(std::shared_ptr<Proposal> proposal) : proposal_(std::move(proposal)) {
  TORCH_CHECK(proposal_, "MetropolisHastings needs a proposal");
}

ChainState MetropolisHastings::init(Target& target, const torch::Tensor& x) const {
  torch::NoGradGuard no_grad;
  ChainState s;
  s.x = x.to(target.options()).contiguous();
  if (proposal_->uses_grad()) {
    auto eg = target.energy_and_grad(s.x);
    s.energy = eg.energy.to(torch::kFloat64);
    s.grad = eg.grad;
  } else {
    s.energy = target.energy(s.x).to(torch::kFloat64);
  }
  return s;
}

ChainState Kernel::run_steps(Target& target, ChainState state, int64_t n, at::Generator& gen,
                             const StepCallback& on_step) {
  for (int64_t i = 0; i < n; ++i) {
    auto [next, info] = step(target, state, gen);
    state = std::move(next);
    if (!on_step(state, info)) break;
  }
  return state;
}

void Tunable::set_step_size(double /*eps*/) { TORCH_CHECK(false, "sampler '", name(), "' has no tunable step size"); }

void Tunable::set_step_sizes(const std::vector<double>& /*eps*/) {
  TORCH_CHECK(false, "sampler '", name(), "' has one step size for all chains");
}

void Tunable::set_metric(const Metric& /*metric*/) { TORCH_CHECK(false, "sampler '", name(), "' has no metric to adapt"); }

torch::Tensor Kernel::probe_accept(Target&, const ChainState&, at::Generator&) {
  TORCH_CHECK(false, "kernel '", name(), "' has no trial move for step-size search");
}

torch::Tensor MetropolisHastings::probe_accept(Target& target, const ChainState& state, at::Generator& gen) {
  ProposalResult r = proposal_->propose(target, state, gen);
  return mh_accept(state, r, gen).second.accept_prob;
}


torch::Tensor log_acceptance(const torch::Tensor& energy, const torch::Tensor& energy_new,
                             const torch::Tensor& log_q_ratio) {
  return energy.to(torch::kFloat64) - energy_new.to(torch::kFloat64) + log_q_ratio.to(torch::kFloat64);
}

std::pair<ChainState, StepInfo> mh_accept(const ChainState& current, const ProposalResult& proposal,
                                          at::Generator& gen) {
  const ChainState& prop = proposal.proposed;
  const auto f64 = current.energy.options().dtype(torch::kFloat64);
  // log a = U(x) - U(x') + log q(x|x') - log q(x'|x), in float64 (Note [Uncalibrated proposals]).
  torch::Tensor log_a = log_acceptance(current.energy, prop.energy, proposal.log_q_ratio);  // [C]
  torch::Tensor finite = torch::isfinite(log_a) & torch::isfinite(prop.x).all(1);
  if (prop.grad.defined()) finite = finite & torch::isfinite(prop.grad).all(1);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  log_a = torch::where(finite, log_a, torch::full_like(log_a, neg_inf));
  StepInfo info;
  info.accept_prob = torch::exp(torch::clamp_max(log_a, 0.0));
  torch::Tensor u = rand({log_a.size(0)}, gen, f64);
  info.accepted = torch::log(u) < log_a;
  info.divergent = torch::logical_not(finite) | (log_a < kDivergenceThreshold);

  ChainState next;
  torch::Tensor acc_col = info.accepted.unsqueeze(1);  // [C, 1]
  next.x = torch::where(acc_col, prop.x, current.x);
  next.energy = torch::where(info.accepted, prop.energy.to(torch::kFloat64), current.energy);
  if (current.grad.defined() && prop.grad.defined()) next.grad = torch::where(acc_col, prop.grad, current.grad);
  return {next, info};
}

ProposalResult normal_independence_proposal(Target& target, const ChainState& state, at::Generator& gen) {
  torch::Tensor z = randn(state.x.sizes(), gen, state.x.options());
  EnergyGrad eg = target.energy_and_grad(z);
  torch::Tensor log_q_ratio = 0.5 * (z.to(torch::kFloat64).pow(2).sum(1) - state.x.to(torch::kFloat64).pow(2).sum(1));
  return {{z, eg.energy, eg.grad}, log_q_ratio};
}

std::pair<ChainState, StepInfo> MetropolisHastings::step(Target& target, const ChainState& state,
                                                         at::Generator& gen) {
  const int64_t g0 = target.grad_evals(), e0 = target.energy_evals();
  ProposalResult r = proposal_->propose(target, state, gen);
  auto out = mh_accept(state, r, gen);
  out.second.n_grad = target.grad_evals() - g0;
  out.second.n_energy = target.energy_evals() - e0;
  proposal_->observe(out.second);
  return out;
}

}  // namespace nmcmc
