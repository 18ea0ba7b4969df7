// ArviZ InferenceData in NetCDF-4, written as the draws come (see netcdf.hpp).
#include "nmcmc/io/netcdf.hpp"

#if NMCMC_HAVE_NETCDF
#include <netcdf.h>
#endif

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/version.hpp"

namespace nmcmc {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool netcdf_available() { return NMCMC_HAVE_NETCDF != 0; }

namespace {
#if NMCMC_HAVE_NETCDF
void check(int status, const std::string& what) {
  if (status != NC_NOERR) throw IoError(fmt::format("NetCDF: {}: {}", what, nc_strerror(status)));
}
#endif

std::string sanitise(const std::string& name) {
  std::string out;
  for (char ch : name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '@' || ch == '+' || ch == '-';
    out += ok ? ch : '_';
  }
  if (out.empty() || !(std::isalpha(static_cast<unsigned char>(out[0])) || out[0] == '_')) out = "_" + out;
  return out;
}

[[maybe_unused]] std::string iso_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}", buffer, micros);
}

/// The attributes ArviZ puts on every group, beside the given ones.
[[maybe_unused]] json with_standard_attributes(json attributes) {
  attributes["created_at"] = iso_now();
  attributes["inference_library"] = "nmcmc";
  attributes["inference_library_version"] = NMCMC_VERSION;
  return attributes;
}

/// Chunk shape (chains per chunk, draws per chunk) for a [C, draw, k] variable: about 1 MB
/// chunks, and a slab of all chains' chunks of about 8 MB, so that appends of any length touch
/// few chunks and the chunk cache (set to two slabs) holds them.
[[maybe_unused]] std::pair<size_t, size_t> chunk_shape(int64_t chains, int64_t k) {
  const double row = 8.0 * static_cast<double>(k);  // bytes of one draw of one chain
  const int64_t draws = std::clamp<int64_t>(static_cast<int64_t>((8 << 20) / (row * static_cast<double>(chains))), 1, 1024);
  const int64_t per_chunk = std::clamp<int64_t>(static_cast<int64_t>((1 << 20) / (row * static_cast<double>(draws))), 1, chains);
  return {static_cast<size_t>(per_chunk), static_cast<size_t>(draws)};
}
}  // namespace

PosteriorLayout posterior_layout(const std::vector<std::string>& labels) {
  static const std::regex indexed(R"((.+)\.([0-9]+))");
  PosteriorLayout layout;
  const int64_t d = static_cast<int64_t>(labels.size());
  for (int64_t i = 0; i < d;) {
    std::smatch m;
    PosteriorVariable v;
    v.first = i;
    if (std::regex_match(labels[i], m, indexed) && m[2] == "1") {
      const std::string base = m[1];
      int64_t k = 1;
      while (i + k < d && labels[i + k] == fmt::format("{}.{}", base, k + 1)) ++k;
      v.name = sanitise(base);
      v.size = k;
      v.vector = true;
      i += k;
    } else {
      v.name = sanitise(labels[i]);
      ++i;
    }
    layout.variables.push_back(v);
  }
  // One-to-one: no name twice, none clashing with the dimensions and coordinates.
  std::set<std::string> taken = {"chain", "draw"};
  bool unique = true;
  for (const auto& v : layout.variables) {
    unique = unique && taken.insert(v.name).second;
    if (v.vector) unique = unique && taken.insert(v.name + "_dim_0").second;
  }
  if (!unique) {
    layout.variables = {PosteriorVariable{"x", 0, d, true}};
    layout.labelled = true;
  }
  return layout;
}

