#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

namespace {
std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  for (char ch : line) {
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r' || ch == ';') {
      if (!field.empty()) out.push_back(field);
      field.clear();
    } else {
      field.push_back(ch);
    }
  }
  if (!field.empty()) out.push_back(field);
  return out;
}
}  // namespace

LabelledData load_labelled_table(const std::string& path, int label_column) {
  std::ifstream in(path);
  if (!in) throw DataError("cannot open data file '" + path + "'");
  std::vector<std::vector<double>> rows;
  std::string line;
  size_t line_no = 0, width = 0;
  while (std::getline(in, line)) {
    ++line_no;
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    auto fields = split_fields(line);
    if (width == 0) {
      width = fields.size();
      if (width < 2) throw DataError(path + ":" + std::to_string(line_no) + ": need at least 2 columns (features and a label)");
    } else if (fields.size() != width) {
      throw DataError(path + ":" + std::to_string(line_no) + ": expected " + std::to_string(width) + " columns, found " +
                      std::to_string(fields.size()));
    }
    std::vector<double> row(width);
    for (size_t k = 0; k < width; ++k) {
      char* end = nullptr;
      errno = 0;
      row[k] = std::strtod(fields[k].c_str(), &end);
      if (end == fields[k].c_str() || *end != '\0' || !std::isfinite(row[k])) {
        throw DataError(path + ":" + std::to_string(line_no) + ": column " + std::to_string(k + 1) +
                        " is not a finite number: '" + fields[k] + "'");
      }
    }
    rows.push_back(std::move(row));
  }
  if (rows.size() < 2) throw DataError("data file '" + path + "' has fewer than 2 data rows");
  const int64_t n = static_cast<int64_t>(rows.size()), w = static_cast<int64_t>(width);
  const int64_t label = label_column < 0 ? w + label_column : label_column;
  if (label < 0 || label >= w) {
    throw UsageError("label column " + std::to_string(label_column) + " is outside the " + std::to_string(w) +
                     " columns of '" + path + "'");
  }
  std::set<double> values;
  for (auto& r : rows) values.insert(r[label]);
  if (values.size() != 2) {
    throw DataError("label column " + std::to_string(label + 1) + " of '" + path + "' must hold exactly 2 distinct values, found " +
                    std::to_string(values.size()));
  }
  const double low = *values.begin();
  torch::Tensor features = torch::empty({n, w - 1}, torch::kFloat64);
  torch::Tensor labels = torch::empty({n}, torch::kFloat64);
  auto f = features.accessor<double, 2>();
  auto y = labels.accessor<double, 1>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t k = 0;
    for (int64_t j = 0; j < w; ++j) {
      if (j == label) continue;
      f[i][k++] = rows[i][j];
    }
    y[i] = rows[i][label] == low ? -1.0 : 1.0;
  }
  return {features, labels, path};
}

LogisticTarget::LogisticTarget(const LabelledData& data, nlohmann::json spec, double prior_sd,
                               std::optional<Moments> reference, torch::TensorOptions options)
    : Target(options), spec_(std::move(spec)), prior_var_(prior_sd * prior_sd), reference_(std::move(reference)) {
  torch::Tensor x = data.features;  // [N, F]
  torch::Tensor mean = x.mean(0), sd = x.std(0, /*unbiased=*/true);
  for (int64_t j = 0; j < sd.size(0); ++j) {
    if (!(sd[j].item<double>() > 0)) {
      throw DataError("feature column " + std::to_string(j + 1) + " of '" + data.source + "' is constant");
    }
  }
  torch::Tensor standardised = (x - mean) / sd;
  torch::Tensor design = torch::cat({torch::ones({x.size(0), 1}, torch::kFloat64), standardised}, 1);
  // Stored negated: t = y_n (b0 + x_n . b) enters only as softplus(-t) and sigmoid(-t), and
  // x (-A)^T = -(x A^T) exactly (negation is exact), so the products give -t with no separate
  // negation pass over the [C, N] matrix (two per gradient, a measurable share of a German training step).
  neg_design_ = (-(design * data.labels.unsqueeze(1))).to(options).contiguous();  // [N, D]: -y_n (1, x_n)
  dim_ = neg_design_.size(1);
  if (reference_) {
    TORCH_CHECK(reference_->mean.size(0) == dim_, "reference moments have the wrong dimension");
  }
}

torch::Tensor LogisticTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor s = torch::matmul(x, neg_design_.t());  // [C, N]: -t = -y_n (b0 + x_n . b)
  // -log sigmoid(t) = softplus(-t), stable for any t.
  return (x * x).sum(1) / (2.0 * prior_var_) + torch::softplus(s).sum(1);
}

EnergyGrad LogisticTarget::compute_energy_and_grad(const torch::Tensor& x, bool create_graph) const {
  torch::AutoGradMode mode(create_graph);
  torch::Tensor s = torch::matmul(x, neg_design_.t());  // [C, N]: -t
  torch::Tensor u = (x * x).sum(1) / (2.0 * prior_var_) + torch::softplus(s).sum(1);
  // d/dt softplus(-t) = -sigmoid(-t): the gradient is x / var - sigmoid(-t) A = x / var + sigmoid(-t) (-A).
  torch::Tensor g = x / prior_var_ + torch::matmul(torch::sigmoid(s), neg_design_);
  return {u, g};
}

}  // namespace nmcmc
