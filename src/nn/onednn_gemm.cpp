#include "nmcmc/nn/onednn_gemm.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <unordered_map>

#if NMCMC_HAVE_DNNL
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <dnnl.hpp>
#endif

namespace nmcmc {

#if NMCMC_HAVE_DNNL

namespace {
std::atomic<uint64_t> g_calls{0};

/// The BLAS's own thread count (OpenBLAS keeps its own pool, which LibTorch's --threads does not
/// limit; OPENBLAS_NUM_THREADS does); 1 when it is not OpenBLAS.
int blas_threads() {
  static const int n = [] {
    auto fn = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    return fn != nullptr ? std::max(1, fn()) : 1;
  }();
  return n;
}
}  // namespace

// One thread only: with OpenBLAS's pool on the other core, oneDNN on OpenMP threads contended with
// its spinning workers, and oneDNN on two threads with OpenBLAS on one was no faster than OpenBLAS
// on two (measured: Note [oneDNN GEMM]).
bool onednn_gemm_enabled(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOneDnn: return true;
    case GemmBackend::kLibTorch: return false;
    case GemmBackend::kAuto: break;
  }
  return at::get_num_threads() == 1 && blas_threads() == 1;
}

bool onednn_gemm_available() { return true; }

uint64_t test_hooks::onednn_gemm_calls() { return g_calls.load(); }

namespace {

using dt = dnnl::memory::data_type;

/// The primitives for one shape (M, K, N, the left operand's strides), with and without bias. The
/// blocked weight layout they take depends on K and N only (checked when used): one reordered copy
/// of a weight serves every M, which the training step's compacted backward products vary
/// (Note [Zero-gradient rows]).
struct Primitives {
  dnnl::matmul plain, with_bias;
  dnnl::memory::desc weights;
};

struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<std::string, Primitives> primitives;  // by shape
};

State& state() {
  thread_local State s;  // per thread: data-parallel ranks run as threads of one process
  return s;
}

dnnl::memory::desc desc_of(const torch::Tensor& t) { return dnnl::memory::desc({t.size(0), t.size(1)}, dt::f32, {t.stride(0), t.stride(1)}); }

torch::Tensor usable(const torch::Tensor& t) {
  return (t.stride(1) == 1 || t.stride(0) == 1) && t.stride(0) > 0 && t.stride(1) > 0 ? t : t.contiguous();
}

void check(const torch::Tensor& a, int64_t k, int64_t n, const torch::Tensor& c, const torch::Tensor& bias) {
  TORCH_CHECK(a.is_cpu() && a.scalar_type() == torch::kFloat && a.dim() == 2 && a.size(1) == k,
              "oneDNN GEMM: expected a float32 CPU matrix [M, ", k, "], got ", a.scalar_type(), " ", a.sizes());
  TORCH_CHECK(c.scalar_type() == torch::kFloat && c.is_contiguous() && c.dim() == 2 && c.size(0) == a.size(0) &&
                  c.size(1) == n,
              "oneDNN GEMM: c must be a contiguous float32 [", a.size(0), ", ", n, "]");
  TORCH_CHECK(!bias.defined() || (bias.scalar_type() == torch::kFloat && bias.numel() == n && bias.is_contiguous()),
              "oneDNN GEMM: bias must be a contiguous float32 [", n, "]");
}

Primitives& primitives_for(State& s, const torch::Tensor& a, int64_t k, int64_t n) {
  const int64_t m = a.size(0);
  const std::string key = std::to_string(m) + ',' + std::to_string(k) + ',' + std::to_string(n) + ',' +
                          std::to_string(a.stride(0)) + ',' + std::to_string(a.stride(1));
  auto it = s.primitives.find(key);
  if (it != s.primitives.end()) return it->second;
  if (s.primitives.size() >= 512) s.primitives.clear();  // ~70 us each to make again
  const dnnl::memory::desc any({k, n}, dt::f32, dnnl::memory::format_tag::any);
  const dnnl::memory::desc cd({m, n}, dt::f32, {n, 1});
  const dnnl::memory::desc biasd({1, n}, dt::f32, {n, 1});
  dnnl::primitive_attr attr;
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(desc_of(a), any, cd), attr, s.engine);
  const dnnl::matmul::primitive_desc pdb(dnnl::matmul::desc(desc_of(a), any, biasd, cd), attr, s.engine);
  TORCH_CHECK(pdb.weights_desc() == pd.weights_desc(), "oneDNN GEMM: the weight layouts with and without bias differ");
  return s.primitives.emplace(key, Primitives{dnnl::matmul(pd), dnnl::matmul(pdb), pd.weights_desc()}).first->second;
}

