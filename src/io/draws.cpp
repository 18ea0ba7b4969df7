// Where a run's draws go: Stan CSV and ArviZ InferenceData (NetCDF-4), written as they are drawn.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/netcdf.hpp"
#include "nmcmc/io/stan_csv.hpp"
#include "nmcmc/io/draws.hpp"

namespace nmcmc {

namespace fs = std::filesystem;
using json = nlohmann::json;

OutputFormats parse_formats(const std::string& text) {
  OutputFormats f{false, false};
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item == "csv") f.csv = true;
    else if (item == "netcdf") {
      if (!netcdf_available())
        throw UsageError("--format netcdf: this nmcmc was built without NetCDF (Debian's libnetcdf-dev); "
                         "write Stan CSV instead (--format csv)");
      f.netcdf = true;
    }
    else throw UsageError("--format: '" + item + "' is not a format (csv, netcdf, or both: csv,netcdf)");
    start = comma + 1;
  }
  return f;
}

namespace {
/// Forwards to several sinks.
class SinkList : public DrawSink {
 public:
  void add(std::unique_ptr<DrawSink> s) { sinks_.push_back(std::move(s)); }
  void append(const SampleResult& r, int64_t from, int64_t to) override {
    for (auto& s : sinks_) s->append(r, from, to);
  }
  void finish(const SampleResult& r) override {
    for (auto& s : sinks_) s->finish(r);
  }

 private:
  std::vector<std::unique_ptr<DrawSink>> sinks_;
};
}  // namespace

std::unique_ptr<DrawSink> make_output_sink(const std::string& directory, const json& config, OutputFormats formats,
                                           const json& training_log) {
  auto list = std::make_unique<SinkList>();
  if (formats.csv) list->add(std::make_unique<StanCsvStream>(directory, config));
  if (formats.netcdf) list->add(std::make_unique<NetcdfStream>(directory, config, training_log));
  return list;
}

NetcdfStream::NetcdfStream(std::string directory, json config, json training_log)
    : directory_(std::move(directory)), config_(std::move(config)), training_log_(std::move(training_log)) {
  ensure_directory(directory_);
}

NetcdfStream::~NetcdfStream() = default;

void NetcdfStream::append(const SampleResult& r, int64_t from, int64_t to) {
  const bool nuts = r.tree_depth.defined();
  if (!writer_) {
    std::vector<StatColumn> stats = {{"lp", StatColumn::Kind::kFloat},
                                     {"acceptance_rate", StatColumn::Kind::kFloat},
                                     {"step_size", StatColumn::Kind::kFloat},
                                     {"diverging", StatColumn::Kind::kBool},
                                     {"n_steps", StatColumn::Kind::kInt}};
    if (nuts) {
      stats.push_back({"tree_depth", StatColumn::Kind::kInt});
      stats.push_back({"energy", StatColumn::Kind::kFloat});
    }
    json attrs;
    for (const auto& [key, value] : config_.items()) attrs[key.rfind("nmcmc_", 0) == 0 ? key : "nmcmc_" + key] = value;
    attrs["nmcmc_complete"] = false;  // until finish() says otherwise
    std::vector<std::string> names = r.names;
    if (names.empty())
      for (int64_t k = 0; k < r.draws.size(2); ++k) names.push_back(fmt::format("x.{}", k + 1));
    writer_ = std::make_unique<InferenceDataWriter>((fs::path(directory_) / "inference_data.nc").string(), r.lp.size(1),
                                                    names, stats, attrs);
    if (training_log_.is_array() && !training_log_.empty()) {
      writer_->add_table("nmcmc_training", training_log_columns(training_log_),
                         {{"description", "the learned sampler's training log: one row per logged training step"}});
    }
  }
  const int64_t n = to - from, c = r.lp.size(1);
  torch::Tensor n_steps = r.n_grad_chain.defined() ? r.n_grad_chain.narrow(0, from, n)
                                                   : r.n_grad.narrow(0, from, n).unsqueeze(1).expand({n, c});
  std::map<std::string, torch::Tensor> stats = {
      {"lp", r.lp.narrow(0, from, n)},
      {"acceptance_rate", r.accept_stat.narrow(0, from, n)},
      {"step_size", r.step_size_chain.defined() ? r.step_size_chain.unsqueeze(0).expand({n, c}).contiguous()
                                                : torch::full({n, c}, r.step_size, torch::kFloat64)},
      {"diverging", r.divergent.narrow(0, from, n)},
      {"n_steps", n_steps}};
  if (nuts) {
    stats["tree_depth"] = r.tree_depth.narrow(0, from, n);
    stats["energy"] = r.energy.narrow(0, from, n);
  }
  writer_->append(r.draws.narrow(0, from, n), stats);
}

