#pragma once
/// The energy network of the image EBM (paper section 4.2) and the target it defines.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <vector>

#include "nmcmc/core/target.hpp"

namespace nmcmc {

/// The energy: six convolutions with ELU (3x3, 4x4 stride 2, 3x3, 4x4 stride 2, 3x3, and one
/// spanning the remaining map), `filters` channels. [B, C, H, W] -> [B].
class EnergyNetImpl : public torch::nn::Module {
 public:
  EnergyNetImpl(int64_t channels, int64_t height, int64_t width, int64_t filters, uint64_t seed);
  torch::Tensor forward(const torch::Tensor& images);

 private:
  std::vector<torch::nn::Conv2d> convs_;
};
TORCH_MODULE(EnergyNet);

/// U(x) = EnergyNet(x) on flattened logit-space images [B, C*H*W].
/// With wall > 0 a fixed term wall * sum_i relu(|x_i| - bound)^2 keeps samples inside the logit
/// range of the data, [-bound, bound] (bound = logit(1 - alpha)); it has no parameters.
class EbmTarget : public Target {
 public:
  EbmTarget(EnergyNet net, int64_t channels, int64_t height, int64_t width, torch::TensorOptions options,
            double wall = 0.0, double bound = 0.0);
  std::string name() const override { return "ebm"; }
  int64_t dim() const override { return c_ * h_ * w_; }
  nlohmann::json spec() const override { return {{"name", "ebm"}, {"channels", c_}, {"height", h_}, {"width", w_}}; }
  EnergyNet& net() { return net_; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override;

 private:
  EnergyNet net_;
  int64_t c_, h_, w_;
  double wall_, bound_;
};

}  // namespace nmcmc