/// `weight` (multiplied as weight^T when `transpose`) reordered into `layout`.
dnnl::memory reordered(State& s, const torch::Tensor& weight, bool transpose, const dnnl::memory::desc& layout) {
  const torch::Tensor wc = (transpose ? weight.t() : weight).detach();
  dnnl::memory plain(desc_of(wc), s.engine, wc.data_ptr());
  dnnl::memory out(layout, s.engine);
  dnnl::reorder(plain, out).execute(s.stream, plain, out);
  s.stream.wait();
  return out;
}

/// The reordered weight from the layer's cache (Note [Linear-layer policy]), made again when the
/// weight or the layout changed; a fresh one without a cache.
dnnl::memory packed_for(State& s, const torch::Tensor& weight, bool transpose, const dnnl::memory::desc& layout,
                        WeightCache* cache) {
  if (cache == nullptr) return reordered(s, weight, transpose, layout);
  WeightCache::Impl& c = cache->impl();
  std::lock_guard<std::mutex> lock(c.mutex);
  const int i = transpose ? 1 : 0;
  auto* held = static_cast<dnnl::memory*>(c.packed[i].get());
  if (held != nullptr && c.packed_source[i].matches(weight) && held->get_desc() == layout) return *held;
  c.packed[i] = std::make_shared<dnnl::memory>(reordered(s, weight, transpose, layout));
  c.packed_source[i].take(weight);
  return *static_cast<dnnl::memory*>(c.packed[i].get());
}

}  // namespace

void onednn_gemm_weight(const torch::Tensor& a_in, const torch::Tensor& weight, bool transpose, torch::Tensor& c,
                        const torch::Tensor& bias, WeightCache* cache) {
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == torch::kFloat && weight.dim() == 2,
              "oneDNN GEMM: the weight must be a float32 CPU matrix");
  const torch::Tensor a = usable(a_in);
  const torch::Tensor w = transpose ? weight.t() : weight;  // [K, N] as multiplied
  const int64_t m = a.size(0), k = w.size(0), n = w.size(1);
  check(a, k, n, c, bias);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty product: the bias alone
    bias.defined() ? c.copy_(bias.expand({m, n})) : c.zero_();
    return;
  }
  State& s = state();
  Primitives& prims = primitives_for(s, a, k, n);
  const dnnl::memory b = packed_for(s, weight, transpose, prims.weights, cache);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(desc_of(a), s.engine, a.data_ptr())},
                                             {DNNL_ARG_WEIGHTS, b},
                                             {DNNL_ARG_DST, dnnl::memory(desc_of(c), s.engine, c.data_ptr())}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, n}, dt::f32, {n, 1}}, s.engine, bias.data_ptr()));
  (bias.defined() ? prims.with_bias : prims.plain).execute(s.stream, args);
  s.stream.wait();
  g_calls.fetch_add(1, std::memory_order_relaxed);
}

#else

bool onednn_gemm_enabled(GemmBackend) { return false; }

bool onednn_gemm_available() { return false; }

uint64_t test_hooks::onednn_gemm_calls() { return 0; }

void onednn_gemm_weight(const torch::Tensor&, const torch::Tensor&, bool, torch::Tensor&, const torch::Tensor&, WeightCache*) {
  throw std::runtime_error("onednn_gemm_weight: this build of nmcmc has no oneDNN (install libdnnl-dev and rebuild)");
}

#endif

}  // namespace nmcmc
