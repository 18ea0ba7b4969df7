#pragma once
/// The draw files of a run: Stan CSV per chain and ArviZ InferenceData (NetCDF), streamed as
/// drawn or written at the end, and summary.json.
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nmcmc/io/stan_csv.hpp"
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

/// Whether this build writes NetCDF-4 (built with libnetcdf; see io/netcdf.hpp).
bool netcdf_available();

/// The draw files a run writes: Stan CSV per chain, ArviZ InferenceData (NetCDF-4), or both.
/// By default both, or Stan CSV alone where the build has no NetCDF.
struct OutputFormats {
  bool csv = true, netcdf = netcdf_available();
};
/// Parses "csv", "netcdf", "csv,netcdf" (UsageError otherwise, and for "netcdf" in a build
/// without NetCDF).
OutputFormats parse_formats(const std::string& text);

/// A sink writing the chosen formats into `directory` as the draws come: chain_K.csv (see
/// StanCsvStream) and inference_data.nc (see NetcdfStream). `training_log`: the learned
/// sampler's log rows (checkpoint meta "log"), written as a group of the NetCDF file.
std::unique_ptr<DrawSink> make_output_sink(const std::string& directory, const nlohmann::json& config,
                                           OutputFormats formats, const nlohmann::json& training_log = nullptr);

/// Writes summary.json into `directory` and, unless `draws_written` (a sink from
/// make_output_sink wrote them during the run), the draws in `formats`.
void write_run(const std::string& directory, const nlohmann::json& config, const SampleResult& result,
               const nlohmann::json& summary, bool draws_written = false, OutputFormats formats = {},
               const nlohmann::json& training_log = nullptr);

/// Chain k's draws of a result, for the Stan-CSV writers.
ChainDraws chain_draws(const SampleResult& result, int64_t chain);

/// Writes Stan-CSV rows per chain as they are drawn: chain_K.csv.part during the run (so an
/// interrupted or killed run keeps every row written), renamed to chain_K.csv at the end with the
/// timing trailer; a stopped run's files end with "# nmcmc: incomplete run: N of M draws".
class StanCsvStream : public DrawSink {
 public:
  /// `first_chain`: the number of chains before these (a sharded run's rank writes chain_K.csv
  /// for its own chains K = first_chain + 1, ...).
  StanCsvStream(std::string directory, nlohmann::json config, int64_t first_chain = 0);
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;

 private:
  std::string path(int64_t chain, bool part) const;
  std::string directory_;
  nlohmann::json config_;
  int64_t first_chain_ = 0;
  bool started_ = false;
};

/// Writes the draws as ArviZ InferenceData, inference_data.nc (see io/netcdf.hpp): posterior
/// and sample_stats (lp, acceptance_rate, step_size, diverging, n_steps = gradient evaluations
/// of the step; for NUTS also tree_depth and energy), the run's config as attributes, and for the
/// learned sampler its training log as group `nmcmc_training`. Written as inference_data.nc.part
/// and renamed at the end; a stopped run's file says complete = 0 and how many draws it has.
class NetcdfStream : public DrawSink {
 public:
  NetcdfStream(std::string directory, nlohmann::json config, nlohmann::json training_log = nullptr);
  ~NetcdfStream() override;
  void append(const SampleResult& result, int64_t from, int64_t to) override;
  void finish(const SampleResult& result) override;

 private:
  std::string directory_;
  nlohmann::json config_, training_log_;
  std::unique_ptr<class InferenceDataWriter> writer_;
};

/// The column names of a training log row (checkpoint meta "log"): step, loss, accept, beta,
/// entropy, eps, lr, seconds, grads, skipped, elapsed.
const std::vector<std::string>& training_log_fields();
/// A checkpoint's logged rows as named columns (non-numbers, e.g. a null loss, become NaN);
/// DataError for a malformed row.
std::map<std::string, std::vector<double>> training_log_columns(const nlohmann::json& rows);

}  // namespace nmcmc