void NetcdfStream::finish(const SampleResult& r) {
  if (!writer_) return;  // nothing drawn
  writer_->finish({{"nmcmc_complete", r.complete},
                   {"nmcmc_draws_planned", r.draws_planned},
                   {"nmcmc_draws_written", writer_->draws_written()},
                   {"nmcmc_seconds_warmup", r.seconds_warmup},
                   {"nmcmc_seconds_sampling", r.seconds_sampling}});
  writer_.reset();
}

ChainDraws chain_draws(const SampleResult& r, int64_t k) {
  ChainDraws cd;
  cd.x = r.draws.select(1, k);
  cd.lp = r.lp.select(1, k);
  cd.accept_stat = r.accept_stat.select(1, k);
  cd.n_grad = r.n_grad_chain.defined() ? r.n_grad_chain.select(1, k) : r.n_grad;
  cd.divergent = r.divergent.select(1, k);
  if (r.tree_depth.defined()) cd.tree_depth = r.tree_depth.select(1, k);
  if (r.energy.defined()) cd.energy = r.energy.select(1, k);
  cd.step_size = r.step_size_chain.defined() ? r.step_size_chain[k].item<double>() : r.step_size;
  cd.inv_mass = r.inv_mass_chain.defined() ? r.inv_mass_chain[k] : r.inv_mass;
  cd.names = r.names;
  return cd;
}

void write_run(const std::string& directory, const json& config, const SampleResult& r, const json& summary,
               bool draws_written, OutputFormats formats, const json& training_log) {
  ensure_directory(directory);
  if (!draws_written && r.draws.defined()) {
    std::unique_ptr<DrawSink> sink = make_output_sink(directory, config, formats, training_log);
    if (r.draws.size(0) > 0) sink->append(r, 0, r.draws.size(0));
    sink->finish(r);
  }
  json out = summary;
  out["config"] = config;
  write_atomically((std::filesystem::path(directory) / "summary.json").string(),
                   [&](std::ostream& os) { os << out.dump(2) << "\n"; });
}

StanCsvStream::StanCsvStream(std::string directory, json config, int64_t first_chain)
    : directory_(std::move(directory)), config_(std::move(config)), first_chain_(first_chain) {
  ensure_directory(directory_);
}

std::string StanCsvStream::path(int64_t chain, bool part) const {
  return (fs::path(directory_) / fmt::format("chain_{}.csv{}", first_chain_ + chain + 1, part ? ".part" : "")).string();
}

void StanCsvStream::append(const SampleResult& r, int64_t from, int64_t to) {
  const int64_t c = r.lp.size(1);
  std::string text;
  for (int64_t k = 0; k < c; ++k) {
    ChainDraws cd = chain_draws(r, k);
    text.clear();
    if (!started_) {
      json cfg = config_;
      cfg["chain_id"] = first_chain_ + k + 1;
      text = stan_csv_header(cfg, cd);
    }
    append_stan_csv_rows(text, cd.rows(from, to - from));
    std::ofstream out(path(k, true), started_ ? std::ios::app : std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw IoError("cannot write '" + path(k, true) + "'");
  }
  started_ = true;
}

void StanCsvStream::finish(const SampleResult& r) {
  if (!started_) return;  // nothing drawn
  const int64_t c = r.lp.size(1);
  std::string trailer = stan_csv_trailer(r.seconds_warmup, r.seconds_sampling);
  if (!r.complete) {
    trailer += fmt::format("# nmcmc: incomplete run: {} of {} draws (interrupted)\n", r.lp.size(0), r.draws_planned);
  }
  for (int64_t k = 0; k < c; ++k) {
    {
      std::ofstream out(path(k, true), std::ios::app);
      out << trailer;
      out.flush();
      if (!out) throw IoError("cannot write '" + path(k, true) + "'");
    }
    std::error_code ec;
    fs::rename(path(k, true), path(k, false), ec);
    if (ec) throw IoError("cannot rename '" + path(k, true) + "': " + ec.message());
  }
}

const std::vector<std::string>& training_log_fields() {
  static const std::vector<std::string> fields = {"step", "loss",    "accept",  "beta",    "entropy", "eps",
                                                  "lr",   "seconds", "grads",   "skipped", "elapsed"};
  return fields;
}

std::map<std::string, std::vector<double>> training_log_columns(const json& rows) {
  std::map<std::string, std::vector<double>> columns;
  const auto& fields = training_log_fields();
  for (const auto& row : rows) {
    if (!row.is_array() || row.size() != fields.size()) throw DataError("training log: malformed row " + row.dump());
    for (size_t k = 0; k < fields.size(); ++k)
      columns[fields[k]].push_back(row[k].is_number() ? row[k].get<double>() : std::nan(""));
  }
  return columns;
}

}  // namespace nmcmc
