// Figure descriptions for matplotlib (see plot.hpp and scripts/nmcmc_plot.py).
#include "nmcmc/io/plot.hpp"

#include <fmt/format.h>

#include <cmath>

#include "nmcmc/io/atomic_file.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {
std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]); }

/// JSON has no NaN or infinity: they become null (matplotlib leaves a gap).
json numbers(const std::vector<double>& v) {
  json out = json::array();
  for (double x : v) out.push_back(std::isfinite(x) ? json(x) : json(nullptr));
  return out;
}

}  // namespace

Rgb palette(int i) {
  static const Rgb colours[] = {{0, 114, 178}, {213, 94, 0}, {0, 158, 115}, {204, 121, 167},
                                {230, 159, 0}, {86, 180, 233}, {0, 0, 0}, {240, 228, 66}};
  return colours[((i % 8) + 8) % 8];
}

Plot::Plot(std::string title) : title_(std::move(title)) {}

Plot& Plot::line(std::vector<double> x, std::vector<double> y, Rgb colour, std::string label) {
  series_.push_back({{"kind", "line"}, {"x", numbers(x)}, {"y", numbers(y)}, {"colour", hex(colour)}, {"label", label}});
  return *this;
}

Plot& Plot::scatter(std::vector<double> x, std::vector<double> y, Rgb colour, double size, std::string label,
                    double alpha) {
  series_.push_back({{"kind", "scatter"}, {"x", numbers(x)}, {"y", numbers(y)}, {"colour", hex(colour)},
                     {"size", size}, {"alpha", alpha}, {"label", label}});
  return *this;
}

Plot& Plot::shade(std::function<double(double, double)> density, std::string label) {
  if (xlim_.size() != 2 || ylim_.size() != 2) throw std::logic_error("Plot::shade needs xlim and ylim first");
  const int n = 160;
  json rows = json::array();
  double top = 0;
  std::vector<std::vector<double>> grid(n, std::vector<double>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const double x = xlim_[0] + (xlim_[1] - xlim_[0]) * (j + 0.5) / n, y = ylim_[0] + (ylim_[1] - ylim_[0]) * (i + 0.5) / n;
      const double d = density(x, y);
      grid[i][j] = std::isfinite(d) ? d : 0.0;
      top = std::max(top, grid[i][j]);
    }
  for (auto& row : grid) {
    for (double& v : row) v = top > 0 ? std::round(v / top * 1000.0) / 1000.0 : 0.0;
    rows.push_back(row);
  }
  series_.insert(series_.begin(), json{{"kind", "density"},
                                       {"extent", {xlim_[0], xlim_[1], ylim_[0], ylim_[1]}},
                                       {"values", rows},
                                       {"label", label}});
  return *this;
}

json Plot::to_json() const {
  json p = {{"title", title_}, {"xlabel", xlabel_}, {"ylabel", ylabel_}, {"log_y", log_y_}, {"robust_y", robust_y_},
            {"series", series_}};
  if (!xlim_.empty()) p["xlim"] = xlim_;
  if (!ylim_.empty()) p["ylim"] = ylim_;
  return p;
}

std::string figure_spec_path(const std::string& path) {
  const std::string png = ".png";
  const bool has_png = path.size() > png.size() && path.compare(path.size() - png.size(), png.size(), png) == 0;
  return (has_png ? path.substr(0, path.size() - png.size()) : path) + ".figure.json";
}

void save_figure_spec(const std::string& path, json spec) {
  const std::string spec_path = figure_spec_path(path);
  write_atomically(spec_path, [&](std::ostream& os) { os << spec.dump() << "\n"; });
}

void save_figure(const std::string& path, const std::vector<Plot>& panels, int columns, const std::string& title,
                 const std::string& caption, std::pair<double, double> panel_size) {
  if (panels.empty()) return;
  json spec = {{"type", "panels"}, {"columns", columns > 0 ? columns : static_cast<int>(panels.size())},
               {"title", title}, {"caption", caption}, {"panels", json::array()}};
  if (panel_size.first > 0 && panel_size.second > 0) spec["panel_size"] = {panel_size.first, panel_size.second};
  for (const auto& p : panels) spec["panels"].push_back(p.to_json());
  save_figure_spec(path, std::move(spec));
}

}  // namespace nmcmc
