#pragma once
/// Hessian-vector products by central differences of an exact gradient.
#include <torch/torch.h>

#include <functional>

namespace nmcmc {

/// Note [Native second derivatives]
/// Training differentiates the gradient of the target again (the entropy objective depends on
/// dU at points that depend on the network). A target whose gradient is not a LibTorch graph
/// (nmcmc's native evaluator for TorchScript modules, a Stan program) makes U and dU at x one
/// autograd node; its backward, given the upstream gradients u_bar [C] and g_bar [C, D], returns
///   x_bar = u_bar * dU(x) + H(x) g_bar,
/// the Hessian-vector product H g_bar by a central difference of gradients along g_bar,
/// (dU(x + h v) - dU(x - h v)) / 2h with v = g_bar, per row h = 1e-5 (1 + |x|_inf) / |v|_inf
/// (both sides in one batched call of 2C rows): truncation error ~1e-10 and rounding ~1e-11
/// relative in float64, far below float32 training's own noise. Rows where v = 0 get 0; rows where
/// a side's energy or the difference is not finite are reported (finite_rows) for the caller to
/// handle (the TorchScript target redoes the batch by LibTorch's double backward; a Stan target's
/// such rows stay non-finite, and training leaves non-finite rows out). Within h of a kink (relu,
/// abs) the difference averages the two sides' gradients. The node's backward is not itself
/// differentiable (third derivatives: none needed). Accounting: the difference's two gradients
/// are part of the backward pass, not counted as target gradient evaluations, as LibTorch's
/// double backward never was (training's gradient counts count forward calls).
///
/// `energy_grad(points [2N, D] float64)` returns {energy [2N], grad [2N, D]}. x, v: [N, D]; the result
/// is [N, D] float64.
torch::Tensor central_difference_hvp(
    const std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)>& energy_grad,
    const torch::Tensor& x, const torch::Tensor& v, torch::Tensor* finite_rows = nullptr);

}  // namespace nmcmc
