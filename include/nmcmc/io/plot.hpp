#pragma once
/// Figures, described here and drawn by matplotlib (scripts/nmcmc_plot.py).
//
// A figure is written as STEM.figure.json (the data and every label: a figure can always be
// drawn again, or drawn later on a machine with matplotlib). The library never runs Python: the
// `nmcmc` program draws the specs its command wrote as STEM.png and STEM.svg once the command
// ends, in one Python process (apps/process/nmcmc/process/figures.hpp), and `nmcmc figures DIR`
// draws any directory's.
#include <nlohmann/json.hpp>

#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace nmcmc {

using Rgb = std::array<unsigned char, 3>;
/// A qualitative palette (Okabe-Ito), readable by colour-blind readers.
Rgb palette(int i);

/// One panel: line and scatter series, an optional shaded density, axis labels (with units).
class Plot {
 public:
  explicit Plot(std::string title);
  Plot& xlabel(std::string s) { xlabel_ = std::move(s); return *this; }
  Plot& ylabel(std::string s) { ylabel_ = std::move(s); return *this; }
  Plot& xlim(double lo, double hi) { xlim_ = {lo, hi}; return *this; }
  Plot& ylim(double lo, double hi) { ylim_ = {lo, hi}; return *this; }
  Plot& log_y(bool on = true) { log_y_ = on; return *this; }
  /// The y axis shows the lines' 2-98 % range when a few points lie far off the rest.
  Plot& robust_y(bool on = true) { robust_y_ = on; return *this; }
  Plot& line(std::vector<double> x, std::vector<double> y, Rgb colour, std::string label = "");
  Plot& scatter(std::vector<double> x, std::vector<double> y, Rgb colour, double size = 2.0, std::string label = "",
                double alpha = 0.7);
  /// A grey background proportional to density(x, y) over the panel's limits (xlim and ylim
  /// must be set), evaluated on a grid here.
  Plot& shade(std::function<double(double, double)> density, std::string label = "target density");
  /// The panel as the plotting script reads it (see scripts/nmcmc_plot.py).
  nlohmann::json to_json() const;

 private:
  std::string title_, xlabel_, ylabel_;
  std::vector<double> xlim_, ylim_;
  bool log_y_ = false, robust_y_ = false;
  nlohmann::json series_ = nlohmann::json::array();
};

/// Writes panels (`columns` per row; 0: one row) as one figure: `path` names the PNG to be drawn
/// (STEM.png); STEM.figure.json is written now, atomically, and queued for drawing.
/// `panel_size`: width and height of each panel in inches (0: 4.6 x 3.3).
void save_figure(const std::string& path, const std::vector<Plot>& panels, int columns = 0,
                 const std::string& title = "", const std::string& caption = "",
                 std::pair<double, double> panel_size = {0, 0});
/// Writes any figure spec (e.g. {"type": "image_grid", ...}) for `path`.
void save_figure_spec(const std::string& path, nlohmann::json spec);
/// The spec path of a figure path: a/b.png -> a/b.figure.json.
std::string figure_spec_path(const std::string& path);

}  // namespace nmcmc
