#pragma once
/// `nmcmc reference`: reference posterior moments of a logistic-regression data set from a long
/// HMC run (data/reference/DATASET.json), written only when the run converged (max R-hat < 1.01).
#include <nlohmann/json.hpp>

#include <string>

#include "nmcmc/services/sample.hpp"

namespace nmcmc {

struct ReferenceOptions {
  std::string dataset;
  std::string output;  // empty: data/reference/DATASET.json
  int64_t chains = 64, warmup = 2000, draws = 10000, leapfrog = 16;
  double jitter = 0.5;
  uint64_t seed = 20261122;
  std::string command;  // recorded in the file
};

struct ReferenceResult {
  nlohmann::json summary;    // summarise() of the run
  nlohmann::json reference;  // what is (or would be) written
  bool converged = false;
  std::string path;          // where it was written (empty unless converged)
};

ReferenceResult compute_reference(const ReferenceOptions& options, const ProgressFn& progress = nullptr);

}  // namespace nmcmc
