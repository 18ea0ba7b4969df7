#include "nmcmc/io/plot.hpp"

#include <stb/stb_easy_font.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "nmcmc/io/atomic_file.hpp"

namespace nmcmc {

Rgb palette(int i) {
  static const Rgb colours[] = {{0, 114, 178}, {213, 94, 0}, {0, 158, 115}, {204, 121, 167},
                                {230, 159, 0}, {86, 180, 233}, {0, 0, 0}, {240, 228, 66}};
  return colours[((i % 8) + 8) % 8];
}

Plot::Plot(int width, int height, std::string title) : width_(width), height_(height), title_(std::move(title)) {}

Plot& Plot::line(std::vector<double> x, std::vector<double> y, Rgb colour, std::string label) {
  series_.push_back({std::move(x), std::move(y), colour, std::move(label), false, 0, 1});
  return *this;
}

Plot& Plot::scatter(std::vector<double> x, std::vector<double> y, Rgb colour, double radius, std::string label,
                    double alpha) {
  series_.push_back({std::move(x), std::move(y), colour, std::move(label), true, radius, alpha});
  return *this;
}

Plot& Plot::shade(std::function<double(double, double)> density) {
  shade_ = std::move(density);
  return *this;
}

namespace {
struct Canvas {
  int w, h;
  std::vector<unsigned char> px;
  Canvas(int w_, int h_) : w(w_), h(h_), px(static_cast<size_t>(w_) * h_ * 3, 255) {}
  void blend(int x, int y, Rgb c, double a) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    unsigned char* p = &px[(static_cast<size_t>(y) * w + x) * 3];
    for (int k = 0; k < 3; ++k) p[k] = static_cast<unsigned char>(std::lround(p[k] * (1 - a) + c[k] * a));
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) blend(x, y, c, 1.0);
  }
  void segment(double x0, double y0, double x1, double y1, Rgb c, double width = 1.5) {
    const double len = std::hypot(x1 - x0, y1 - y0);
    const int n = std::max(1, static_cast<int>(len * 2));
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n, x = x0 + t * (x1 - x0), y = y0 + t * (y1 - y0);
      disc(x, y, width / 2, c, 1.0);
    }
  }
  void disc(double cx, double cy, double r, Rgb c, double a) {
    const int r_int = static_cast<int>(std::ceil(r + 1));
    for (int dy = -r_int; dy <= r_int; ++dy)
      for (int dx = -r_int; dx <= r_int; ++dx) {
        const double d = std::hypot(dx + std::lround(cx) - cx, dy + std::lround(cy) - cy);
        const double cover = std::clamp(r + 0.5 - d, 0.0, 1.0);
        if (cover > 0) blend(static_cast<int>(std::lround(cx)) + dx, static_cast<int>(std::lround(cy)) + dy, c, a * cover);
      }
  }
  /// Text with stb_easy_font at integer scale; returns the width in pixels.
  int text(int x, int y, const std::string& s, Rgb c, int scale = 1, bool measure_only = false) {
    if (measure_only) return stb_easy_font_width(const_cast<char*>(s.c_str())) * scale;
    static char buffer[200000];
    const int quads = stb_easy_font_print(0, 0, const_cast<char*>(s.c_str()), nullptr, buffer, sizeof(buffer));
    const float* v = reinterpret_cast<const float*>(buffer);
    for (int q = 0; q < quads; ++q) {
      const float* quad = v + q * 16;  // 4 vertices of (x, y, z, colour)
      const int qx0 = static_cast<int>(quad[0]), qy0 = static_cast<int>(quad[1]);
      const int qx1 = static_cast<int>(quad[8]), qy1 = static_cast<int>(quad[9]);
      rect(x + qx0 * scale, y + qy0 * scale, x + qx1 * scale - 1, y + qy1 * scale - 1, c);
    }
    return stb_easy_font_width(const_cast<char*>(s.c_str())) * scale;
  }
};

std::string tick_label(double v) {
  char buf[32];
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e4 || a < 1e-3) std::snprintf(buf, sizeof buf, "%.0e", v);
  else std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
  std::vector<double> ticks;
  if (!(hi > lo)) return ticks;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) ticks.push_back(std::abs(t) < 1e-12 * step ? 0 : t);
  return ticks;
}
}  // namespace