#if NMCMC_HAVE_NETCDF
InferenceDataWriter::InferenceDataWriter(std::string path, int64_t chains, std::vector<std::string> labels,
                                         std::vector<StatColumn> stats, const json& attributes)
    : path_(std::move(path)), chains_(chains), dim_(static_cast<int64_t>(labels.size())), stats_(std::move(stats)) {
  const std::string part = path_ + ".part";
  check(nc_create(part.c_str(), NC_NETCDF4 | NC_CLOBBER, &ncid_), "cannot create '" + part + "'");
  layout_ = posterior_layout(labels);
  check(nc_def_grp(ncid_, "posterior", &posterior_), "posterior group");
  check(nc_def_grp(ncid_, "sample_stats", &stats_group_), "sample_stats group");
  groups_ = {ncid_, posterior_, stats_group_};
  const json attrs = with_standard_attributes(attributes);
  for (int g : groups_) put_attributes(g, attrs);

  // Dimensions chain and draw in each group, with coordinate variables.
  std::vector<int64_t> chain_ids(chains_);
  for (int64_t c = 0; c < chains_; ++c) chain_ids[c] = c;
  auto define_axes = [&](int group, int& chain_dim, int& draw_dim, int& draw_var) {
    check(nc_def_dim(group, "chain", static_cast<size_t>(chains_), &chain_dim), "chain dimension");
    check(nc_def_dim(group, "draw", NC_UNLIMITED, &draw_dim), "draw dimension");
    int chain_var = -1;
    check(nc_def_var(group, "chain", NC_INT64, 1, &chain_dim, &chain_var), "chain coordinate");
    check(nc_put_var_longlong(group, chain_var, reinterpret_cast<const long long*>(chain_ids.data())), "chain coordinate");
    check(nc_def_var(group, "draw", NC_INT64, 1, &draw_dim, &draw_var), "draw coordinate");
    const size_t chunk = 4096;
    check(nc_def_var_chunking(group, draw_var, NC_CHUNKED, &chunk), "draw chunking");
  };
  int chain_dim = -1, draw_dim = -1;
  define_axes(posterior_, chain_dim, draw_dim, draw_var_posterior_);
  const size_t cache_total = size_t{256} << 20;
  const size_t n_vars = layout_.variables.size() + stats_.size();
  for (const auto& v : layout_.variables) {
    std::vector<int> dims = {chain_dim, draw_dim};
    if (v.vector) {
      const std::string dim_name = layout_.labelled ? "parameter" : v.name + "_dim_0";
      int dim_id = -1, coord = -1;
      check(nc_def_dim(posterior_, dim_name.c_str(), static_cast<size_t>(v.size), &dim_id), dim_name + " dimension");
      if (layout_.labelled) {
        check(nc_def_var(posterior_, dim_name.c_str(), NC_STRING, 1, &dim_id, &coord), "parameter coordinate");
        std::vector<const char*> names;
        for (const auto& l : labels) names.push_back(l.c_str());
        check(nc_put_var_string(posterior_, coord, names.data()), "parameter coordinate");
      } else {
        check(nc_def_var(posterior_, dim_name.c_str(), NC_INT64, 1, &dim_id, &coord), dim_name + " coordinate");
        std::vector<long long> index(v.size);
        for (int64_t k = 0; k < v.size; ++k) index[k] = k;
        check(nc_put_var_longlong(posterior_, coord, index.data()), dim_name + " coordinate");
      }
      dims.push_back(dim_id);
    }
    int var = -1;
    check(nc_def_var(posterior_, v.name.c_str(), NC_DOUBLE, static_cast<int>(dims.size()), dims.data(), &var),
          "variable '" + v.name + "'");
    const auto [per_chunk, draws] = chunk_shape(chains_, v.size);
    std::vector<size_t> chunks = {per_chunk, draws};
    if (v.vector) chunks.push_back(static_cast<size_t>(v.size));
    check(nc_def_var_chunking(posterior_, var, NC_CHUNKED, chunks.data()), "chunking of '" + v.name + "'");
    const size_t slab = static_cast<size_t>(chains_) * draws * static_cast<size_t>(v.size) * 8;
    check(nc_set_var_chunk_cache(posterior_, var, std::min(2 * slab + (64 << 10), cache_total / n_vars + (1 << 20)), 1009, 0.75f),
          "chunk cache");
    posterior_vars_.push_back(var);
  }
  int stats_chain = -1, stats_draw = -1;
  define_axes(stats_group_, stats_chain, stats_draw, draw_var_stats_);
  for (const auto& s : stats_) {
    const int dims[2] = {stats_chain, stats_draw};
    const nc_type type = s.kind == StatColumn::Kind::kFloat ? NC_DOUBLE : s.kind == StatColumn::Kind::kInt ? NC_INT64 : NC_BYTE;
    int var = -1;
    check(nc_def_var(stats_group_, s.name.c_str(), type, 2, dims, &var), "statistic '" + s.name + "'");
    const auto [per_chunk, draws] = chunk_shape(chains_, 1);
    const size_t chunks[2] = {per_chunk, draws};
    check(nc_def_var_chunking(stats_group_, var, NC_CHUNKED, chunks), "chunking of '" + s.name + "'");
    if (s.kind == StatColumn::Kind::kBool) check(nc_put_att_text(stats_group_, var, "dtype", 4, "bool"), "bool attribute");
    stat_vars_.push_back(var);
  }
  check(nc_enddef(ncid_), "end of definitions");
  check(nc_sync(ncid_), "sync");
}

