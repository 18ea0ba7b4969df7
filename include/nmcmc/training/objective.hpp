#pragma once
/// The entropy objective of the learned sampler (paper section 3.3, eq. 4 and appendix).
//
// Note [Entropy objective]
// Per x: L(x) = min(0, log a(x, x')) + beta * (log|dz/dz0| + D log eps), one z0 per x,
// averaged over the batch; we minimise -L. log|dz/dz0| + D log eps is the proposal entropy up to
// a constant (H[q(.|x)] = E[-log N(z0)] + E log|dz/dz0| + D log eps). log a is the kernel's own
// log_acceptance (kernels/proposal.hpp), so training and sampling use one formula. Gradients flow
// through dU(x + R) (double backward, create_graph) unless the caller stops them. Rows whose log a
// is not finite are left out of the average.
//
// Note [Non-finite rows in training]
// A density may overflow or raise on part of the space (a long recursion, a Cholesky factor that
// fails; Target turns a raise into a non-finite row). A row whose proposal's passes met such a
// value counts as a rejected proposal (log a = -inf, energy_new = +inf, x_new = x) and is left out
// of the loss, and it adds exactly nothing to the gradient: its values are replaced by zeros
// before the networks use them and the gradient that the target's backward pass sends to its
// input is zeroed (objective.cpp, RowGuard). One bad row in a batch no longer makes the step's
// gradient NaN (which skipped the whole step). Tested: tests/unit/test_training_step.cpp.
#include <torch/torch.h>

#include "nmcmc/flows/model.hpp"

namespace nmcmc {

/// The terms of the entropy objective on one batch.
struct ObjectiveTerms {
  torch::Tensor loss;         // scalar, -mean over finite rows of min(0, log a) + beta * entropy
  torch::Tensor log_a;        // [B] float64, detached; -inf where not finite
  torch::Tensor entropy;      // [B] float64, detached: log|dz/dz0| + D log eps
  torch::Tensor jump_sq;      // [B] float64, detached: |x' - x|^2
  double loss_value = 0;      // loss.item()
  double accept = 0;          // mean min(1, a)
  int64_t rows_finite = 0;    // rows whose log a is finite (the loss averages over them)
  int64_t rows_bad = 0;       // rows whose proposal met a non-finite energy or gradient
                              // (Note [Non-finite rows in training]; rejected, not in the loss)
  Proposed proposed;
};

/// One proposal from each row of x and the objective on it. u_x = U(x) [B]; grad_x = dU(x)
/// when the model needs it. With create_graph the loss is differentiable through dU (double
/// backward); otherwise the gradient is stopped at dU.
ObjectiveTerms entropy_objective(Target& target, ProposalModel& model, const torch::Tensor& x,
                                 const torch::Tensor& u_x, const torch::Tensor& grad_x, double beta,
                                 at::Generator& gen, bool create_graph);

}  // namespace nmcmc
