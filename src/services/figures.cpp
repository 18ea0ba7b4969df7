#include "nmcmc/services/figures.hpp"

#include "nmcmc/io/plot.hpp"

namespace nmcmc {

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
  panels.push_back(Plot(420, 300, title + ": accept rate").xlabel("training step").line(step, accept, palette(0)));
  panels.push_back(Plot(420, 300, "beta").xlabel("training step").log_y().line(step, beta, palette(1)));
  panels.push_back(Plot(420, 300, "proposal entropy (+const)").xlabel("training step").line(step, entropy, palette(2)));
  panels.push_back(Plot(420, 300, "loss").xlabel("training step").line(step, loss, palette(3)));
  panels.push_back(Plot(420, 300, "eps").xlabel("training step").line(step, eps, palette(4)));
  save_png(path, panels, 3);
}

void plot_traces(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dim,
                 int64_t max_steps, const std::string& ylabel) {
  std::vector<Plot> panels;
  int k = 0;
  for (const auto& [name, draws] : runs) {
    const int64_t s = std::min<int64_t>(max_steps, draws.size(0));
    std::vector<double> t(s);
    for (int64_t i = 0; i < s; ++i) t[i] = static_cast<double>(i);
    panels.push_back(Plot(600, 260, name).xlabel("MH step").ylabel(ylabel).line(t, to_vector(draws.narrow(0, 0, s).select(1, 0).select(1, dim)), palette(k++)));
  }
  save_png(path, panels, 1);
}

void plot_pairs(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dx,
                int64_t dy, const torch::Tensor& exact) {
  std::vector<Plot> panels;
  int k = 0;
  for (const auto& [name, draws] : runs) {
    torch::Tensor flat = draws.reshape({-1, draws.size(2)});
    const int64_t n = std::min<int64_t>(4000, flat.size(0));
    torch::Tensor pick = flat.narrow(0, flat.size(0) - n, n);
    Plot p(420, 380, name);
    p.xlabel("x." + std::to_string(dx + 1)).ylabel("x." + std::to_string(dy + 1));
    if (exact.defined()) p.scatter(to_vector(exact.select(1, dx)), to_vector(exact.select(1, dy)), {170, 170, 170}, 1.2, "exact", 0.5);
    p.scatter(to_vector(pick.select(1, dx)), to_vector(pick.select(1, dy)), palette(k++), 1.2, "draws", 0.5);
    panels.push_back(p);
  }
  save_png(path, panels);
}

}  // namespace nmcmc