InferenceDataWriter::~InferenceDataWriter() {
  if (ncid_ >= 0) nc_close(ncid_);  // unfinished: the .part stays, with what was synced
}

void InferenceDataWriter::put_attributes(int group, const json& attributes) {
  for (const auto& [key, value] : attributes.items()) {
    if (value.is_string()) {
      const std::string s = value.get<std::string>();
      check(nc_put_att_text(group, NC_GLOBAL, key.c_str(), s.size(), s.c_str()), "attribute " + key);
    } else if (value.is_boolean() || value.is_number_integer()) {
      const long long v = value.is_boolean() ? (value.get<bool>() ? 1 : 0) : value.get<long long>();
      check(nc_put_att_longlong(group, NC_GLOBAL, key.c_str(), NC_INT64, 1, &v), "attribute " + key);
    } else if (value.is_number()) {
      const double v = value.get<double>();
      check(nc_put_att_double(group, NC_GLOBAL, key.c_str(), NC_DOUBLE, 1, &v), "attribute " + key);
    } else if (!value.is_null()) {
      const std::string s = value.dump();  // objects and arrays as JSON text
      check(nc_put_att_text(group, NC_GLOBAL, key.c_str(), s.size(), s.c_str()), "attribute " + key);
    }
  }
}

void InferenceDataWriter::append(const torch::Tensor& x, const std::map<std::string, torch::Tensor>& stats) {
  TORCH_CHECK(ncid_ >= 0, "InferenceDataWriter: append after finish");
  TORCH_CHECK(x.dim() == 3 && x.size(1) == chains_ && x.size(2) == dim_, "InferenceDataWriter: draws must be [n, C, D]");
  const int64_t n = x.size(0);
  if (n == 0) return;
  const size_t from = static_cast<size_t>(written_), count = static_cast<size_t>(n);
  std::vector<long long> draw_ids(n);
  for (int64_t i = 0; i < n; ++i) draw_ids[i] = written_ + i;
  for (auto [group, var] : {std::pair{posterior_, draw_var_posterior_}, std::pair{stats_group_, draw_var_stats_}})
    check(nc_put_vara_longlong(group, var, &from, &count, draw_ids.data()), "draw coordinate");
  for (size_t k = 0; k < layout_.variables.size(); ++k) {
    const auto& v = layout_.variables[k];
    torch::Tensor block = x.narrow(2, v.first, v.size).to(torch::kCPU, torch::kFloat64).permute({1, 0, 2}).contiguous();
    const size_t start[3] = {0, from, 0};
    const size_t counts[3] = {static_cast<size_t>(chains_), count, static_cast<size_t>(v.size)};
    check(nc_put_vara_double(posterior_, posterior_vars_[k], start, counts, block.data_ptr<double>()), "writing '" + v.name + "'");
  }
  for (size_t k = 0; k < stats_.size(); ++k) {
    const auto it = stats.find(stats_[k].name);
    TORCH_CHECK(it != stats.end(), "InferenceDataWriter: statistic '", stats_[k].name, "' not given");
    TORCH_CHECK(it->second.dim() == 2 && it->second.size(0) == n && it->second.size(1) == chains_,
                "InferenceDataWriter: statistic '", stats_[k].name, "' must be [n, C]");
    torch::Tensor t = it->second.to(torch::kCPU).t();  // [C, n]
    const size_t start[2] = {0, from};
    const size_t counts[2] = {static_cast<size_t>(chains_), count};
    const std::string what = "writing '" + stats_[k].name + "'";
    switch (stats_[k].kind) {
      case StatColumn::Kind::kFloat: {
        torch::Tensor v = t.to(torch::kFloat64).contiguous();
        check(nc_put_vara_double(stats_group_, stat_vars_[k], start, counts, v.data_ptr<double>()), what);
        break;
      }
      case StatColumn::Kind::kInt: {
        torch::Tensor v = t.to(torch::kInt64).contiguous();
        check(nc_put_vara_longlong(stats_group_, stat_vars_[k], start, counts, reinterpret_cast<long long*>(v.data_ptr<int64_t>())), what);
        break;
      }
      case StatColumn::Kind::kBool: {
        torch::Tensor v = t.to(torch::kInt8).contiguous();
        check(nc_put_vara_schar(stats_group_, stat_vars_[k], start, counts, reinterpret_cast<signed char*>(v.data_ptr<int8_t>())), what);
        break;
      }
    }
  }
  written_ += n;
  check(nc_sync(ncid_), "sync");
}

