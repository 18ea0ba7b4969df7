#include "nmcmc/training/fused_adam.hpp"

#include <cmath>

#include <torch/csrc/autograd/variable.h>

namespace nmcmc {

namespace {

bool fusable(const torch::Tensor& p, const torch::Tensor& g) {
  return p.device().is_cpu() && g.device().is_cpu() && p.is_contiguous() && g.is_contiguous() &&
         p.scalar_type() == g.scalar_type() && (p.scalar_type() == torch::kFloat || p.scalar_type() == torch::kDouble) &&
         !g.is_sparse() && p.numel() == g.numel();
}

/// One Adam update of n elements: the operations of torch::optim::Adam::step per element.
template <typename T>
void adam_update(T* p, const T* g, T* m, T* v, int64_t n, double beta1, double beta2, double eps, double step_size,
                 double bias_correction2) {
  const T b1 = static_cast<T>(beta1), c1 = static_cast<T>(1 - beta1);
  const T b2 = static_cast<T>(beta2), c2 = static_cast<T>(1 - beta2);
  const T root = static_cast<T>(std::sqrt(bias_correction2)), e = static_cast<T>(eps);
  const T s = static_cast<T>(-step_size);
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = m[i] * b1 + c1 * gi;
    const T vi = v[i] * b2 + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / root + e;
    p[i] = p[i] + s * (mi / denom);
  }
}

}  // namespace

torch::Tensor FusedAdam::step(LossClosure closure) {
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    if (o.amsgrad() || o.weight_decay() != 0) return torch::optim::Adam::step(std::move(closure));
    for (auto& p : group.params()) {
      if (p.grad().defined() && !fusable(p, p.grad())) return torch::optim::Adam::step(std::move(closure));
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
      const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
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
                           beta1, beta2, o.eps(), step_size, bias_correction2);
      } else {
        adam_update<double>(p.data_ptr<double>(), g.data_ptr<double>(), m.data_ptr<double>(), v.data_ptr<double>(),
                            p.numel(), beta1, beta2, o.eps(), step_size, bias_correction2);
      }
      torch::autograd::impl::bump_version(p);  // as an in-place op would: stale saved tensors are caught
    }
  }
  return loss;
}

}  // namespace nmcmc
