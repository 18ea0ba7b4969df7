#pragma once
/// The summary of a run: Stan's per-parameter table, efficiency per step, gradient and second.
#include <nlohmann/json.hpp>

#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// Summary statistics of a run: per-parameter Stan summary, ESS per step/gradient/second,
/// accept rate, divergences, MSJD, and (when the target has reference moments) the paper's ESS.
/// The draws are read a block of parameters at a time, each block about `block_bytes` with its
/// temporaries (so disk-backed draws of any size are summarised within memory); `progress` hears
/// of each block (phase "summary", iteration = parameters done) when there is more than one.
nlohmann::json summarise(const SampleResult& result, Target& target, int64_t block_bytes = int64_t{256} << 20,
                         const ProgressFn& progress = nullptr);

/// A human-readable summary table of `summarise()`'s output: the first `rows` parameters and,
/// for larger D, the worst `rows` by bulk ESS; then the efficiency lines.
std::string format_summary(const nlohmann::json& summary, int64_t rows = 8);

}  // namespace nmcmc
