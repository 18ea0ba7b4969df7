#include "nmcmc/nn/deferred_linear.hpp"

#include <ATen/Context.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "nmcmc/core/errors.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/onednn_gemm.hpp"

namespace nmcmc {

bool cpu_has_fast_bf16_matmul() {
  static const bool fast = [] {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    const bool amx_bf16 = ((d >> 22) & 1U) != 0, amx_tile = ((d >> 24) & 1U) != 0;
    const bool osxsave = [] {
      unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
      __cpuid(1, a1, b1, c1, d1);
      return ((c1 >> 27) & 1U) != 0;
    }();
    if (!amx_bf16 || !amx_tile || !osxsave) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const bool os_tiles = ((lo >> 17) & 1U) != 0 && ((lo >> 18) & 1U) != 0;  // XTILECFG, XTILEDATA
    return os_tiles && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
#else
    return false;
#endif
  }();
  return fast;
}

Matmul resolve_matmul(MatmulOption option, const torch::Tensor& input) {
  if (option == MatmulOption::kBFloat16) return input.is_floating_point() ? Matmul::kBFloat16 : Matmul::kNative;
  // auto: only without gradients (Note [Bfloat16 matmul]: bfloat16 training is an opt-in).
  if (option == MatmulOption::kAuto && !torch::GradMode::is_enabled() && input.scalar_type() == torch::kFloat && input.is_cpu() &&
      cpu_has_fast_bf16_matmul()) {
    return Matmul::kBFloat16;
  }
  return Matmul::kNative;
}

struct DeferredWeightGrads::Impl {
  struct Entry {
    torch::Tensor weight, bias;
    bool transposed = false;
    torch::Tensor weight_sum, bias_sum;  // accumulated by the backward passes
    // bfloat16: each use's (input, output gradient), multiplied in one GEMM at flush() (a
    // bfloat16 GEMM cannot add into a float32 buffer, and adding each use's product was as slow
    // as the product itself)
    std::vector<torch::Tensor> inputs, grads;
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

torch::Tensor bf16_copy(const torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  return weight.detach().to(torch::kBFloat16).contiguous();
}

/// [C, in] (bfloat16) times the layer's weight (bfloat16, as laid out), bias added in `dtype`.
torch::Tensor bf16_affine(const torch::Tensor& xb, const torch::Tensor& wb, const torch::Tensor& bias, bool transposed) {
  return torch::add(xb.mm(transposed ? wb.t() : wb), bias);  // bfloat16 + float32 -> float32 in one pass
}

/// input [M, in] @ W + bias through oneDNN (Note [oneDNN GEMM]).
torch::Tensor onednn_linear(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias, bool transposed,
                            WeightCache* cache) {
  torch::Tensor out = torch::empty({input.size(0), transposed ? weight.size(0) : weight.size(1)}, input.options());
  onednn_gemm_weight(input.detach(), weight, transposed, out, bias.detach().contiguous(), cache);
  return out;
}

/// Whether linear() multiplies these through oneDNN: float32 CPU matrices (Note [oneDNN GEMM]).
bool use_onednn(GemmBackend backend, const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias) {
  return onednn_gemm_enabled(backend) && input.is_cpu() && input.scalar_type() == torch::kFloat && input.dim() == 2 &&
         weight.is_cpu() && weight.scalar_type() == torch::kFloat && weight.dim() == 2 && bias.defined() &&
         bias.scalar_type() == torch::kFloat;
}

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

std::atomic<uint64_t> g_rows_skipped{0};

/// Whether row `r` (n values) has an entry other than +-0 (NaN counts): blocks of 16 values OR'ed
/// without the sign bit (vectorised), stopping at the first block with one.
template <typename T, typename Bits>
bool row_nonzero(const T* r, int64_t n) {
  static_assert(sizeof(T) == sizeof(Bits), "bit width");
  constexpr Bits kMagnitude = ~(Bits(1) << (8 * sizeof(Bits) - 1));
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    Bits acc = 0;
    for (int64_t l = 0; l < 16; ++l) {
      Bits b;
      std::memcpy(&b, r + j + l, sizeof(b));
      acc |= b & kMagnitude;
    }
    if (acc != 0) return true;
  }
  for (; j < n; ++j) {
    Bits b;
    std::memcpy(&b, r + j, sizeof(b));
    if ((b & kMagnitude) != 0) return true;
  }
  return false;
}

/// The rows of a [M, N] output gradient with a nonzero entry, when they are at most 7/8 of them
/// in a layer with `in` inputs of at least `min_layer` weights (the policy's zero_rows_min_layer:
/// below it the scan, gathers and scatter cost about what the rows save: German's 128 x 128
/// layers trained slower when they compacted, Funnel-1's 512 x 512 layers faster),
/// leaving out at least 64 x min_layer multiply-adds;
/// empty otherwise (Note [Zero-gradient rows]).
bool rows_with_gradient(const torch::Tensor& g, int64_t in, int64_t min_layer, std::vector<int64_t>& rows) {
  rows.clear();
  if (!g.is_cpu() || g.dim() != 2 || !g.is_contiguous() ||
      g.size(0) < 8 || g.size(1) == 0 || (g.scalar_type() != torch::kFloat && g.scalar_type() != torch::kDouble) ||
      in * g.size(1) < min_layer) {
    return false;
  }
  const int64_t m = g.size(0), n = g.size(1);
  rows.reserve(static_cast<size_t>(m));
  auto collect = [&](const auto* data, auto bits) {
    using Bits = decltype(bits);
    for (int64_t i = 0; i < m; ++i) {
      if (row_nonzero<std::remove_const_t<std::remove_pointer_t<decltype(data)>>, Bits>(data + i * n, n)) rows.push_back(i);
    }
  };
  if (g.scalar_type() == torch::kFloat) {
    collect(g.data_ptr<float>(), uint32_t{});
  } else {
    collect(g.data_ptr<double>(), uint64_t{});
  }
  const int64_t kept = static_cast<int64_t>(rows.size());
  if (kept * 8 > m * 7 || (m - kept) * in * n < 64 * min_layer) return false;
  g_rows_skipped.fetch_add(static_cast<uint64_t>(m - kept), std::memory_order_relaxed);
  return true;
}

/// t[rows] for a matrix t (one copy per row when t is contiguous).
torch::Tensor gather_rows(const torch::Tensor& t, const std::vector<int64_t>& rows) {
  if (!t.is_contiguous()) return t.index_select(0, torch::tensor(rows, torch::kLong));
  torch::Tensor out = torch::empty({static_cast<int64_t>(rows.size()), t.size(1)}, t.options());
  const size_t bytes = static_cast<size_t>(t.size(1)) * t.element_size();
  const char* src = static_cast<const char*>(t.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t k = 0; k < rows.size(); ++k) std::memcpy(dst + k * bytes, src + static_cast<size_t>(rows[k]) * bytes, bytes);
  return out;
}

/// A [m, N] matrix whose rows `rows` are `part`'s and whose other rows are zeros (one pass).
torch::Tensor scatter_rows(const torch::Tensor& part, const std::vector<int64_t>& rows, int64_t m) {
  const torch::Tensor p = part.contiguous();
  torch::Tensor out = torch::empty({m, p.size(1)}, p.options());
  const size_t bytes = static_cast<size_t>(p.size(1)) * p.element_size();
  const char* src = static_cast<const char*>(p.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  size_t k = 0;
  for (int64_t i = 0; i < m; ++i) {
    char* row = dst + static_cast<size_t>(i) * bytes;
    if (k < rows.size() && rows[k] == i) {
      std::memcpy(row, src + k * bytes, bytes);
      ++k;
    } else {
      std::memset(row, 0, bytes);
    }
  }
  return out;
}

struct DeferredLinearFn : public torch::autograd::Function<DeferredLinearFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool transposed, bool bf16,
                               bool onednn, int64_t skip_rows_min_layer, int64_t scope, int64_t entry, WeightCache* cache) {
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["onednn"] = onednn;
    ctx->saved_data["skip_rows_min_layer"] = skip_rows_min_layer;  // -1: rows are not left out
    // the layer's cache, for the backward pass's product with the reordered weight (the layer
    // outlives its graphs: the model holds both)
    ctx->saved_data["cache"] = reinterpret_cast<int64_t>(cache);
    ctx->saved_data["scope"] = scope;
    ctx->saved_data["entry"] = entry;
    if (bf16) {  // saved: the bfloat16 input and weight, which the backward GEMMs multiply
      torch::Tensor xb = input.to(torch::kBFloat16), wb = bf16_weight(weight, cache);
      ctx->save_for_backward({xb, wb});
      return bias_add_bf16(xb.mm(transposed ? wb.t() : wb), bias);  // one pass (Note [Fast activations])
    }
    ctx->save_for_backward({input, weight});
    if (onednn) return onednn_linear(input, weight, bias, transposed, cache);
    return torch::addmm(bias, input, transposed ? weight.t() : weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& weight = saved[1];  // bfloat16 when bf16
    const bool transposed = ctx->saved_data["transposed"].toBool();
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    const bool onednn = ctx->saved_data["onednn"].toBool();
    const torch::Tensor g_all = onednn ? grads[0].contiguous() : grads[0];
    // Rows whose output gradient is zero add nothing to any gradient: multiply only the others
    // (Note [Zero-gradient rows]).
    std::vector<int64_t> rows;
    // Not with bfloat16 GEMMs: LibTorch's bfloat16 matmul makes a oneDNN primitive for every new
    // row count, which cost more than the rows saved.
    const int64_t min_layer = ctx->saved_data["skip_rows_min_layer"].toInt();
    auto* cache = reinterpret_cast<WeightCache*>(ctx->saved_data["cache"].toInt());
    const bool compact = !bf16 && min_layer >= 0 && rows_with_gradient(g_all, saved[0].size(1), min_layer, rows);
    const torch::Tensor g = compact ? gather_rows(g_all, rows) : g_all;
    const torch::Tensor input = compact ? gather_rows(saved[0], rows) : saved[0];  // bfloat16 when bf16
    const torch::Tensor gm = bf16 ? g.to(torch::kBFloat16) : g;  // the GEMMs' operand
    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      if (onednn) {  // g W^T against the cached reordered weight (Note [oneDNN GEMM]); the weight
                     // gradients below stay with LibTorch's GEMM (OpenBLAS's addmm_ was faster)
        grad_input = torch::empty({g.size(0), input.size(1)}, g.options());
        onednn_gemm_weight(g, weight, /*transpose=*/!transposed, grad_input, torch::Tensor(), cache);
      } else {
        grad_input = transposed ? gm.mm(weight) : gm.mm(weight.t());
        if (bf16) grad_input = grad_input.to(g.scalar_type());
      }
      if (compact) grad_input = scatter_rows(grad_input, rows, g_all.size(0));
    }
    std::shared_ptr<Impl> scope = scope_with_id(ctx->saved_data["scope"].toInt());
    if (!scope) {  // the scope has ended: ordinary gradients
      torch::Tensor gw = ctx->needs_input_grad(1) ? weight_grad(input, gm, transposed).to(g.scalar_type()) : torch::Tensor();
      torch::Tensor gb = ctx->needs_input_grad(2) ? g.sum(0) : torch::Tensor();
      return {grad_input, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
              torch::Tensor(), torch::Tensor()};
    }
    if (torch::GradMode::is_enabled()) {
      throw std::logic_error(
          "deferred weight gradients are first order only: no backward pass with create_graph inside a "
          "DeferredWeightGrads scope");
    }
    std::lock_guard<std::mutex> lock(scope->mutex);
    Impl::Entry& e = scope->entries.at(static_cast<size_t>(ctx->saved_data["entry"].toInt()));
    if (bf16) {
      e.inputs.push_back(input);
      e.grads.push_back(gm);
      if (!e.bias_sum.defined()) {
        e.bias_sum = g.sum(0);
      } else {
        e.bias_sum.add_(g.sum(0));
      }
    } else if (!e.weight_sum.defined()) {
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
    return {grad_input, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::string matmul_dtype_name(MatmulOption option, torch::Dtype dtype, torch::Device device, bool training) {
  const torch::Tensor probe = torch::empty({0}, torch::TensorOptions().dtype(dtype).device(device));
  torch::AutoGradMode mode(training);
  if (resolve_matmul(option, probe) == Matmul::kBFloat16) return "bfloat16";
  return dtype == torch::kFloat64 ? "float64" : dtype == torch::kFloat32 ? "float32" : std::string(c10::toString(dtype));
}

std::string matmul_summary(MatmulOption option, torch::Dtype dtype, torch::Device device) {
  const std::string train = matmul_dtype_name(option, dtype, device, true);
  const std::string sample = matmul_dtype_name(option, dtype, device, false);
  return train == sample ? train : train + " in training, " + sample + " in sampling";
}

torch::Tensor bf16_weight(const torch::Tensor& weight, WeightCache* cache) {
  if (cache == nullptr) return bf16_copy(weight);
  WeightCache::Impl& c = cache->impl();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.bf16_source.matches(weight) || c.bf16.sizes() != weight.sizes() || c.bf16.device() != weight.device()) {
    c.bf16 = bf16_copy(weight);
    c.bf16_source.take(weight);
  }
  return c.bf16;
}

uint64_t test_hooks::zero_gradient_rows_skipped() { return g_rows_skipped.load(); }

torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool transposed, const LinearPolicy& policy, WeightCache* cache) {
  const bool bf16 = resolve_matmul(policy.matmul, input) == Matmul::kBFloat16;
  std::shared_ptr<Impl> scope;
  const bool weight_grads = torch::GradMode::is_enabled() && (weight.requires_grad() || bias.requires_grad());
  if (weight_grads && weight.requires_grad() && bias.requires_grad()) scope = t_active;
  const bool onednn = !bf16 && use_onednn(policy.gemm, input, weight, bias);
  if (!scope) {
    // oneDNN where no gradient is recorded (sampling); gradients outside a training step's scope
    // (e.g. double backward) go through autograd's addmm.
    if (onednn && !(torch::GradMode::is_enabled() && (weight_grads || input.requires_grad()))) {
      return onednn_linear(input, weight, bias, transposed, cache);
    }
    if (!bf16) return torch::addmm(bias, input, transposed ? weight.t() : weight);
    // Gradients to the weight outside a scope (e.g. create_graph): autograd through the casts.
    torch::Tensor wb = weight_grads ? weight.to(torch::kBFloat16) : bf16_weight(weight, cache);
    return bf16_affine(input.to(torch::kBFloat16), wb, bias, transposed);
  }
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
  const int64_t skip_rows_min_layer = policy.skip_zero_gradient_rows ? policy.zero_rows_min_layer : -1;
  return DeferredLinearFn::apply(input, weight, bias, transposed, bf16, onednn, skip_rows_min_layer, scope->id, entry, cache);
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
    if (!e.inputs.empty()) {  // bfloat16 uses: one GEMM over all of them
      torch::Tensor x = e.inputs.size() == 1 ? e.inputs[0] : torch::cat(e.inputs, 0);
      torch::Tensor g = e.grads.size() == 1 ? e.grads[0] : torch::cat(e.grads, 0);
      torch::Tensor w = weight_grad(x, g, e.transposed).to(e.weight.scalar_type());
      e.weight_sum = e.weight_sum.defined() ? e.weight_sum.add_(w) : w;
      e.inputs.clear();
      e.grads.clear();
    }
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
  for (const Impl::Entry& e : impl_->entries) n += e.weight_sum.defined() || !e.inputs.empty() ? 1 : 0;
  return n;
}

}  // namespace nmcmc
