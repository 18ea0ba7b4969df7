#include "nmcmc/training/proposal_trainer.hpp"

#include <algorithm>
#include <cmath>

namespace nmcmc {

BetaController::BetaController(double beta, double beta_min, double beta_max, double rho, double accept_target)
    : beta_(beta), beta_min_(beta_min), beta_max_(beta_max), rho_(rho), accept_target_(accept_target) {
  TORCH_CHECK(beta_min > 0 && beta_min <= beta && beta <= beta_max, "need 0 < beta_min <= beta <= beta_max");
}

double BetaController::update(double accept) {
  beta_ = std::clamp(beta_ * (1.0 + rho_ * (accept - accept_target_)), beta_min_, beta_max_);
  return beta_;
}

ProposalTrainer::ProposalTrainer(std::shared_ptr<ProposalModel> model, const torch::optim::AdamOptions& adam,
                                 BetaController beta, double clip)
    : model_(std::move(model)), beta_(beta), clip_(clip) {
  TORCH_CHECK(model_, "ProposalTrainer needs a model");
  optimizer_ = std::make_unique<torch::optim::Adam>(model_->module().parameters(), adam);
}

void ProposalTrainer::set_learning_rate(double lr) {
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

ProposalStep ProposalTrainer::step(Target& target, const torch::Tensor& x, const torch::Tensor& u_x,
                                   const torch::Tensor& grad_x, at::Generator& gen, bool create_graph) {
  torch::nn::Module& module = model_->module();
  module.train();
  optimizer_->zero_grad();
  ProposalStep out;
  out.terms = entropy_objective(target, *model_, x, u_x, grad_x, beta_.value(), gen, create_graph);
  out.skipped = true;
  if (std::isfinite(out.terms.loss_value)) {
    out.terms.loss.backward();
    const double norm = torch::nn::utils::clip_grad_norm_(module.parameters(), clip_);
    if (std::isfinite(norm)) {
      optimizer_->step();
      out.skipped = false;
    }
  }
  optimizer_->zero_grad();

  beta_.update(out.terms.accept);
  return out;
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
