#pragma once
/// Draws reported in another parametrisation than the one the chains move in.
///
/// Note [Draws in the model's own parameters]
/// A Stan program's chains move on Stan's unconstrained scale, but its user reads the
/// constrained parameters, transformed parameters and generated quantities under Stan's names,
/// as CmdStan writes them. A DrawMap says how: the names of the K reported quantities and a
/// function from draws [n, C, D] (rows first_draw ... of the run, float64) to [n, C, K]. A
/// MappedSink applies it as the draws come, so that the streamed files (Stan CSV, NetCDF) and the
/// summary hold the mapped draws, each draw mapped once (generated quantities draw random numbers:
/// the map seeds them by the draw's index, so the same run maps the same draws to the same values).
/// Everything else of the result (lp__, the sampler's statistics, the adaptation) is unchanged.
#include <functional>
#include <string>
#include <vector>

#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

struct DrawMap {
  std::vector<std::string> names;  // [K]
  std::function<torch::Tensor(const torch::Tensor& draws, int64_t first_draw)> map;  // [n, C, D] -> [n, C, K]
};

/// A sink that maps the draws before `inner` (may be null) sees them, and keeps the mapped result.
class MappedSink : public DrawSink {
 public:
  MappedSink(DrawSink* inner, DrawMap map) : inner_(inner), map_(std::move(map)) {}
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;
  /// The run's result with its draws mapped (rows mapped so far; all of them after finish).
  SampleResult take_result();

 private:
  void map_until(const SampleResult& result, int64_t to);
  DrawSink* inner_;
  DrawMap map_;
  SampleResult mapped_;
  torch::Tensor rows_;  // [S, C, K] float64, filled up to done_
  int64_t done_ = 0;
};

}  // namespace nmcmc
