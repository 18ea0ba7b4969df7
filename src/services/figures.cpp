// The figures demo, reproduce and compare share (specs; apps/process draws them).
#include "nmcmc/services/figures.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/plot.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

namespace {
std::vector<double> to_vector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

void plot_training_curves(const std::string& path, const std::vector<TrainStats>& log, const std::string& title) {
  std::vector<double> step, accept, beta, entropy, loss, eps;
  for (const auto& s : log) {
    step.push_back(static_cast<double>(s.step));
    accept.push_back(s.accept);
    beta.push_back(s.beta);
    entropy.push_back(s.entropy);
    loss.push_back(s.loss);
    eps.push_back(s.eps);
  }
  std::vector<Plot> panels;
  panels.push_back(Plot("accept rate").xlabel("training step").ylabel("mean accept probability").line(step, accept, palette(0)));
  panels.push_back(Plot("entropy weight β").xlabel("training step").ylabel("β").log_y().line(step, beta, palette(1)));
  panels.push_back(Plot("proposal entropy").xlabel("training step").ylabel("entropy (nats, + const)").line(step, entropy, palette(2)));
  // The first steps' loss can be orders of magnitude above the rest: robust_y.
  panels.push_back(Plot("training loss").robust_y().xlabel("training step").ylabel("loss (minimised)").line(step, loss, palette(3)));
  panels.push_back(Plot("step size ε").xlabel("training step").ylabel("ε").log_y().line(step, eps, palette(4)));
  save_figure(path, panels, 3, title + ": training of the learned sampler");
}

void plot_traces(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dim,
                 int64_t max_steps, const std::string& ylabel) {
  std::vector<Plot> panels;
  int k = 0;
  double lo = INFINITY, hi = -INFINITY;  // one y range for all, so the samplers compare at a glance
  for (const auto& [name, draws] : runs) {
    const int64_t s = std::min<int64_t>(max_steps, draws.size(0));
    std::vector<double> t(s);
    for (int64_t i = 0; i < s; ++i) t[i] = static_cast<double>(i);
    std::vector<double> y = to_vector(draws.narrow(0, 0, s).select(1, 0).select(1, dim));
    for (double v : y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    panels.push_back(Plot(name).xlabel("draw (MH step after warm-up)").ylabel(ylabel).line(t, y, palette(k++)));
  }
  if (lo < hi)
    for (auto& p : panels) p.ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo));
  save_figure(path, panels, 1, "Trace of " + ylabel + ", first chain of each sampler", "", {9.0, 2.4});
}

void plot_pairs(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dx,
                int64_t dy, const torch::Tensor& exact, const std::vector<std::string>& labels) {
  std::vector<Plot> panels;
  int k = 0;
  for (const auto& [name, draws] : runs) {
    torch::Tensor flat = draws.reshape({-1, draws.size(2)});
    const int64_t n = std::min<int64_t>(4000, flat.size(0));
    torch::Tensor pick = flat.narrow(0, flat.size(0) - n, n);
    Plot p(name);
    p.xlabel(labels.at(dx)).ylabel(labels.at(dy));
    if (exact.defined()) p.scatter(to_vector(exact.select(1, dx)), to_vector(exact.select(1, dy)), {170, 170, 170}, 1.5, "exact draws", 0.5);
    p.scatter(to_vector(pick.select(1, dx)), to_vector(pick.select(1, dy)), palette(k++), 1.5, "MCMC draws (last 4000)", 0.5);
    panels.push_back(p);
  }
  save_figure(path, panels, 0, "Draws of " + labels.at(dx) + " and " + labels.at(dy));
}

}  // namespace nmcmc
