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

/// The backend; the program sets it from NMCMC_GEMM at start (apps/process/gemm.hpp).
std::atomic<int>& mode() {
  static std::atomic<int> m{static_cast<int>(GemmBackend::kAuto)};
  return m;
}

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
// on two (measured: BENCHMARKS.md, Note [oneDNN GEMM]).
bool onednn_gemm_enabled() {
  switch (static_cast<GemmBackend>(mode().load(std::memory_order_relaxed))) {
    case GemmBackend::kOneDnn: return true;
    case GemmBackend::kLibTorch: return false;
    case GemmBackend::kAuto: break;
  }
  return at::get_num_threads() == 1 && blas_threads() == 1;
}

bool onednn_gemm_available() { return true; }

uint64_t onednn_gemm_calls() { return g_calls.load(); }

GemmBackend set_gemm_backend(GemmBackend backend) {
  return static_cast<GemmBackend>(mode().exchange(static_cast<int>(backend)));
}

namespace {

using dt = dnnl::memory::data_type;

/// A weight reordered into oneDNN's blocked layout, kept while the weight is unchanged.
struct Packed {
  torch::Tensor weight;  // held, so that its address is not reused while cached
  uint32_t version = 0;
  const void* data = nullptr;
  dnnl::memory memory;
};

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
  std::unordered_map<std::string, Packed> packed;          // by weight and layout
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

/// `weight` (multiplied as weight^T when `transpose`) in the layout `layout`, reordered when it or the weight changed.
const dnnl::memory& packed_for(State& s, const torch::Tensor& weight, bool transpose, const dnnl::memory::desc& layout) {
  const std::string key = std::to_string(reinterpret_cast<uintptr_t>(weight.unsafeGetTensorImpl())) + (transpose ? 't' : 'n');
  auto it = s.packed.find(key);
  const uint32_t version = weight._version();
  if (it != s.packed.end() && it->second.version == version && it->second.data == weight.data_ptr() &&
      it->second.weight.sizes() == weight.sizes() && it->second.memory.get_desc() == layout) {
    return it->second.memory;
  }
  if (it == s.packed.end()) {
    if (s.packed.size() >= 64) {  // drop the copies of weights nothing else holds any more
      for (auto i = s.packed.begin(); i != s.packed.end();) {
        i = i->second.weight.use_count() <= 1 ? s.packed.erase(i) : std::next(i);
      }
    }
    it = s.packed.emplace(key, Packed{}).first;
  }
  Packed& p = it->second;
  const torch::Tensor wc = (transpose ? weight.t() : weight).detach();
  dnnl::memory plain(desc_of(wc), s.engine, wc.data_ptr());
  p.memory = dnnl::memory(layout, s.engine);
  dnnl::reorder(plain, p.memory).execute(s.stream, plain, p.memory);
  s.stream.wait();
  p.weight = weight;
  p.version = version;
  p.data = weight.data_ptr();
  return p.memory;
}

}  // namespace

void onednn_gemm_weight(const torch::Tensor& a_in, const torch::Tensor& weight, bool transpose, torch::Tensor& c,
                        const torch::Tensor& bias) {
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
  const dnnl::memory& b = packed_for(s, weight, transpose, prims.weights);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(desc_of(a), s.engine, a.data_ptr())},
                                             {DNNL_ARG_WEIGHTS, b},
                                             {DNNL_ARG_DST, dnnl::memory(desc_of(c), s.engine, c.data_ptr())}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, n}, dt::f32, {n, 1}}, s.engine, bias.data_ptr()));
  (bias.defined() ? prims.with_bias : prims.plain).execute(s.stream, args);
  s.stream.wait();
  g_calls.fetch_add(1, std::memory_order_relaxed);
}

#else

bool onednn_gemm_enabled() { return false; }

bool onednn_gemm_available() { return false; }

uint64_t onednn_gemm_calls() { return 0; }

GemmBackend set_gemm_backend(GemmBackend) { return GemmBackend::kLibTorch; }

void onednn_gemm_weight(const torch::Tensor&, const torch::Tensor&, bool, torch::Tensor&, const torch::Tensor&) {
  throw std::runtime_error("onednn_gemm_weight: this build of nmcmc has no oneDNN (install libdnnl-dev and rebuild)");
}

#endif

}  // namespace nmcmc