void InferenceDataWriter::add_table(const std::string& name, const std::map<std::string, std::vector<double>>& columns,
                                    const json& attributes) {
  TORCH_CHECK(ncid_ >= 0, "InferenceDataWriter: add_table after finish");
  int group = -1, dim = -1;
  check(nc_def_grp(ncid_, sanitise(name).c_str(), &group), "group '" + name + "'");
  size_t rows = columns.empty() ? 0 : columns.begin()->second.size();
  check(nc_def_dim(group, "step", rows, &dim), "step dimension");
  put_attributes(group, with_standard_attributes(attributes));
  std::vector<std::pair<int, const std::vector<double>*>> vars;
  for (const auto& [column, values] : columns) {
    TORCH_CHECK(values.size() == rows, "InferenceDataWriter: table columns differ in length");
    int var = -1;
    check(nc_def_var(group, sanitise(column).c_str(), NC_DOUBLE, 1, &dim, &var), "column '" + column + "'");
    vars.emplace_back(var, &values);
  }
  check(nc_enddef(group), "end of definitions");
  for (auto [var, values] : vars)
    if (rows) check(nc_put_var_double(group, var, values->data()), "writing table '" + name + "'");
  groups_.push_back(group);
  check(nc_sync(ncid_), "sync");
}

void InferenceDataWriter::finish(const json& attributes) {
  TORCH_CHECK(ncid_ >= 0, "InferenceDataWriter: finish twice");
  check(nc_redef(ncid_), "attributes");
  for (int g : groups_) put_attributes(g, attributes);
  check(nc_close(ncid_), "closing '" + path_ + ".part'");
  ncid_ = -1;
  std::error_code ec;
  fs::rename(path_ + ".part", path_, ec);
  if (ec) throw IoError("cannot rename '" + path_ + ".part': " + ec.message());
}

#else
// Built without NetCDF-4 (Note [A build without Debian's packages] in CMakeLists.txt): the
// writer refuses, with one message; OutputFormats leaves NetCDF out by default.
InferenceDataWriter::InferenceDataWriter(std::string path, int64_t chains, std::vector<std::string> labels,
                                         std::vector<StatColumn> stats, const json& attributes)
    : path_(std::move(path)), chains_(chains), dim_(static_cast<int64_t>(labels.size())), stats_(std::move(stats)) {
  throw UsageError("ArviZ InferenceData (NetCDF-4) cannot be written: this nmcmc was built without NetCDF "
                   "(Debian's libnetcdf-dev); write Stan CSV instead (--format csv)");
}
InferenceDataWriter::~InferenceDataWriter() = default;
void InferenceDataWriter::put_attributes(int, const json&) {}
void InferenceDataWriter::append(const torch::Tensor&, const std::map<std::string, torch::Tensor>&) {}
void InferenceDataWriter::add_table(const std::string&, const std::map<std::string, std::vector<double>>&, const json&) {}
void InferenceDataWriter::finish(const json&) {}
#endif

}  // namespace nmcmc
