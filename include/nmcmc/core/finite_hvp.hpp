#pragma once
/// Hessian-vector products by central differences of an exact gradient.
#include <torch/torch.h>

#include <functional>

namespace nmcmc {

/// Note [Native second derivatives]
/// Training backpropagates through grad U (the entropy objective differentiates the proposal's
/// gradient steps), so a target whose gradient is not a LibTorch graph (nmcmc's native evaluator,
/// a Stan program) supplies H(x) v from its gradient: (g(x + h v) - g(x - h v)) / 2h, per row, with
/// h = 1e-5 (1 + max|x|) / max|v| in float64. The error is O(h^2 |third derivative|), far below
/// the objective's Monte Carlo noise. Rows where v = 0 get 0; rows where either point's energy or
/// gradient is not finite come back non-finite, for the caller to handle.
///
/// `energy_grad(points [2N, D] float64)` returns {energy [2N], grad [2N, D]}. x, v: [N, D]; the result
/// is [N, D] float64.
torch::Tensor central_difference_hvp(
    const std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)>& energy_grad,
    const torch::Tensor& x, const torch::Tensor& v, torch::Tensor* finite_rows = nullptr);

}  // namespace nmcmc
