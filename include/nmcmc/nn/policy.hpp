#pragma once
/// How the linear layers multiply: a value the model holds and passes to every linear() call.
//
// Note [Linear-layer policy]
// Which numerics a network gets (bfloat16 or its own dtype, oneDNN's or LibTorch's GEMM, whether a
// training step's backward products leave out rows of zero gradient) is a LinearPolicy that the
// model holds (StepMLP; the learned sampler sets its networks' from LearnedOptions::matmul and
// ::gemm) and hands to linear() with each call. Nothing about it is process state: two models in
// one process may multiply differently, and a test that wants another setting builds a model with
// it. The weights' derived copies (bfloat16 casts, oneDNN's reordered layout) live in a
// WeightCache the layer owns, checked against the weight's version counter and storage, so a
// sampling run casts or reorders each weight once and a training step once per optimiser step.
// `auto` settings are resolved per call from what the call sees: matmul = auto takes bfloat16 only
// without autograd on a CPU with AMX-BF16 (Note [Bfloat16 matmul]); gemm = auto takes oneDNN only
// where LibTorch and the BLAS run one thread (Note [oneDNN GEMM]).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "nmcmc/core/enum_names.hpp"

namespace nmcmc {

/// A model's `matmul` option (Note [Bfloat16 matmul]): auto, native (the tensors' own dtype),
/// bfloat16 (always, training included).
enum class MatmulOption { kAuto, kNative, kBFloat16 };
template <>
struct EnumNames<MatmulOption> {
  static constexpr const char* what = "matmul";
  static std::vector<std::pair<MatmulOption, const char*>> values() {
    return {{MatmulOption::kAuto, "auto"}, {MatmulOption::kNative, "native"}, {MatmulOption::kBFloat16, "bfloat16"}};
  }
};
NMCMC_ENUM_JSON(MatmulOption)

/// Where float32 CPU GEMMs run (Note [oneDNN GEMM]): auto (oneDNN where LibTorch and the BLAS each
/// run one thread, LibTorch's GEMM otherwise), onednn, libtorch (LibTorch's BLAS: OpenBLAS, MKL).
enum class GemmBackend { kAuto, kOneDnn, kLibTorch };
template <>
struct EnumNames<GemmBackend> {
  static constexpr const char* what = "gemm";
  static std::vector<std::pair<GemmBackend, const char*>> values() {
    return {{GemmBackend::kAuto, "auto"}, {GemmBackend::kOneDnn, "onednn"}, {GemmBackend::kLibTorch, "libtorch"}};
  }
};
NMCMC_ENUM_JSON(GemmBackend)

/// Note [Linear-layer policy].
struct LinearPolicy {
  MatmulOption matmul = MatmulOption::kNative;
  GemmBackend gemm = GemmBackend::kAuto;
  /// Note [Zero-gradient rows]: a training step's backward products leave out rows whose output
  /// gradient is zero, in layers of at least `zero_rows_min_layer` weights (below that the scan,
  /// gathers and scatter cost about what the rows save).
  bool skip_zero_gradient_rows = true;
  int64_t zero_rows_min_layer = int64_t{1} << 16;
};

/// A layer's derived copies of its weight (Note [Linear-layer policy]): a bfloat16 cast and
/// oneDNN's reordered layouts, each re-made when the weight changes. Owned by the layer (one per
/// weight); copies share it (a module's clone() makes new ones). Safe to use from several threads.
class WeightCache {
 public:
  WeightCache();
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// The parts of WeightCache that deferred_linear.cpp and onednn_gemm.cpp fill (src/nn).
struct WeightCache::Impl {
  std::mutex mutex;
  /// What a copy was made from: the weight (held), its version counter and storage.
  struct Source {
    torch::Tensor weight;
    uint32_t version = 0;
    const void* data = nullptr;
    bool matches(const torch::Tensor& w) const {
      return weight.defined() && weight.is_same(w) && version == w._version() && data == w.data_ptr();
    }
    void take(const torch::Tensor& w) {
      weight = w;
      version = w._version();
      data = w.data_ptr();
    }
  };
  Source bf16_source;
  torch::Tensor bf16;
  /// oneDNN's reordered weight, as multiplied (index 0) or transposed (1); type-erased here (it is
  /// a dnnl::memory, known only where oneDNN's headers are).
  Source packed_source[2];
  std::shared_ptr<void> packed[2];
};

inline WeightCache::WeightCache() : impl_(std::make_shared<Impl>()) {}

}  // namespace nmcmc
