// The coupling networks of the learned sampler (StepMLP): one MLP per sub-step, optionally sharing layers.
#include "nmcmc/flows/learned.hpp"

#include <cmath>
#include <functional>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/deferred_linear.hpp"

namespace nmcmc {

StepMLPImpl::StepMLPImpl(int64_t substeps, int64_t in, int64_t hidden, int64_t out, int64_t shared_layers,
                         Activation activation, bool tanh_last, LinearPolicy policy)
    : in_caches_(static_cast<size_t>(substeps)),
      shared_caches_(static_cast<size_t>(shared_layers)),
      out_caches_(static_cast<size_t>(substeps)),
      activation_(activation),
      tanh_last_(tanh_last),
      policy_(policy),
      in_(in),
      hidden_(hidden),
      out_(out) {
  // Initialised like torch.nn.Linear (uniform +-1/sqrt(fan_in)) from a fixed generator, so that a
  // model is a deterministic function of its options; output layers start at zero.
  at::Generator gen = make_generator(0x5eed0000ULL + static_cast<uint64_t>(in * 131 + out));
  const double b_in = 1.0 / std::sqrt(static_cast<double>(in));
  // Parameters are created in float64 (exact in either precision); owners move them with to().
  // Each sub-step's input and output layers are separate tensors, so that the backward pass of
  // one sub-step touches only its own weights (a [K, ...] tensor indexed per sub-step would
  // materialise a full-size zero gradient for every use).
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  for (int64_t k = 0; k < substeps; ++k) {
    const std::string n = std::to_string(k);
    w_in_.push_back(register_parameter("w_in" + n, torch::empty({in, hidden}, f64).uniform_(-b_in, b_in, gen)));
    b_in_.push_back(register_parameter("b_in" + n, torch::empty({hidden}, f64).uniform_(-b_in, b_in, gen)));
  }
  const double b_h = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (int64_t i = 0; i < shared_layers; ++i) {
    auto layer = register_module("shared" + std::to_string(i), torch::nn::Linear(hidden, hidden));
    layer->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      layer->weight.uniform_(-b_h, b_h, gen);
      layer->bias.uniform_(-b_h, b_h, gen);
    }
    shared_.push_back(layer);
  }
  for (int64_t k = 0; k < substeps; ++k) {
    const std::string n = std::to_string(k);
    w_out_.push_back(register_parameter("w_out" + n, torch::zeros({hidden, out}, f64)));
    b_out_.push_back(register_parameter("b_out" + n, torch::zeros({out}, f64)));
  }
}

torch::Tensor StepMLPImpl::activate(torch::Tensor h, bool last) const {
  // h is a fresh layer output that nothing else holds: elu, relu and tanh run in place, whose
  // backward formulas use the result (elu: grad * (out + 1) below zero, no exp; out-of-place elu's
  // backward recomputes exp(input), a measurable share of a Funnel-1 training step).
  // elu and tanh: nmcmc's vectorised kernels for float32 (Note [Fast activations]).
  return nmcmc::activate(h, last && tanh_last_ ? Activation::kTanh : activation_);
}

torch::Tensor StepMLPImpl::forward(int64_t k, const torch::Tensor& input) {
  // The parameter lists are read through their registered tensors (to() replaces their data).
  // nmcmc::linear: inside a training step's DeferredWeightGrads scope the weight gradients of all
  // uses are accumulated into one buffer per weight (Note [Deferred weight gradients]).
  // matmul: bfloat16 GEMMs where they are fast (Note [Bfloat16 matmul]).
  const Matmul m = resolve_matmul(policy_.matmul, input);
  const bool fusable_act = activation_ == Activation::kElu || activation_ == Activation::kTanh;
  if (m == Matmul::kBFloat16 && !torch::GradMode::is_enabled() && fusable_act && input.is_cpu() &&
      input.scalar_type() == torch::kFloat) {
    // Sampling: the hidden layers stay in bfloat16, each layer's bias, activation and cast in
    // one pass (bias_activate_bf16; bit for bit the path below).
    auto act = [&](bool last) {
      return last && tanh_last_ ? Activation::kTanh : activation_;
    };
    torch::Tensor hb =
        bias_activate_bf16(input.to(torch::kBFloat16).mm(bf16_weight(w_in_[k], &in_caches_[k])), b_in_[k], act(shared_.empty()));
    for (size_t i = 0; i < shared_.size(); ++i) {
      hb = bias_activate_bf16(hb.mm(bf16_weight(shared_[i]->weight, &shared_caches_[i]).t()), shared_[i]->bias,
                              act(i + 1 == shared_.size()));
    }
    return bias_add_bf16(hb.mm(bf16_weight(w_out_[k], &out_caches_[k])), b_out_[k]);
  }
  torch::Tensor h = activate(linear(input, w_in_[k], b_in_[k], false, policy_, &in_caches_[k]), shared_.empty());
  for (size_t i = 0; i < shared_.size(); ++i) {
    h = activate(linear(h, shared_[i]->weight, shared_[i]->bias, /*transposed=*/true, policy_, &shared_caches_[i]),
                 i + 1 == shared_.size());
  }
  return linear(h, w_out_[k], b_out_[k], false, policy_, &out_caches_[k]);
}

NativeStepNet StepMLPImpl::native() const {
  NativeStepNet n;
  n.in = in_;
  n.hidden = hidden_;
  n.out = out_;
  n.activation = activation_;
  n.tanh_last = tanh_last_;
  for (size_t k = 0; k < w_in_.size(); ++k) {
    n.w_in.push_back(native_rows(w_in_[k]));  // [in, H]
    n.b_in.push_back(native_rows(b_in_[k]));
    n.w_out.push_back(native_rows(w_out_[k]));  // [H, out]
    n.b_out.push_back(native_rows(b_out_[k]));
  }
  for (const auto& layer : shared_) {
    n.w_shared.push_back(native_rows(layer->weight.t()));  // torch::nn::Linear's [out, in], by input row
    n.b_shared.push_back(native_rows(layer->bias));
  }
  return n;
}

int64_t StepMLPImpl::flops_per_row() const {
  return 2 * (in_ * hidden_ + static_cast<int64_t>(shared_.size()) * hidden_ * hidden_ + hidden_ * out_);
}

// ------------------------------------------------------------------ LearnedSampler

}  // namespace nmcmc
