#pragma once
// A run's draws mapped back through the transform its chains ran on (transformed_draws.cpp).
#include <torch/torch.h>

#include "nmcmc/core/transform.hpp"
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// Forwards the run's draws to `inner` mapped to the inner target (draws x = T(y), lp = -U(x)).
class TransformedSink : public DrawSink {
 public:
  TransformedSink(DrawSink* inner, const TransformedTarget& latent) : inner_(inner), latent_(&latent) {}
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;

 private:
  SampleResult view(const SampleResult& result, int64_t to);
  DrawSink* inner_;
  const TransformedTarget* latent_;
  torch::Tensor draws_, lp_;  // [S, C, D], [S, C] float64: the rows mapped so far
  int64_t done_ = 0;
};

/// The result's draws and lp on the inner target: x = T(y), lp - log|det dT/dy|.
void map_to_inner(SampleResult& res, const TransformedTarget& latent);

}  // namespace nmcmc
