#include "nmcmc/images/energy_net.hpp"

#include <cmath>

#include "nmcmc/core/random.hpp"

namespace nmcmc {

EnergyNetImpl::EnergyNetImpl(int64_t channels, int64_t height, int64_t width, int64_t filters, uint64_t seed) {
  TORCH_CHECK(height >= 4 && width >= 4, "the energy network needs images of at least 4x4");
  namespace nn = torch::nn;
  const int64_t f = filters;
  // (in, out, kernel, stride, padding); the last kernel spans what the two strides leave.
  const int64_t h = height / 4, w = width / 4;
  std::vector<nn::Conv2dOptions> specs = {
      nn::Conv2dOptions(channels, f, 3).padding(1), nn::Conv2dOptions(f, f, 4).stride(2).padding(1),
      nn::Conv2dOptions(f, f, 3).padding(1),        nn::Conv2dOptions(f, f, 4).stride(2).padding(1),
      nn::Conv2dOptions(f, f, 3).padding(1),        nn::Conv2dOptions(f, 1, std::vector<int64_t>{h, w})};
  at::Generator gen = make_generator(seed);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto conv = register_module("conv" + std::to_string(i), nn::Conv2d(specs[i]));
    conv->to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    const double fan_in = static_cast<double>(conv->weight[0].numel());
    const double b = 1.0 / std::sqrt(fan_in);
    conv->weight.uniform_(-b, b, gen);
    conv->bias.uniform_(-b, b, gen);
    convs_.push_back(conv);
  }
}

torch::Tensor EnergyNetImpl::forward(const torch::Tensor& images) {
  torch::Tensor h = images;
  for (size_t i = 0; i + 1 < convs_.size(); ++i) h = torch::elu(convs_[i]->forward(h));
  return convs_.back()->forward(h).reshape({images.size(0), -1}).sum(1);
}

EbmTarget::EbmTarget(EnergyNet net, int64_t channels, int64_t height, int64_t width, torch::TensorOptions options,
                     double wall, double bound)
    : Target(options), net_(std::move(net)), c_(channels), h_(height), w_(width), wall_(wall), bound_(bound) {}

torch::Tensor EbmTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor e = const_cast<EnergyNet&>(net_)->forward(x.reshape({x.size(0), c_, h_, w_}));
  if (wall_ > 0) e = e + wall_ * torch::relu(x.abs() - bound_).pow(2).sum(1);
  return e;
}

}  // namespace nmcmc
