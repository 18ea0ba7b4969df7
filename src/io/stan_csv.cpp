#include "nmcmc/io/stan_csv.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"

namespace nmcmc {

namespace {
void write_config_comments(std::ostream& out, const nlohmann::json& j, const std::string& prefix) {
  for (auto& [key, value] : j.items()) {
    if (value.is_object()) {
      write_config_comments(out, value, prefix + key + ".");
    } else {
      out << "# " << prefix << key << " = " << (value.is_string() ? value.get<std::string>() : value.dump()) << "\n";
    }
  }
}
}  // namespace

ChainDraws ChainDraws::rows(int64_t from, int64_t n) const {
  ChainDraws r = *this;
  for (torch::Tensor* t : {&r.x, &r.lp, &r.accept_stat, &r.n_grad, &r.divergent, &r.tree_depth, &r.energy}) {
    if (t->defined()) *t = t->narrow(0, from, n);
  }
  return r;
}

std::string stan_csv_header(const nlohmann::json& config, const ChainDraws& d) {
  std::ostringstream out;
  out << "# nmcmc Stan-CSV draws\n";
  write_config_comments(out, config, "");
  const int64_t dim = d.x.size(1);
  const bool nuts = d.tree_depth.defined();
  out << (nuts ? "lp__,accept_stat__,stepsize__,treedepth__,n_leapfrog__,divergent__,energy__"
               : "lp__,accept_stat__,stepsize__,n_grad__,divergent__");
  TORCH_CHECK(d.names.empty() || static_cast<int64_t>(d.names.size()) == dim, "write_stan_csv: ", d.names.size(),
              " names for ", dim, " parameters");
  for (int64_t j = 1; j <= dim; ++j) {
    if (d.names.empty()) out << ",x." << j;
    else out << "," << d.names[j - 1];
  }
  out << "\n";
  out << "# Adaptation terminated\n";
  out << fmt::format("# Step size = {:.9g}\n", d.step_size);
  if (d.inv_mass.defined() && d.inv_mass.dim() == 1) {
    out << "# Diagonal elements of inverse mass matrix:\n# ";
    auto m = d.inv_mass.to(torch::kFloat64).contiguous();
    auto ma = m.accessor<double, 1>();
    for (int64_t j = 0; j < ma.size(0); ++j) out << (j ? ", " : "") << fmt::format("{:.9g}", ma[j]);
    out << "\n";
  } else if (d.inv_mass.defined()) {
    out << "# Elements of inverse mass matrix:\n";
    auto m = d.inv_mass.to(torch::kFloat64).contiguous();
    auto ma = m.accessor<double, 2>();
    for (int64_t i = 0; i < ma.size(0); ++i) {
      out << "# ";
      for (int64_t j = 0; j < ma.size(1); ++j) out << (j ? ", " : "") << fmt::format("{:.9g}", ma[i][j]);
      out << "\n";
    }
  }
  return out.str();
}

void append_stan_csv_rows(std::string& out, const ChainDraws& d) {
  const int64_t s = d.x.size(0), dim = d.x.size(1);
  const bool nuts = d.tree_depth.defined();
  auto x = d.x.to(torch::kFloat64).contiguous();
  auto xa = x.accessor<double, 2>();
  auto lp = d.lp.to(torch::kFloat64).contiguous();
  auto acc = d.accept_stat.to(torch::kFloat64).contiguous();
  auto ng = d.n_grad.to(torch::kInt64).contiguous();
  auto dv = d.divergent.to(torch::kInt64).contiguous();
  auto lpa = lp.accessor<double, 1>();
  auto aca = acc.accessor<double, 1>();
  auto nga = ng.accessor<int64_t, 1>();
  auto dva = dv.accessor<int64_t, 1>();
  const torch::Tensor td = nuts ? d.tree_depth.to(torch::kInt64).contiguous() : torch::zeros({s}, torch::kInt64);
  const torch::Tensor en = nuts && d.energy.defined() ? d.energy.to(torch::kFloat64).contiguous() : torch::zeros({s}, torch::kFloat64);
  auto tda = td.accessor<int64_t, 1>();
  auto ena = en.accessor<double, 1>();
  fmt::memory_buffer buf;
  for (int64_t i = 0; i < s; ++i) {
    if (nuts) {
      fmt::format_to(std::back_inserter(buf), "{:.9g},{:.6g},{:.9g},{},{},{},{:.9g}", lpa[i], aca[i], d.step_size,
                     tda[i], nga[i], dva[i], ena[i]);
    } else {
      fmt::format_to(std::back_inserter(buf), "{:.9g},{:.6g},{:.9g},{},{}", lpa[i], aca[i], d.step_size, nga[i], dva[i]);
    }
    for (int64_t j = 0; j < dim; ++j) fmt::format_to(std::back_inserter(buf), ",{:.9g}", xa[i][j]);
    buf.push_back('\n');
  }
  out.append(buf.data(), buf.size());
}

std::string stan_csv_trailer(double elapsed_warmup, double elapsed_sampling) {
  std::string out = "#\n";
  out += fmt::format("#  Elapsed Time: {:.3f} seconds (Warm-up)\n", elapsed_warmup);
  out += fmt::format("#                {:.3f} seconds (Sampling)\n", elapsed_sampling);
  out += fmt::format("#                {:.3f} seconds (Total)\n", elapsed_warmup + elapsed_sampling);
  return out;
}

void write_stan_csv(const std::string& path, const nlohmann::json& config, const ChainDraws& d,
                    double elapsed_warmup, double elapsed_sampling) {
  write_atomically(path, [&](std::ostream& out) {
    out << stan_csv_header(config, d);
    std::string rows;
    const int64_t s = d.x.size(0), block = 4096;  // rows formatted a block at a time
    for (int64_t i = 0; i < s; i += block) {
      rows.clear();
      append_stan_csv_rows(rows, d.rows(i, std::min(block, s - i)));
      out << rows;
    }
    out << stan_csv_trailer(elapsed_warmup, elapsed_sampling);
  });
}

StanCsv read_stan_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError("cannot open '" + path + "'");
  StanCsv csv;
  std::vector<double> values;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      csv.comments.push_back(line);
      continue;
    }
    std::stringstream ss(line);
    std::string cell;
    if (csv.columns.empty()) {
      while (std::getline(ss, cell, ',')) csv.columns.push_back(cell);
      continue;
    }
    size_t count = 0;
    while (std::getline(ss, cell, ',')) {
      char* end = nullptr;
      double v = std::strtod(cell.c_str(), &end);
      if (end == cell.c_str() || *end != '\0') {
        throw DataError(path + ":" + std::to_string(line_no) + ": not a number: '" + cell + "'");
      }
      values.push_back(v);
      ++count;
    }
    if (count != csv.columns.size()) {
      throw DataError(path + ":" + std::to_string(line_no) + ": expected " + std::to_string(csv.columns.size()) +
                      " values, found " + std::to_string(count));
    }
  }
  if (csv.columns.empty()) throw DataError("'" + path + "' has no header line");
  const int64_t k = static_cast<int64_t>(csv.columns.size());
  csv.values = torch::tensor(values, torch::kFloat64).reshape({-1, k});
  return csv;
}

}  // namespace nmcmc
