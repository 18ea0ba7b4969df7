// A run's draws mapped back through the transform its chains ran on (Note [Warm-up in phases]).
#include "transformed_draws.hpp"

namespace nmcmc {

namespace {
const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);
}  // namespace

void TransformedSink::append(const SampleResult& result, int64_t from, int64_t to) { inner_->append(view(result, to), from, to); }

void TransformedSink::finish(const SampleResult& result) { inner_->finish(view(result, result.draws.size(0))); }

SampleResult TransformedSink::view(const SampleResult& result, int64_t to) {
  if (!draws_.defined() || draws_.size(0) < result.draws.size(0)) {
    draws_ = torch::zeros(result.draws.sizes(), kF64);
    lp_ = torch::zeros(result.lp.sizes(), kF64);
    done_ = 0;
  }
  if (to > done_) {
    torch::Tensor y = result.draws.slice(0, done_, to);  // [s, C, D]
    const auto shape = y.sizes().vec();
    torch::Tensor flat = y.reshape({-1, shape[2]});
    draws_.slice(0, done_, to).copy_(latent_->to_ambient(flat).to(torch::kFloat64).reshape(shape));
    lp_.slice(0, done_, to).copy_(result.lp.slice(0, done_, to) - latent_->log_det(flat).reshape({shape[0], shape[1]}));
    done_ = to;
  }
  SampleResult v = result;
  v.draws = draws_.slice(0, 0, result.draws.size(0));
  v.lp = lp_.slice(0, 0, result.lp.size(0));
  return v;
}

void map_to_inner(SampleResult& res, const TransformedTarget& latent) {
  if (!res.draws.defined() || res.draws.size(0) == 0) return;
  const auto shape = res.draws.sizes().vec();
  torch::Tensor flat = res.draws.reshape({-1, latent.dim()});
  torch::Tensor ld = latent.log_det(flat).reshape({shape[0], shape[1]});
  res.draws = latent.to_ambient(flat).to(torch::kFloat64).reshape(shape);
  res.lp = res.lp.to(torch::kFloat64) - ld;
}

}  // namespace nmcmc
