// The built-in targets' row loops (Note [The funnel's rows], src/targets/funnel_moon.cpp): which
// batches take them, and the dispatch on the batch's dtype. Internal to src/targets.
#pragma once

#include <optional>

#include "nmcmc/core/target.hpp"

namespace nmcmc::detail {

template <typename T>
struct RowType {
  using type = T;
};

/// rows(RowType<T>{}) for a contiguous [C, dim] CPU batch of float32 or float64 without autograd;
/// nullopt for any other batch (the caller's tensor formula then).
template <typename Rows>
std::optional<EnergyGrad> on_rows(const torch::Tensor& x, bool create_graph, int64_t dim, Rows rows) {
  if (create_graph || x.requires_grad() || !x.device().is_cpu() || x.dim() != 2 || !x.is_contiguous() ||
      x.size(1) != dim) {
    return std::nullopt;
  }
  if (x.scalar_type() == torch::kFloat64) return rows(RowType<double>{});
  if (x.scalar_type() == torch::kFloat32) return rows(RowType<float>{});
  return std::nullopt;
}

}  // namespace nmcmc::detail
