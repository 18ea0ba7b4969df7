#pragma once
/// Stan-CSV draws files, one per chain, as CmdStan writes them.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace nmcmc {

/// Everything one chain's file holds. Tensors are CPU float64 except where noted.
struct ChainDraws {
  torch::Tensor x;             // [S, D]
  torch::Tensor lp;            // [S]  (-U)
  torch::Tensor accept_stat;   // [S]
  torch::Tensor n_grad;        // [S]  gradient evaluations in each step
  torch::Tensor divergent;     // [S]  0/1
  double step_size = 0;
  torch::Tensor inv_mass;      // [D] or undefined
};

/// Writes one chain's draws atomically. `config` goes into `#` comment lines (key = value).
void write_stan_csv(const std::string& path, const nlohmann::json& config, const ChainDraws& draws,
                    double elapsed_warmup, double elapsed_sampling);

/// A parsed Stan CSV: the comment lines, column names and values [S, K].
struct StanCsv {
  std::vector<std::string> comments;
  std::vector<std::string> columns;
  torch::Tensor values;
};
/// Reads a Stan CSV; throws DataError on malformed content.
StanCsv read_stan_csv(const std::string& path);

}  // namespace nmcmc
