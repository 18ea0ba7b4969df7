#include "nmcmc/images/conv_sampler.hpp"

#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/io/config.hpp"

namespace nmcmc {

nlohmann::json ConvSamplerOptions::to_json() const { return nlohmann::json(*this); }

ConvSamplerOptions ConvSamplerOptions::from_json(const nlohmann::json& j) {
  ConvSamplerOptions o = options_from_json<ConvSamplerOptions>(j, "sampler options");
  if (o.channels < 1 || o.height < 2 || o.width < 2) throw UsageError("sampler: image shape must be at least 1x2x2");
  if (o.filters < 1 || o.layers < 2 || o.steps < 1) throw UsageError("sampler: need filters >= 1, layers >= 2, steps >= 1");
  if (!(o.eps > 0) || !std::isfinite(o.eps)) throw UsageError("sampler: eps must be positive");
  return o;
}

CouplingConvNetImpl::CouplingConvNetImpl(int64_t in, int64_t filters, int64_t out, int64_t layers, uint64_t seed) {
  at::Generator gen = make_generator(seed);
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t cin = i == 0 ? in : filters, cout = i + 1 == layers ? out : filters;
    auto conv = register_module("conv" + std::to_string(i),
                                torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 3).padding(1)));
    conv->to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    if (i + 1 == layers) {
      conv->weight.zero_();
      conv->bias.zero_();
    } else {
      const double b = 1.0 / std::sqrt(static_cast<double>(cin * 9));  // torch's default bound, seeded
      conv->weight.uniform_(-b, b, gen);
      conv->bias.uniform_(-b, b, gen);
    }
    convs_.push_back(conv);
  }
}

torch::Tensor CouplingConvNetImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (size_t i = 0; i + 1 < convs_.size(); ++i) {
    h = convs_[i]->forward(h);
    h = i + 2 == convs_.size() ? torch::tanh(h) : torch::elu(h);
  }
  return convs_.back()->forward(h);
}

ConvSamplerImpl::ConvSamplerImpl(const ConvSamplerOptions& o) : options_(o) {
  const int64_t c = o.channels;
  log_eps_ = register_parameter("log_eps", torch::tensor(std::log(o.eps), torch::kFloat64));
  torch::Tensor rows = torch::arange(o.height, torch::kInt64).view({o.height, 1});
  torch::Tensor cols = torch::arange(o.width, torch::kInt64).view({1, o.width});
  torch::Tensor board = ((rows + cols) % 2 == 0).to(torch::kFloat64);
  mask_ = register_buffer("mask", board.expand({1, c, o.height, o.width}).contiguous());
  for (int64_t k = 0; k < 2 * o.steps; ++k) {
    nets_.push_back(register_module("net" + std::to_string(k),
                                    CouplingConvNet(2 * c, o.filters, 2 * c, o.layers, 0xc0de0000ULL + k)));
  }
  drift_ = register_module("drift", CouplingConvNet(c, o.filters, 2 * c, o.layers, 0xd71f7000ULL));
}

torch::Tensor ConvSamplerImpl::image(const torch::Tensor& flat) const {
  return flat.reshape({flat.size(0), options_.channels, options_.height, options_.width});
}

std::pair<torch::Tensor, torch::Tensor> ConvSamplerImpl::coupling(int64_t k, const torch::Tensor& xi,
                                                                  const torch::Tensor& zi) {
  // Even sub-steps update the pixels off the board (conditioned on those on it), odd ones the rest.
  const torch::Tensor upd = k % 2 == 0 ? 1.0 - mask_ : mask_;
  const torch::Tensor cond = 1.0 - upd;
  torch::Tensor out = nets_[static_cast<size_t>(k)]->forward(torch::cat({xi, zi * cond}, 1));
  const int64_t c = options_.channels;
  return {out.narrow(1, 0, c) * upd, out.narrow(1, c, c) * upd};
}

FlowPass ConvSamplerImpl::forward_flow(const torch::Tensor& x, const torch::Tensor& z0) {
  const torch::Tensor eps_sub = log_eps_.exp() / static_cast<double>(2 * options_.steps);
  torch::Tensor xi = image(x), z = image(z0);
  torch::Tensor log_det = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat64));
  for (int64_t k = 0; k < 2 * options_.steps; ++k) {
    auto [s, t] = coupling(k, xi, z);
    z = z * torch::exp(s) - eps_sub * t;
    log_det = log_det + s.sum({1, 2, 3}).to(torch::kFloat64);
  }
  return {z.reshape({x.size(0), -1}), log_det};
}

FlowPass ConvSamplerImpl::inverse_flow(const torch::Tensor& x, const torch::Tensor& z_in) {
  const torch::Tensor eps_sub = log_eps_.exp() / static_cast<double>(2 * options_.steps);
  torch::Tensor xi = image(x), z = image(z_in);
  torch::Tensor log_det = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat64));
  for (int64_t k = 2 * options_.steps - 1; k >= 0; --k) {
    auto [s, t] = coupling(k, xi, z);
    z = (z + eps_sub * t) * torch::exp(-s);
    log_det = log_det + s.sum({1, 2, 3}).to(torch::kFloat64);
  }
  return {z.reshape({x.size(0), -1}), log_det};
}

torch::Tensor ConvSamplerImpl::drift(const torch::Tensor& x, const torch::Tensor& grad) {
  const int64_t c = options_.channels;
  torch::Tensor out = drift_->forward(image(x));
  torch::Tensor eps = log_eps_.exp();
  torch::Tensor mu = -0.5 * eps * eps * image(grad) * torch::exp(out.narrow(1, 0, c)) + eps * out.narrow(1, c, c);
  return mu.reshape({x.size(0), -1});
}

Proposed ConvSamplerImpl::propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad,
                                  at::Generator& gen, bool create_graph) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim(), "conv sampler: expected x [B, ", dim(), "], got ", x.sizes());
  TORCH_CHECK(grad.defined(), "the convolutional sampler needs dU(x)");
  torch::Tensor z0 = randn(x.sizes(), gen, x.options());
  torch::Tensor eps = log_eps_.exp();
  const torch::Tensor d_log_eps = static_cast<double>(dim()) * log_eps_.to(torch::kFloat64);
  Proposed p;
  FlowPass fwd = forward_flow(x, z0);
  p.x_new = x + eps * fwd.z + drift(x, grad);
  auto eg = target.energy_and_grad(p.x_new, create_graph);
  p.energy_new = eg.energy;
  p.grad_new = eg.grad;
  FlowPass rev = inverse_flow(p.x_new, (x - p.x_new - drift(p.x_new, eg.grad)) / eps);
  set_flow_densities(p, z0, fwd, rev, d_log_eps);
  return p;
}

torch::Tensor ConvSamplerImpl::log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                                           const torch::Tensor& x_to) {
  torch::Tensor eps = log_eps_.exp();
  FlowPass inv = inverse_flow(x_from, (x_to - x_from - drift(x_from, grad_from)) / eps);
  return flow_log_density(inv.z, inv.log_det, static_cast<double>(dim()) * log_eps_.to(torch::kFloat64));
}

}  // namespace nmcmc
