#include "nmcmc/training/proposal_trainer.hpp"

#include <algorithm>
#include <cmath>

#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/training/fused_adam.hpp"

namespace nmcmc {

BetaController::BetaController(double beta, double beta_min, double beta_max, double rho, double accept_target)
    : beta_(beta), beta_min_(beta_min), beta_max_(beta_max), rho_(rho), accept_target_(accept_target) {
  TORCH_CHECK(beta_min > 0 && beta_min <= beta && beta <= beta_max, "need 0 < beta_min <= beta <= beta_max");
}

double BetaController::update(double accept) {
  beta_ = std::clamp(beta_ * (1.0 + rho_ * (accept - accept_target_)), beta_min_, beta_max_);
  return beta_;
}

namespace {
/// Drops every parameter's gradient: the next backward pass sets it (no zero-filling pass).
void clear_grads(torch::nn::Module& module) {
  for (auto& p : module.parameters()) p.mutable_grad() = torch::Tensor();
}
/// Zeros for the parameters no backward pass reached, so that Adam steps every parameter (its
/// moments decay) exactly as with zeroed gradients, and every rank reduces the same list.
void fill_missing_grads(torch::nn::Module& module) {
  for (auto& p : module.parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}
}  // namespace

ProposalTrainer::ProposalTrainer(std::shared_ptr<ProposalModel> model, const torch::optim::AdamOptions& adam,
                                 BetaController beta, double clip)
    : model_(std::move(model)), beta_(beta), clip_(clip) {
  TORCH_CHECK(model_, "ProposalTrainer needs a model");
  optimizer_ = std::make_unique<FusedAdam>(model_->module().parameters(), adam);  // Note [Fused Adam]
}

void ProposalTrainer::set_learning_rate(double lr) {
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

ProposalStep ProposalTrainer::step(Target& target, const torch::Tensor& x, const torch::Tensor& u_x,
                                   const torch::Tensor& grad_x, at::Generator& gen, bool create_graph) {
  torch::nn::Module& module = model_->module();
  module.train();
  clear_grads(module);
  ProposalStep out;
  DeferredWeightGrads deferred;  // Note [Deferred weight gradients]
  out.terms = entropy_objective(target, *model_, x, u_x, grad_x, beta_.value(), gen, create_graph);
  out.skipped = true;
  if (std::isfinite(out.terms.loss_value)) {
    out.terms.loss.backward();
    deferred.flush();
    fill_missing_grads(module);
    // clip_grad_norm_ and step() in one pass (Note [Fused Adam])
    if (std::isfinite(optimizer_->clip_and_step(clip_))) out.skipped = false;
  }
  clear_grads(module);

  beta_.update(out.terms.accept);
  return out;
}

ShardedStep ProposalTrainer::step_shards(Target& target, const std::vector<ShardInput>& shards, bool create_graph,
                                         parallel::Communicator& comm, bool stop) {
  torch::nn::Module& module = model_->module();
  module.train();
  clear_grads(module);
  ShardedStep out;
  DeferredWeightGrads deferred;  // Note [Deferred weight gradients]
  double finite = 0, bad = 0, accept = 0, loss = 0, entropy = 0, rows = 0;
  for (const ShardInput& in : shards) {
    TORCH_CHECK(in.gen != nullptr, "step_shards: a shard without a generator");
    ObjectiveTerms t = entropy_objective(target, *model_, in.x, in.u_x, in.grad_x, beta_.value(), *in.gen, create_graph);
    const double n = static_cast<double>(in.x.size(0)), k = static_cast<double>(t.rows_finite);
    if (!std::isfinite(t.loss_value)) {
      bad += 1;
    } else if (t.rows_finite > 0) {
      (t.loss * k).backward();  // the shard's sum over finite rows: divided by the batch's count below
      // Each shard's weight gradients reach .grad as one sum, as they do on a rank of its own: so a
      // process training 2 shards adds S1 + S2 in the order the all-reduce of 2 ranks does.
      deferred.flush();
      loss += t.loss_value * k;
    }
    finite += k;
    accept += t.accept * n;
    entropy += t.entropy.sum().item<double>();
    rows += n;
    t.loss = torch::Tensor();  // the graph is no longer needed
    out.shards.push_back(std::move(t));
  }
  // Gradients of parameters no shard reached are zeros, so every rank reduces the same list.
  fill_missing_grads(module);
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) grads.push_back(p.grad());
  comm.all_reduce_sum(grads);
  std::vector<double> totals = parallel::all_reduce_doubles(comm, {finite, bad, accept, loss, entropy, rows,
                                                                   stop ? 1.0 : 0.0});
  finite = totals[0];
  out.rows = static_cast<int64_t>(totals[5]);
  out.accept = totals[2] / totals[5];
  out.entropy = totals[4] / totals[5];
  out.loss = totals[1] > 0 ? NAN : totals[3] / std::max(1.0, finite);
  out.stop = totals[6] > 0;
  out.skipped = true;
  if (totals[1] == 0) {
    // the mean over the batch's finite rows, clipped, and the step: one pass (Note [Fused Adam])
    if (std::isfinite(optimizer_->clip_and_step(clip_, 1.0 / std::max(1.0, finite)))) out.skipped = false;
  }
  clear_grads(module);
  beta_.update(out.accept);
  return out;
}

void ProposalTrainer::broadcast_from_root(parallel::Communicator& comm) {
  if (comm.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : model_->module().parameters()) comm.broadcast(p, 0);
  for (auto& b : model_->module().buffers()) comm.broadcast(b, 0);
  torch::Tensor beta = torch::tensor({beta_.value()}, torch::kFloat64);
  comm.broadcast(beta, 0);
  beta_.set_value(beta.item<double>());
}

torch::Tensor advance_rows(const torch::Tensor& x, const torch::Tensor& u_x, const ProposalStep& step,
                           at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Proposed& p = step.terms.proposed;
  ChainState current{x.detach(), u_x.detach().to(torch::kFloat64), torch::Tensor()};
  ProposalResult proposal{{p.x_new.detach(), p.energy_new.detach(), torch::Tensor()},
                          (p.log_q_rev - p.log_q_fwd).detach()};
  return mh_accept(current, proposal, gen).first.x;
}

void ProposalTrainer::save(torch::serialize::OutputArchive& archive, const std::string& model_key,
                           const std::string& optimizer_key) const {
  torch::serialize::OutputArchive model_ar, optim_ar;
  model_->module().save(model_ar);
  optimizer_->save(optim_ar);
  archive.write(model_key, model_ar);
  archive.write(optimizer_key, optim_ar);
}

void ProposalTrainer::load(torch::serialize::InputArchive& archive, const std::string& model_key,
                           const std::string& optimizer_key) {
  torch::serialize::InputArchive model_ar, optim_ar;
  archive.read(model_key, model_ar);
  model_->module().load(model_ar);
  archive.read(optimizer_key, optim_ar);
  optimizer_->load(optim_ar);
}

}  // namespace nmcmc