std::vector<unsigned char> Plot::render() const {
  Canvas cv(width_, height_);
  const int left = 62, right = 14, top = 30, bottom = 44;
  const int pw = width_ - left - right, ph = height_ - top - bottom;
  // Data ranges.
  double xlo = xlo_, xhi = xhi_, ylo = ylo_, yhi = yhi_;
  auto ty = [&](double y) { return log_y_ ? std::log10(std::max(y, 1e-300)) : y; };
  if (!fixed_x_ || !fixed_y_) {
    double ax = std::numeric_limits<double>::infinity(), bx = -ax, ay = ax, by = -ax;
    for (const auto& s : series_)
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (log_y_ && s.y[i] <= 0)) continue;
        ax = std::min(ax, s.x[i]);
        bx = std::max(bx, s.x[i]);
        ay = std::min(ay, ty(s.y[i]));
        by = std::max(by, ty(s.y[i]));
      }
    if (!std::isfinite(ax)) ax = 0, bx = 1, ay = 0, by = 1;
    if (bx - ax < 1e-12) ax -= 0.5, bx += 0.5;
    if (by - ay < 1e-12) ay -= 0.5, by += 0.5;
    if (!fixed_x_) xlo = ax - 0.03 * (bx - ax), xhi = bx + 0.03 * (bx - ax);
    if (!fixed_y_) ylo = ay - 0.05 * (by - ay), yhi = by + 0.05 * (by - ay);
  } else if (log_y_) {
    ylo = std::log10(ylo);
    yhi = std::log10(yhi);
  }
  auto px = [&](double x) { return left + (x - xlo) / (xhi - xlo) * pw; };
  auto py = [&](double y) { return top + ph - (ty(y) - ylo) / (yhi - ylo) * ph; };
  if (shade_) {
    std::vector<double> d(static_cast<size_t>(pw) * ph);
    double mx = 0;
    for (int j = 0; j < ph; ++j)
      for (int i = 0; i < pw; ++i) {
        const double x = xlo + (i + 0.5) / pw * (xhi - xlo), y = yhi - (j + 0.5) / ph * (yhi - ylo);
        const double v = shade_(x, log_y_ ? std::pow(10.0, y) : y);
        d[static_cast<size_t>(j) * pw + i] = std::isfinite(v) ? v : 0;
        mx = std::max(mx, d[static_cast<size_t>(j) * pw + i]);
      }
    for (int j = 0; j < ph; ++j)
      for (int i = 0; i < pw; ++i)
        cv.blend(left + i, top + j, {90, 90, 110}, mx > 0 ? 0.55 * d[static_cast<size_t>(j) * pw + i] / mx : 0);
  }
  // Grid and ticks.
  const Rgb grey{225, 225, 225}, dark{40, 40, 40};
  for (double t : nice_ticks(xlo, xhi)) {
    const double x = px(t);
    cv.segment(x, top, x, top + ph, grey, 1);
    const std::string s = tick_label(t);
    cv.text(static_cast<int>(x) - cv.text(0, 0, s, dark, 1, true) / 2, top + ph + 6, s, dark);
  }
  for (double t : nice_ticks(ylo, yhi)) {
    const double y = top + ph - (t - ylo) / (yhi - ylo) * ph;
    cv.segment(left, y, left + pw, y, grey, 1);
    const std::string s = log_y_ ? tick_label(std::pow(10.0, t)) : tick_label(t);
    cv.text(left - 6 - cv.text(0, 0, s, dark, 1, true), static_cast<int>(y) - 4, s, dark);
  }
  // Series, clipped to the plotting area.
  auto inside = [&](double x, double y) { return x >= left - 1 && x <= left + pw + 1 && y >= top - 1 && y <= top + ph + 1; };
  for (const auto& s : series_) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      const double x = px(s.x[i]), y = py(s.y[i]);
      if (s.points) {
        if (inside(x, y)) cv.disc(x, y, s.radius, s.colour, s.alpha);
      } else if (i > 0 && std::isfinite(s.x[i - 1]) && std::isfinite(s.y[i - 1])) {
        const double x0 = px(s.x[i - 1]), y0 = py(s.y[i - 1]);
        if (inside(x0, y0) && inside(x, y)) cv.segment(x0, y0, x, y, s.colour, 1.6);
      }
    }
  }
  // Frame, title, labels, legend.
  cv.segment(left, top, left + pw, top, dark, 1);
  cv.segment(left, top + ph, left + pw, top + ph, dark, 1);
  cv.segment(left, top, left, top + ph, dark, 1);
  cv.segment(left + pw, top, left + pw, top + ph, dark, 1);
  cv.text(left + pw / 2 - cv.text(0, 0, title_, dark, 2, true) / 2, 6, title_, dark, 2);
  cv.text(left + pw / 2 - cv.text(0, 0, xlabel_, dark, 1, true) / 2, height_ - 18, xlabel_, dark);
  cv.text(4, top - 12, ylabel_, dark);
  int ly = top + 8;
  for (const auto& s : series_) {
    if (s.label.empty()) continue;
    const int tw = cv.text(0, 0, s.label, dark, 1, true);
    const int x0 = left + pw - tw - 30;
    cv.rect(x0 - 4, ly - 3, left + pw - 4, ly + 9, {255, 255, 255});
    cv.segment(x0, ly + 3, x0 + 16, ly + 3, s.colour, 3);
    cv.text(x0 + 20, ly, s.label, dark);
    ly += 14;
  }
  return cv.px;
}

void save_png(const std::string& path, const std::vector<Plot>& panels, int columns) {
  if (panels.empty()) return;
  const int cols = columns > 0 ? columns : static_cast<int>(panels.size());
  const int rows = (static_cast<int>(panels.size()) + cols - 1) / cols;
  const int pw = panels[0].width(), ph = panels[0].height();
  const int w = pw * cols, h = ph * rows;
  std::vector<unsigned char> img(static_cast<size_t>(w) * h * 3, 255);
  for (size_t k = 0; k < panels.size(); ++k) {
    auto buf = panels[k].render();
    const int ox = static_cast<int>(k % cols) * pw, oy = static_cast<int>(k / cols) * ph;
    for (int y = 0; y < std::min(ph, panels[k].height()); ++y)
      std::copy_n(&buf[static_cast<size_t>(y) * panels[k].width() * 3], std::min(pw, panels[k].width()) * 3,
                  &img[(static_cast<size_t>(oy + y) * w + ox) * 3]);
  }
  write_atomically(path, [&](std::ostream& os) {
    auto sink = [](void* ctx, void* data, int size) { static_cast<std::ostream*>(ctx)->write(static_cast<char*>(data), size); };
    stbi_write_png_to_func(sink, &os, w, h, 3, img.data(), w * 3);
  });
}

}  // namespace nmcmc
