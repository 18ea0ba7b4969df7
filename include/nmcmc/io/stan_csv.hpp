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
  torch::Tensor tree_depth;    // [S]  NUTS (then n_grad is n_leapfrog__), else undefined
  torch::Tensor energy;        // [S]  NUTS: the Hamiltonian
  double step_size = 0;
  torch::Tensor inv_mass;      // [D], [D, D] or undefined
  std::vector<std::string> names;  // D parameter names (empty: x.1 ... x.D)
  /// Rows [from, from + n) (views).
  ChainDraws rows(int64_t from, int64_t n) const;
};

/// Writes one chain's draws atomically. Columns as CmdStan: lp__, accept_stat__, stepsize__,
/// then for NUTS treedepth__, n_leapfrog__, divergent__, energy__, else n_grad__, divergent__;
/// then the parameters. `config` goes into `#` comment lines (key = value).
void write_stan_csv(const std::string& path, const nlohmann::json& config, const ChainDraws& draws,
                    double elapsed_warmup, double elapsed_sampling);

/// The parts of write_stan_csv, for writers that stream rows as they are drawn: the comment
/// header with the column line and the adaptation (d.x's shape gives D; its rows are not used);
/// the rows of d appended to `out`; the timing trailer.
std::string stan_csv_header(const nlohmann::json& config, const ChainDraws& d);
void append_stan_csv_rows(std::string& out, const ChainDraws& d);
std::string stan_csv_trailer(double elapsed_warmup, double elapsed_sampling);

/// A parsed Stan CSV: the comment lines, column names and values [S, K].
struct StanCsv {
  std::vector<std::string> comments;
  std::vector<std::string> columns;
  torch::Tensor values;
};
/// Reads a Stan CSV; throws DataError on malformed content.
StanCsv read_stan_csv(const std::string& path);

}  // namespace nmcmc
