#pragma once
/// The learned sampler for images (paper section 4.2 and appendix): the `langevin` variant with
/// convolutional networks and a fixed checkerboard mask.
//
// Note [Convolutional sampler]
// x is a batch of flattened images [B, D], D = C*H*W. The proposal is
//   x' = x + eps z + mu(x),   mu(x) = -(eps^2/2) dU(x) exp(S_d(x)) + eps T_d(x),   z = f(z0; x),
// with f a conditional RealNVP of N update steps: step n updates the pixels off the checkerboard
// m (conditioned on x and z*m), then those on it (conditioned on x and z*(1-m)). Each of the 2N
// coupling sub-steps has its own convnet NN_k(x, z_c) -> (S, T) (3x3 convolutions, `layers`
// layers of `filters` channels, ELU, tanh before the output layer), and
//   z_u <- z_u exp(S) - eps' T,  eps' = eps / (2N),  log|dz/dz0| = sum S.
// The drift net (same shape, input x) gives S_d, T_d. Deviation from the paper's formula, which
// adds T_d(x) unscaled: we measure T_d in units of eps. Same family of proposals, but Adam's
// first steps move every weight by ~lr, which makes an unscaled T_d of order 1e-3 per pixel: with
// eps = 0.01 in 784 dimensions that alone drives the accept rate to ~0 (measured: 0.5 -> 4e-6
// after one step); scaled by eps it costs nothing. All output layers start at zero, so the
// untrained sampler is MALA with step eps. One target gradient per MH step: dU(x) rides in the
// chain state, dU(x') is needed for the reverse density.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <vector>

#include "nmcmc/flows/learned.hpp"
#include "nmcmc/flows/model.hpp"

namespace nmcmc {

struct ConvSamplerOptions {
  int64_t channels = 1, height = 28, width = 28;
  int64_t filters = 64;  // channels of the hidden convolutions
  int64_t layers = 4;    // convolutions per network (>= 2)
  int64_t steps = 4;     // N update steps (2N coupling sub-steps)
  double eps = 0.01;     // initial step size (learned, stored as log eps)
  int64_t dim() const { return channels * height * width; }
  nlohmann::json to_json() const;
  static ConvSamplerOptions from_json(const nlohmann::json& j);  // throws UsageError
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ConvSamplerOptions, channels, height, width, filters, layers, steps, eps)

/// A plain convnet: 3x3 convolutions (padding 1), ELU between them, tanh after the last hidden
/// layer, zero-initialised output layer. [B, in, H, W] -> [B, out, H, W].
class CouplingConvNetImpl : public torch::nn::Module {
 public:
  CouplingConvNetImpl(int64_t in, int64_t filters, int64_t out, int64_t layers, uint64_t seed);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  std::vector<torch::nn::Conv2d> convs_;
};
TORCH_MODULE(CouplingConvNet);

class ConvSamplerImpl : public torch::nn::Module, public ProposalModel {
 public:
  explicit ConvSamplerImpl(const ConvSamplerOptions& options);
  const ConvSamplerOptions& options() const { return options_; }
  torch::nn::Module& module() override { return *this; }
  nlohmann::json options_json() const override { return options_.to_json(); }

  int64_t dim() const override { return options_.dim(); }
  torch::Tensor log_eps() const override { return log_eps_; }
  bool needs_grad() const override { return true; }
  int64_t grads_per_step() const override { return 1; }
  Proposed propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad, at::Generator& gen,
                   bool create_graph) override;
  torch::Tensor log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                            const torch::Tensor& x_to) override;

  /// z = f(z0; x) and log|dz/dz0| (x, z0 flat [B, D]).
  FlowPass forward_flow(const torch::Tensor& x, const torch::Tensor& z0);
  /// z0 = f^{-1}(z; x) and log|dz/dz0| at that z0.
  FlowPass inverse_flow(const torch::Tensor& x, const torch::Tensor& z);
  /// mu(x) given dU(x), flat [B, D].
  torch::Tensor drift(const torch::Tensor& x, const torch::Tensor& grad);
  /// The checkerboard [1, C, H, W] (1 on pixels with even row + column).
  torch::Tensor mask() const { return mask_; }

 private:
  torch::Tensor image(const torch::Tensor& flat) const;
  std::pair<torch::Tensor, torch::Tensor> coupling(int64_t k, const torch::Tensor& xi, const torch::Tensor& zi);

  ConvSamplerOptions options_;
  torch::Tensor log_eps_, mask_;
  std::vector<CouplingConvNet> nets_;
  CouplingConvNet drift_{nullptr};
};
TORCH_MODULE(ConvSampler);

}  // namespace nmcmc
