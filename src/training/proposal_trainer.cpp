#include "nmcmc/training/proposal_trainer.hpp"

#include <algorithm>
#include <cmath>

#include "nmcmc/nn/deferred_linear.hpp"

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
  optimizer_ = std::make_unique<torch::optim::Adam>(model_->module().parameters(), adam);
}

void ProposalTrainer::set_learning_rate(double lr) {
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

TrainingStep ProposalTrainer::step(Target& target, const std::vector<ShardInput>& shards, bool create_graph,
                                   parallel::Communicator& comm, bool stop) {
  TORCH_CHECK(!shards.empty(), "ProposalTrainer::step: no shard");
  torch::nn::Module& module = model_->module();
  module.train();
  clear_grads(module);
  TrainingStep out;
  DeferredWeightGrads deferred;  // Note [Deferred weight gradients]
  double finite = 0, bad = 0, rows = 0, bad_rows = 0;
  for (const ShardInput& in : shards) {
    TORCH_CHECK(in.gen != nullptr, "ProposalTrainer::step: a shard without a generator");
    ObjectiveTerms t = entropy_objective(target, *model_, in.x, in.u_x, in.grad_x, beta_.value(), *in.gen, create_graph);
    finite += static_cast<double>(t.rows_finite);
    bad += std::isfinite(t.loss_value) ? 0.0 : 1.0;
    rows += static_cast<double>(in.x.size(0));
    bad_rows += static_cast<double>(t.rows_bad);
    out.shards.push_back(std::move(t));
  }
  // The whole batch's counts (every shard of every rank), so that each shard's loss is weighted by
  // its share of the finite rows: the gradient of the mean over the batch's finite rows. With one
  // shard on one process the weight is exactly 1 and this is the plain step.
  const std::vector<double> counts = parallel::all_reduce_doubles(comm, {finite, bad, rows, bad_rows});
  const double all_finite = counts[0], all_rows = counts[2];
  const bool skip = counts[1] > 0;
  double accept = 0, loss = 0, entropy = 0;
  for (ObjectiveTerms& t : out.shards) {
    const double n = static_cast<double>(t.proposed.x_new.size(0)), k = static_cast<double>(t.rows_finite);
    const double w = k / std::max(1.0, all_finite);
    if (!skip && t.rows_finite > 0) {
      (t.loss * w).backward();
      // Each shard's weight gradients reach .grad as one sum, as they do on a rank of its own: so a
      // process training 2 shards adds S1 + S2 in the order the all-reduce of 2 ranks does.
      deferred.flush();
    }
    accept += t.accept * (n / all_rows);
    entropy += t.entropy.mean().item<double>() * (n / all_rows);
    loss += t.loss_value * w;
    t.loss = torch::Tensor();  // the graph is no longer needed
  }
  // Gradients of parameters no shard reached are zeros, so every rank reduces the same list.
  fill_missing_grads(module);
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) grads.push_back(p.grad());
  comm.all_reduce_sum(grads);
  const std::vector<double> totals = parallel::all_reduce_doubles(comm, {accept, loss, entropy, stop ? 1.0 : 0.0});
  out.rows = static_cast<int64_t>(all_rows);
  out.rows_bad = static_cast<int64_t>(counts[3]);
  out.accept = totals[0];
  out.loss = skip ? NAN : totals[1];
  out.entropy = totals[2];
  out.stop = totals[3] > 0;
  out.skipped = true;
  // Gradients clipped to total norm clip_; a non-finite norm takes no step.
  if (!skip && std::isfinite(torch::nn::utils::clip_grad_norm_(module.parameters(), clip_))) {
    optimizer_->step();
    out.skipped = false;
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

torch::Tensor advance_rows(const torch::Tensor& x, const torch::Tensor& u_x, const ObjectiveTerms& terms,
                           at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const Proposed& p = terms.proposed;
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
