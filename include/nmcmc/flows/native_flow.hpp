#pragma once
/// The flow transport's pass and its vector-Jacobian product in plain loops, without LibTorch.
//
// Note [The flow's native pass]
// NUTS through the flow evaluates U_z(z) = U(T(z)) - log|det dT/dz| and its gradient
// J^T dU(T(z)) - grad log|det| at every leapfrog step, for a handful of chains. Through LibTorch
// that was a graph of ~150 small operations per call (8 coupling layers, 3 linear maps each), then
// autograd's backward: 2-4 ms per call at D = 5, where the posterior's own gradient on the native
// engine costs 10-50 us (targets/script_program.hpp), so the transported warm-up of a 5-parameter
// regression ran for 20 minutes. Once fitted the flow is fixed, so its weights are copied here
// (float64, each linear map in the two layouts its two directions read as running sums over
// contiguous rows) and the pass and its adjoint are written out by hand:
//   forward, layer k (cond / free: the mask's halves):
//     h1 = silu(W1 y_cond + b1), h2 = silu(W2 h1 + b2), o = W3 h2 + b3,
//     s_f = a tanh(o_f / a), y_f <- y_f exp(s_f) + o_{D+f} (f free), log|det| += sum_f s_f;
//   then x = mu + L y.
//   adjoint of S = x . g - log|det| in z (g = dU(x) held fixed): ybar = g L, then for each layer
//   backwards: sbar_f = ybar_f y_f exp(s_f) - 1, obar_f = sbar_f (1 - tanh^2), obar_{D+f} = ybar_f,
//   ybar_f <- ybar_f exp(s_f); back through W3, silu', W2, silu', W1 into ybar on the cond half.
// Only the conditioning half of W1's columns and the free half of W3's rows are read (the others
// meet zeros). The values agree with the LibTorch pass to rounding (tests/unit/test_transport.cpp:
// 1e-12); training's pass with a graph (create_graph) and the fit stay on LibTorch.
#include <cstdint>
#include <vector>

namespace nmcmc {

/// A snapshot of a FlowTransport's weights (FlowTransportImpl::native()).
struct NativeFlowPass {
  struct Layer {
    std::vector<int64_t> cond, free;  // coordinates of the two halves
    // W1 restricted to cond: by input column [nc, h] (forward) and by output row [h, nc] (adjoint)
    std::vector<double> w1_cols, w1_rows, b1;
    // W2 [h, h]: by input column (= W2^T row-major) and by output row
    std::vector<double> w2_cols, w2_rows, b2;
    // W3's rows for the free half's log-scales and shifts: by input column [h, nf] and by row [nf, h]
    std::vector<double> w3s_cols, w3t_cols, w3s_rows, w3t_rows, b3s, b3t;
  };
  int64_t dim = 0, hidden = 0;
  double max_log_scale = 3.0;
  bool dense = false;
  std::vector<double> shift;      // mu [D]
  std::vector<double> lower;      // L [D, D] row-major, lower triangular (dense) ...
  std::vector<double> scale;      // ... or exp(s) [D] (diagonal)
  double base_log_det = 0;        // sum s
  std::vector<Layer> layers;

  /// What the adjoint needs from a forward pass (per layer: its input y, h1 and h2 before silu
  /// and their sigmoids, tanh(o / a), exp(s)). Reusing one tape reuses its memory.
  struct Tape {
    int64_t rows = 0;
    std::vector<std::vector<double>> y, pre1, pre2, sig1, sig2, th, es;
  };

  /// Rows z [n, D] -> x = T(z) [n, D] and log|det dT/dz| [n]; fills `tape` when given.
  void forward(const double* z, int64_t n, double* x, double* log_det, Tape* tape) const;
  /// grad_z of x . g - log|det| at the tape's rows: J^T g - grad log|det| [n, D], g [n, D].
  void pull_back(const Tape& tape, const double* g, double* gz) const;
};

}  // namespace nmcmc
