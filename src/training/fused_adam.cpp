#include "nmcmc/training/fused_adam.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <sstream>

#include <torch/csrc/autograd/variable.h>

namespace nmcmc {

namespace {
/// The key of a parameter's optimiser state, as LibTorch's own optimisers write it: its
/// TensorImpl's address (LibTorch 2), or that address printed (LibTorch 1.x).
template <typename StateMap>
typename StateMap::key_type state_key(const StateMap&, const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}
}  // namespace

namespace {

bool fusable(const torch::Tensor& p, const torch::Tensor& g) {
  return p.device().is_cpu() && g.device().is_cpu() && p.is_contiguous() && g.is_contiguous() &&
         p.scalar_type() == g.scalar_type() && (p.scalar_type() == torch::kFloat || p.scalar_type() == torch::kDouble) &&
         !g.is_sparse() && p.numel() == g.numel();
}

/// One Adam update of n elements: the operations of torch::optim::Adam::step per element.
template <typename T>
void adam_update(T* p, const T* g, T* m, T* v, int64_t n, double beta1, double beta2, double eps, double step_size,
                 double bias_correction2, double grad_scale) {
  const T b1 = static_cast<T>(beta1), c1 = static_cast<T>(1 - beta1);
  const T b2 = static_cast<T>(beta2), c2 = static_cast<T>(1 - beta2);
  const T root = static_cast<T>(std::sqrt(bias_correction2)), e = static_cast<T>(eps);
  const T s = static_cast<T>(-step_size);
  const T scale = static_cast<T>(grad_scale);
  const bool scaled = grad_scale != 1.0;
  for (int64_t i = 0; i < n; ++i) {
    const T gi = scaled ? g[i] * scale : g[i];
    const T mi = m[i] * b1 + c1 * gi;
    const T vi = v[i] * b2 + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / root + e;
    p[i] = p[i] + s * (mi / denom);
  }
}

template <typename T>
double sum_of_squares(const T* g, int64_t n) {
  double total = 0;
  constexpr int64_t kBlock = 256;  // float sums within a block (vectorised), float64 across blocks
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t end = std::min(n, i + kBlock);
    T block = 0;
    for (int64_t j = i; j < end; ++j) block += g[j] * g[j];
    total += static_cast<double>(block);
  }
  return total;
}

}  // namespace

double total_grad_norm(const std::vector<torch::Tensor>& params) {
  double total = 0;
  for (const auto& p : params) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const bool plain = g.device().is_cpu() && g.is_contiguous() && !g.is_sparse();
    if (plain && g.scalar_type() == torch::kFloat) {
      total += sum_of_squares<float>(g.data_ptr<float>(), g.numel());
    } else if (plain && g.scalar_type() == torch::kDouble) {
      total += sum_of_squares<double>(g.data_ptr<double>(), g.numel());
    } else {
      total += g.detach().to(torch::kFloat64).pow(2).sum().item<double>();
    }
  }
  return std::sqrt(total);
}

double FusedAdam::clip_and_step(double max_norm, double pre_scale) {
  std::vector<torch::Tensor> params;
  for (auto& group : param_groups_) params.insert(params.end(), group.params().begin(), group.params().end());
  const double norm = pre_scale * total_grad_norm(params);
  if (!std::isfinite(norm)) return norm;
  struct Reset {  // the scale holds for this step only, also when it throws
    double& scale;
    ~Reset() { scale = 1.0; }
  } reset{grad_scale_};
  grad_scale_ = pre_scale * std::min(1.0, max_norm / (norm + 1e-6));
  step();
  return norm;
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    bool fused = fused_ && !o.amsgrad() && o.weight_decay() == 0;
    for (auto& p : group.params()) fused = fused && (!p.grad().defined() || fusable(p, p.grad()));
    if (!fused) {  // torch's Adam, on gradients scaled in place
      if (grad_scale_ != 1.0) {
        torch::NoGradGuard no_grad;
        for (auto& g : param_groups_) {
          for (auto& p : g.params()) {
            if (p.grad().defined()) p.mutable_grad().mul_(grad_scale_);
          }
        }
      }
      return torch::optim::Adam::step(std::move(closure));
    }
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = state_key(state_, p);
      auto it = state_.find(key);
      if (it == state_.end()) {  // as torch's Adam initialises its state
        auto fresh = std::make_unique<torch::optim::AdamParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
      torch::Tensor& m = st.exp_avg();
      torch::Tensor& v = st.exp_avg_sq();
      TORCH_CHECK(m.is_contiguous() && v.is_contiguous() && m.scalar_type() == p.scalar_type() &&
                      v.scalar_type() == p.scalar_type(),
                  "FusedAdam: an optimiser state that does not match its parameter");
      st.step(st.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(st.step()));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(st.step()));
      const double step_size = o.lr() / bias_correction1;
      const torch::Tensor g = p.grad();
      if (p.scalar_type() == torch::kFloat) {
        adam_update<float>(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(),
                           beta1, beta2, o.eps(), step_size, bias_correction2, grad_scale_);
      } else {
        adam_update<double>(p.data_ptr<double>(), g.data_ptr<double>(), m.data_ptr<double>(), v.data_ptr<double>(),
                            p.numel(), beta1, beta2, o.eps(), step_size, bias_correction2, grad_scale_);
      }
      torch::autograd::impl::bump_version(p);  // as an in-place op would: stale saved tensors are caught
    }
  }
  return loss;
}

}  // namespace nmcmc
