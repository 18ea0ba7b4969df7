#pragma once
/// What every learned proposal model provides, whatever its networks (MLP or convolutional):
/// the interface the MH wrapper, the entropy objective, the trainers and the EBM loop use.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// Everything one proposal produces, for sampling and training alike.
struct Proposed {
  torch::Tensor x_new;        // [C, D]
  torch::Tensor energy_new;   // [C] (target dtype; differentiable when training)
  torch::Tensor grad_new;     // [C, D] when the model carries dU in the chain state, else undefined
  torch::Tensor log_q_fwd;    // [C] log q(x'|x), without the common -D/2 log(2 pi)
  torch::Tensor log_q_rev;    // [C] log q(x|x')
  torch::Tensor log_det;      // [C] log|dz/dz0| of the forward pass (log_q_fwd holds its negative)
  torch::Tensor log_det_rev;  // [C] the same of the reverse pass (log_q_rev holds its negative)
  torch::Tensor z0_rev;       // [C, D] the reverse move's base draw (flow models; undefined otherwise)
};

/// Result of a pass through a flow. z [C, D]; log_det [C] float64 (sum of the S terms).
struct FlowPass {
  torch::Tensor z;
  torch::Tensor log_det;
};

/// log q of a flow proposal from its base draw: -|z_base|^2 / 2 - log|dz/dz0| - D log eps, [C]
/// float64, without the common -D/2 log(2 pi). d_log_eps = D log eps.
torch::Tensor flow_log_density(const torch::Tensor& z_base, const torch::Tensor& log_det, const torch::Tensor& d_log_eps);
/// Sets p.log_det, p.log_det_rev, p.log_q_fwd (base draw z0, forward pass fwd) and p.log_q_rev
/// (inverse pass rev).
void set_flow_densities(Proposed& p, const torch::Tensor& z0, const FlowPass& fwd, const FlowPass& rev,
                        const torch::Tensor& d_log_eps);

/// A proposal x' = x + eps z (+ drift) with a tractable density in both directions.
/// Implementations are torch modules (module() returns the object itself), so one trainer
/// (training/proposal_trainer.hpp) optimises, saves and loads any of them.
class ProposalModel {
 public:
  virtual ~ProposalModel() = default;
  /// The module that owns the parameters (this object).
  virtual torch::nn::Module& module() = 0;
  /// The hyper-parameters that rebuild the model (stored in checkpoints).
  virtual nlohmann::json options_json() const = 0;
  /// Dimension D of x.
  virtual int64_t dim() const = 0;
  /// log eps (a scalar parameter).
  virtual torch::Tensor log_eps() const = 0;
  torch::Tensor eps() const { return log_eps().exp(); }
  /// Whether the chain state must carry dU(x) (Langevin-type models).
  virtual bool needs_grad() const = 0;
  /// Target gradient evaluations per MH step and chain.
  virtual int64_t grads_per_step() const = 0;
  /// Draws z0 from gen and builds x' with both densities. `grad` is dU(x) when needs_grad().
  virtual Proposed propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad, at::Generator& gen,
                           bool create_graph) = 0;
  /// log q(x_to | x_from) by the inverse pass. `grad_from` is dU(x_from) when needs_grad().
  virtual torch::Tensor log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                                    const torch::Tensor& x_to) = 0;
};

/// A model's proposal as an MH proposal: the proposed state and log q(x|x') - log q(x'|x).
ProposalResult as_proposal_result(const Proposed& p);

/// Any ProposalModel as an uncalibrated proposal for MetropolisHastings (no autograd graphs
/// beyond the target gradients it needs).
class ModelProposal : public Proposal {
 public:
  ModelProposal(std::shared_ptr<ProposalModel> model, std::string name)
      : model_(std::move(model)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  bool uses_grad() const override { return model_->needs_grad(); }
  ProposalResult propose(Target& target, const ChainState& state, at::Generator& gen) override;
  double step_size() const override { return model_->eps().item<double>(); }
  ProposalModel& model() { return *model_; }

 private:
  std::shared_ptr<ProposalModel> model_;
  std::string name_;
};

}  // namespace nmcmc
