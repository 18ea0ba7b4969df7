#include "nmcmc/flows/deferred_linear.hpp"

#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nmcmc {

struct DeferredWeightGrads::Impl {
  struct Entry {
    torch::Tensor weight, bias;
    bool transposed = false;
    torch::Tensor weight_sum, bias_sum;  // accumulated by the backward passes
  };
  int64_t id = 0;
  mutable std::mutex mutex;
  std::vector<Entry> entries;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
};

namespace {

using Impl = DeferredWeightGrads::Impl;

// A scope is opened on one thread (the data-parallel tests run ranks as threads of one process,
// each with its own scope) and found by id in the backward pass, which may run on another thread
// (the autograd engine's device threads).
thread_local std::shared_ptr<Impl> t_active;  // this thread's open scope, if any
std::mutex g_mutex;
std::unordered_map<int64_t, std::weak_ptr<Impl>> g_scopes;  // open scopes by id
int64_t g_next_id = 1;

std::shared_ptr<Impl> scope_with_id(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_scopes.find(id);
  return it == g_scopes.end() ? nullptr : it->second.lock();
}

/// The weight's gradient from input x and output gradient g.
torch::Tensor weight_grad(const torch::Tensor& x, const torch::Tensor& g, bool transposed) {
  return transposed ? g.t().mm(x) : x.t().mm(g);
}

void add_to_grad(const torch::Tensor& param, const torch::Tensor& g) {
  torch::Tensor p = param;  // shares the parameter's autograd metadata
  if (!p.grad().defined()) {
    p.mutable_grad() = g;
  } else {
    p.mutable_grad().add_(g);
  }
}

struct DeferredLinearFn : public torch::autograd::Function<DeferredLinearFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool transposed,
                               int64_t scope, int64_t entry) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["scope"] = scope;
    ctx->saved_data["entry"] = entry;
    return torch::addmm(bias, input, transposed ? weight.t() : weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& g = grads[0];
    const bool transposed = ctx->saved_data["transposed"].toBool();
    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) grad_input = transposed ? g.mm(weight) : g.mm(weight.t());
    std::shared_ptr<Impl> scope = scope_with_id(ctx->saved_data["scope"].toInt());
    if (!scope) {  // the scope has ended: ordinary gradients
      torch::Tensor gw = ctx->needs_input_grad(1) ? weight_grad(input, g, transposed) : torch::Tensor();
      torch::Tensor gb = ctx->needs_input_grad(2) ? g.sum(0) : torch::Tensor();
      return {grad_input, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    if (torch::GradMode::is_enabled()) {
      throw std::logic_error(
          "deferred weight gradients are first order only: no backward pass with create_graph inside a "
          "DeferredWeightGrads scope");
    }
    std::lock_guard<std::mutex> lock(scope->mutex);
    Impl::Entry& e = scope->entries.at(static_cast<size_t>(ctx->saved_data["entry"].toInt()));
    if (!e.weight_sum.defined()) {
      e.weight_sum = weight_grad(input, g, transposed);
      e.bias_sum = g.sum(0);
    } else {
      if (transposed) {
        e.weight_sum.addmm_(g.t(), input);
      } else {
        e.weight_sum.addmm_(input.t(), g);
      }
      e.bias_sum.add_(g.sum(0));
    }
    return {grad_input, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool transposed) {
  std::shared_ptr<Impl> scope;
  if (torch::GradMode::is_enabled() && weight.requires_grad() && bias.requires_grad()) scope = t_active;
  if (!scope) return torch::addmm(bias, input, transposed ? weight.t() : weight);
  int64_t entry = 0;
  {
    std::lock_guard<std::mutex> lock(scope->mutex);
    auto it = scope->index.find(weight.unsafeGetTensorImpl());
    if (it == scope->index.end()) {
      Impl::Entry e;
      e.weight = weight;
      e.bias = bias;
      e.transposed = transposed;
      scope->entries.push_back(std::move(e));
      it = scope->index.emplace(weight.unsafeGetTensorImpl(), scope->entries.size() - 1).first;
    }
    const Impl::Entry& e = scope->entries[it->second];
    if (!e.bias.is_same(bias) || e.transposed != transposed) {
      throw std::logic_error("nmcmc::linear: one weight used with two biases or layouts in one scope");
    }
    entry = static_cast<int64_t>(it->second);
  }
  return DeferredLinearFn::apply(input, weight, bias, transposed, scope->id, entry);
}

DeferredWeightGrads::DeferredWeightGrads() : impl_(std::make_shared<Impl>()) {
  if (t_active) throw std::logic_error("DeferredWeightGrads: scopes do not nest");
  std::lock_guard<std::mutex> lock(g_mutex);
  impl_->id = g_next_id++;
  g_scopes.emplace(impl_->id, impl_);
  t_active = impl_;
}

DeferredWeightGrads::~DeferredWeightGrads() {
  if (t_active == impl_) t_active.reset();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_scopes.erase(impl_->id);
}

void DeferredWeightGrads::flush() {
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (Impl::Entry& e : impl_->entries) {
    if (!e.weight_sum.defined()) continue;  // no backward pass reached this weight
    add_to_grad(e.weight, e.weight_sum);
    add_to_grad(e.bias, e.bias_sum);
    e.weight_sum = torch::Tensor();
    e.bias_sum = torch::Tensor();
  }
}

int64_t DeferredWeightGrads::pending() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  int64_t n = 0;
  for (const Impl::Entry& e : impl_->entries) n += e.weight_sum.defined() ? 1 : 0;
  return n;
}

}  // namespace nmcmc
