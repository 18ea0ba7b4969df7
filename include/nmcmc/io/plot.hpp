#pragma once
/// A small raster plotter for the figures (PNG via stb_image_write, text via stb_easy_font):
/// line and scatter series, a shaded density background, axes with ticks, a legend, panels.
#include <array>
#include <functional>
#include <string>
#include <vector>

namespace nmcmc {

using Rgb = std::array<unsigned char, 3>;
/// A qualitative palette (Okabe-Ito), readable by colour-blind readers.
Rgb palette(int i);

class Plot {
 public:
  Plot(int width, int height, std::string title);
  Plot& xlabel(std::string s) { xlabel_ = std::move(s); return *this; }
  Plot& ylabel(std::string s) { ylabel_ = std::move(s); return *this; }
  Plot& xlim(double lo, double hi) { xlo_ = lo; xhi_ = hi; fixed_x_ = true; return *this; }
  Plot& ylim(double lo, double hi) { ylo_ = lo; yhi_ = hi; fixed_y_ = true; return *this; }
  Plot& log_y(bool on = true) { log_y_ = on; return *this; }
  Plot& line(std::vector<double> x, std::vector<double> y, Rgb colour, std::string label = "");
  Plot& scatter(std::vector<double> x, std::vector<double> y, Rgb colour, double radius = 2.0, std::string label = "",
                double alpha = 0.7);
  /// Grey-scale background proportional to density(x, y) (normalised to its maximum on the grid).
  Plot& shade(std::function<double(double, double)> density);
  /// Renders into an RGB buffer of width x height.
  std::vector<unsigned char> render() const;
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  struct Series {
    std::vector<double> x, y;
    Rgb colour;
    std::string label;
    bool points;
    double radius, alpha;
  };
  int width_, height_;
  std::string title_, xlabel_, ylabel_;
  double xlo_ = 0, xhi_ = 1, ylo_ = 0, yhi_ = 1;
  bool fixed_x_ = false, fixed_y_ = false, log_y_ = false;
  std::vector<Series> series_;
  std::function<double(double, double)> shade_;
};

/// Saves plots side by side (one row, `columns` per row) as one PNG, atomically.
void save_png(const std::string& path, const std::vector<Plot>& panels, int columns = 0);

}  // namespace nmcmc
