#include "nmcmc/nn/activations.hpp"

#include "nmcmc/core/target_clones.hpp"

#include <ATen/Parallel.h>

#include <cstdint>
#include <algorithm>
#include <cstring>

namespace nmcmc {

namespace {

/// expm1(y) for y in [-87, 88]: y = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, the first
/// exact in float), exp(r) - 1 = r + r^2 q(r) with q the degree-5 Taylor polynomial of
/// (exp(r) - 1 - r) / r^2 (truncation below 1e-8 relative), then 2^n (1 + p) - 1 = 2^n p + (2^n - 1),
/// which is p itself when n = 0 (no cancellation near zero).
inline float expm1_core(float y) {
  const float n = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = y - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  float q = 1.98412698412698e-4f;  // 1/5040
  q = q * r + 1.38888888888889e-3f;
  q = q * r + 8.33333333333333e-3f;
  q = q * r + 4.16666666666667e-2f;
  q = q * r + 1.66666666666667e-1f;
  q = q * r + 0.5f;
  const float p = r + r * r * q;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale * p + (scale - 1.0f);
}

inline float elu1(float x) {
  float y = x < 0.0f ? x : 0.0f;
  y = y > -87.0f ? y : -87.0f;
  const float e = expm1_core(y);
  return x <= 0.0f ? e : x;  // NaN and +inf pass through
}

inline float tanh1(float x) {
  float a = x < 0.0f ? -x : x;
  a = a < 9.0f ? a : 9.0f;  // tanh(9) is 1 in float
  const float e = expm1_core(2.0f * a);
  const float t = e / (e + 2.0f);
  const float s = x < 0.0f ? -t : t;
  return x != x ? x : s;  // NaN passes through
}

NMCMC_CLONES void elu_loop(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = elu1(in[i]);
}

NMCMC_CLONES void tanh_loop(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = tanh1(in[i]);
}

inline float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t to_bf16(float f) {  // round to nearest even, as c10::BFloat16; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7FC0U : rounded);
}

/// One row: out = bf16(act(float(y) + bias)), or float(y) + bias.
NMCMC_CLONES void bias_elu_bf16_loop(const uint16_t* y, const float* bias, uint16_t* out, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) out[j] = to_bf16(elu1(from_bf16(y[j]) + bias[j]));
}

NMCMC_CLONES void bias_tanh_bf16_loop(const uint16_t* y, const float* bias, uint16_t* out, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) out[j] = to_bf16(tanh1(from_bf16(y[j]) + bias[j]));
}

NMCMC_CLONES void bias_add_bf16_loop(const uint16_t* y, const float* bias, float* out, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) out[j] = from_bf16(y[j]) + bias[j];
}

/// Runs `row(y_row, bias, out_row, cols)` over the rows of y [C, H] (bfloat16), split over threads.
template <typename Out, typename Row>
void for_rows(const torch::Tensor& y, const torch::Tensor& bias, const torch::Tensor& out, Row row) {
  const int64_t cols = y.size(1);
  const auto* src = reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* bb = bias.data_ptr<float>();
  Out* dst = reinterpret_cast<Out*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, y.size(0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(src + r * cols, bb, dst + r * cols, cols);
  });
}

void run(const torch::Tensor& in, const torch::Tensor& out, Activation a) {
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), 32768, [&](int64_t begin, int64_t end) {
    if (a == Activation::kElu) {
      elu_loop(src + begin, dst + begin, end - begin);
    } else {
      tanh_loop(src + begin, dst + begin, end - begin);
    }
  });
}

bool fast_path(const torch::Tensor& h) {
  return h.is_cpu() && h.scalar_type() == torch::kFloat && h.is_contiguous() && h.layout() == torch::kStrided;
}

struct ActivationFn : public torch::autograd::Function<ActivationFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h, int64_t kind) {
    torch::Tensor out = torch::empty_like(h);
    run(h, out, static_cast<Activation>(kind));
    ctx->saved_data["kind"] = kind;
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor out = ctx->get_saved_variables()[0];
    const auto kind = static_cast<Activation>(ctx->saved_data["kind"].toInt());
    torch::Tensor g = kind == Activation::kElu ? at::elu_backward(grads[0], 1.0, 1.0, 1.0, /*is_result=*/true, out)
                                               : at::tanh_backward(grads[0], out);
    return {g, torch::Tensor()};
  }
};

}  // namespace

void elu_kernel(const float* in, float* out, int64_t n) { elu_loop(in, out, n); }
void tanh_kernel(const float* in, float* out, int64_t n) { tanh_loop(in, out, n); }

torch::Tensor bias_activate_bf16(const torch::Tensor& y, const torch::Tensor& bias, Activation a) {
  TORCH_CHECK(y.is_cpu() && y.scalar_type() == torch::kBFloat16 && y.dim() == 2 && y.is_contiguous(),
              "bias_activate_bf16: y must be a contiguous bfloat16 CPU matrix");
  TORCH_CHECK(bias.is_cpu() && bias.scalar_type() == torch::kFloat && bias.dim() == 1 && bias.size(0) == y.size(1),
              "bias_activate_bf16: bias must be float32 [", y.size(1), "]");
  TORCH_CHECK(!(torch::GradMode::is_enabled() && (y.requires_grad() || bias.requires_grad())),
              "bias_activate_bf16: no gradients (sampling only)");
  TORCH_CHECK(a == Activation::kElu || a == Activation::kTanh, "bias_activate_bf16: elu or tanh only");
  const torch::Tensor b = bias.contiguous();
  torch::Tensor out = torch::empty_like(y);
  if (a == Activation::kElu) {
    for_rows<uint16_t>(y, b, out, bias_elu_bf16_loop);
  } else {
    for_rows<uint16_t>(y, b, out, bias_tanh_bf16_loop);
  }
  return out;
}

torch::Tensor bias_add_bf16(const torch::Tensor& y, const torch::Tensor& bias) {
  const bool fast = y.is_cpu() && y.scalar_type() == torch::kBFloat16 && y.dim() == 2 && y.is_contiguous() &&
                    bias.is_cpu() && bias.scalar_type() == torch::kFloat && bias.dim() == 1 && bias.size(0) == y.size(1);
  if (!fast) return torch::add(y, bias);
  torch::NoGradGuard no_grad;
  const torch::Tensor b = bias.contiguous();
  torch::Tensor out = torch::empty(y.sizes(), b.options());
  for_rows<float>(y, b, out, bias_add_bf16_loop);
  return out;
}

torch::Tensor activate(torch::Tensor h, Activation a) {
  // relu runs in place (its backward formula uses the result); softplus and silu out of place.
  switch (a) {
    case Activation::kRelu: return h.relu_();
    case Activation::kSoftplus: return torch::softplus(h);
    case Activation::kSilu: return torch::silu(h);
    case Activation::kElu:
    case Activation::kTanh: break;
  }
  if (!fast_path(h)) return a == Activation::kElu ? torch::elu_(h) : h.tanh_();
  if (torch::GradMode::is_enabled() && h.requires_grad()) {
    return ActivationFn::apply(h, static_cast<int64_t>(a));
  }
  run(h, h, a);
  return h;
}

}  // namespace nmcmc
