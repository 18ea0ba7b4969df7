#include "nmcmc/io/mapped_draws.hpp"

namespace nmcmc {

void MappedSink::map_until(const SampleResult& result, int64_t to) {
  mapped_ = result;  // the per-draw statistics and adaptation, shared (tensors are handles)
  mapped_.names = map_.names;
  if (!result.draws.defined()) return;
  const int64_t capacity = result.draws.size(0), chains = result.draws.size(1), k = static_cast<int64_t>(map_.names.size());
  if (!rows_.defined() || rows_.size(0) < capacity) {
    torch::Tensor grown = torch::full({capacity, chains, k}, NAN, torch::kFloat64);
    if (rows_.defined() && done_ > 0) grown.narrow(0, 0, done_).copy_(rows_.narrow(0, 0, done_));
    rows_ = grown;
  }
  to = std::min(to, capacity);
  if (to > done_) {
    const torch::Tensor x = result.draws.narrow(0, done_, to - done_).to(torch::kFloat64);
    rows_.narrow(0, done_, to - done_).copy_(map_.map(x, done_));
    done_ = to;
  }
  mapped_.draws = rows_.narrow(0, 0, capacity);
}

void MappedSink::append(const SampleResult& result, int64_t from, int64_t to) {
  map_until(result, to);
  if (inner_) inner_->append(mapped_, from, to);
}

void MappedSink::finish(const SampleResult& result) {
  map_until(result, result.draws.defined() ? result.draws.size(0) : 0);
  if (inner_) inner_->finish(mapped_);
}

SampleResult MappedSink::take_result() { return std::move(mapped_); }

}  // namespace nmcmc
