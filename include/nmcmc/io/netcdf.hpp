#pragma once
/// ArviZ InferenceData as NetCDF-4 (Debian's libnetcdf), written as the draws come.
//
// Layout (what arviz.from_netcdf and xarray.open_dataset(group=...) read):
//   group posterior:    dims chain, draw (unlimited), <var>_dim_0; one variable per parameter
//                       or per vector of parameters (names "theta.1", "theta.2", ... become
//                       theta[chain, draw, theta_dim_0]); coordinates chain and draw.
//   group sample_stats: the per-draw statistics [chain, draw] (float64, int64, or bool stored
//                       as int8 with dtype = "bool", as xarray writes bools).
//   optional groups:    [step]-indexed tables, e.g. the learned sampler's training log.
// Every group carries the attributes created_at, inference_library, inference_library_version
// (and the extra ones given). The file is written as PATH.part, synced after every append, and
// renamed to PATH by finish(); a run that dies leaves the .part with everything synced so far.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace nmcmc {

/// One per-draw statistic of the sample_stats group.
struct StatColumn {
  std::string name;
  enum class Kind { kFloat, kInt, kBool } kind = Kind::kFloat;
};

/// How parameter labels become posterior variables: runs of "base.1", "base.2", ... "base.k"
/// become one vector variable `base`, other labels scalar variables (characters NetCDF does not
/// allow in names become '_'). If that is not one-to-one (a name repeated, indices out of
/// order), all parameters go into one variable `x` with a string coordinate `parameter`.
struct PosteriorVariable {
  std::string name;
  int64_t first = 0, size = 1;  // parameters [first, first + size)
  bool vector = false;          // has a <name>_dim_0 dimension
};
struct PosteriorLayout {
  std::vector<PosteriorVariable> variables;
  bool labelled = false;  // the single-variable fallback with a `parameter` coordinate
};
PosteriorLayout posterior_layout(const std::vector<std::string>& labels);

class InferenceDataWriter {
 public:
  /// Creates PATH.part with the groups defined; `attributes` (strings, numbers, booleans) go on
  /// every group beside the standard ones. Throws IoError when the file cannot be created.
  InferenceDataWriter(std::string path, int64_t chains, std::vector<std::string> labels,
                      std::vector<StatColumn> stats, const nlohmann::json& attributes);
  ~InferenceDataWriter();
  InferenceDataWriter(const InferenceDataWriter&) = delete;
  InferenceDataWriter& operator=(const InferenceDataWriter&) = delete;

  /// Appends draws x [n, C, D] and each statistic [n, C] (by name; every one declared must be
  /// given), then syncs the file.
  void append(const torch::Tensor& x, const std::map<std::string, torch::Tensor>& stats);
  /// A group of columns over a `step` dimension (e.g. the training log): name -> values.
  void add_table(const std::string& group, const std::map<std::string, std::vector<double>>& columns,
                 const nlohmann::json& attributes);
  /// Sets attributes on every group (e.g. whether the run completed), closes the file and
  /// renames PATH.part to PATH.
  void finish(const nlohmann::json& attributes);
  int64_t draws_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  void put_attributes(int group, const nlohmann::json& attributes);
  std::string path_;
  int ncid_ = -1, posterior_ = -1, stats_group_ = -1;
  int64_t chains_, dim_, written_ = 0;
  PosteriorLayout layout_;
  std::vector<int> posterior_vars_;
  std::vector<StatColumn> stats_;
  std::vector<int> stat_vars_;
  int draw_var_posterior_ = -1, draw_var_stats_ = -1;
  std::vector<int> groups_;
};

}  // namespace nmcmc
