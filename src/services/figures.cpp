// The figures demo, reproduce and compare share; drawing figure specs with matplotlib.
#include "nmcmc/services/figures.hpp"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs a command line; returns its exit code (127: not found) and its output (stdout + stderr).
std::pair<int, std::string> run_command(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {127, "cannot start: " + command};
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return {code, output};
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
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

std::string plot_script_path() {
  if (const char* env = std::getenv("NMCMC_PLOT_SCRIPT"); env && *env) return env;
  if (fs::exists(NMCMC_SOURCE_PLOT_SCRIPT)) return NMCMC_SOURCE_PLOT_SCRIPT;
  return NMCMC_INSTALL_PLOT_SCRIPT;
}

std::string plot_python() {
  if (const char* env = std::getenv("NMCMC_PYTHON"); env && *env) return env;
  return "/usr/bin/python3";
}

RenderOutcome render_figures(const std::vector<std::string>& specs) {
  RenderOutcome out;
  out.specs = static_cast<int64_t>(specs.size());
  if (specs.empty()) return out;
  const std::string script = plot_script_path(), python = plot_python();
  const std::string later = fmt::format(
      "Their data is in {} *.figure.json file{}; to draw them: apt-get install python3-matplotlib, then `nmcmc figures DIR`.",
      specs.size(), specs.size() == 1 ? "" : "s");
  if (!fs::exists(python)) {
    out.message = fmt::format("figures not drawn: no Python at {} (set NMCMC_PYTHON). {}", python, later);
    return out;
  }
  if (!fs::exists(script)) {
    out.message = fmt::format("figures not drawn: the plotting script {} is missing (set NMCMC_PLOT_SCRIPT). {}", script, later);
    return out;
  }
  // One process for all of them (importing matplotlib takes about a second); in batches so the
  // command line stays short.
  for (size_t start = 0; start < specs.size(); start += 200) {
    std::string command = shell_quote(python) + " " + shell_quote(script) + " render";
    for (size_t k = start; k < std::min(specs.size(), start + 200); ++k) command += " " + shell_quote(specs[k]);
    auto [code, text] = run_command(command);
    if (code == 69) {
      out.message = fmt::format("figures not drawn: {} ({}). {}", last_line(text), python, later);
      return out;
    }
    if (code != 0) {
      out.message = fmt::format("figures not drawn: the plotting script failed ({}): {}", code, last_line(text));
      return out;
    }
  }
  out.drawn = true;
  out.message = fmt::format("drew {} figure{} (PNG and SVG) with matplotlib", specs.size(), specs.size() == 1 ? "" : "s");
  return out;
}

RenderOutcome render_pending_figures() { return render_figures(take_pending_figures()); }

std::vector<std::string> find_figure_specs(const std::string& directory) {
  if (!fs::is_directory(directory)) throw UsageError("'" + directory + "' is not a directory");
  std::vector<std::string> specs;
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".figure.json";
    if (entry.is_regular_file() && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      specs.push_back(entry.path().string());
  }
  std::sort(specs.begin(), specs.end());
  return specs;
}

std::string write_report(const std::string& run_dir, const std::optional<std::string>& output) {
  if (!fs::is_directory(run_dir)) throw UsageError("report: '" + run_dir + "' is not a directory");
  if (!fs::exists(fs::path(run_dir) / "summary.json") && !fs::exists(fs::path(run_dir) / "compare.json"))
    throw UsageError("report: '" + run_dir + "' has no summary.json or compare.json (write one with `nmcmc sample --output`, "
                     "`nmcmc compare --output` or `nmcmc demo`)");
  const std::string script = plot_script_path(), python = plot_python();
  if (!fs::exists(python)) throw IoError("report: no Python at " + python + " (apt-get install python3 python3-matplotlib, or set NMCMC_PYTHON)");
  if (!fs::exists(script)) throw IoError("report: the plotting script " + script + " is missing (set NMCMC_PLOT_SCRIPT)");
  std::string command = shell_quote(python) + " " + shell_quote(script) + " report " + shell_quote(run_dir);
  if (output) command += " --output " + shell_quote(*output);
  auto [code, text] = run_command(command);
  if (code == 69) throw IoError("report: " + last_line(text));
  if (code == 65) throw DataError("report: " + last_line(text));
  if (code != 0) throw IoError(fmt::format("report: the plotting script failed ({}): {}", code, text));
  return last_line(text);
}

}  // namespace nmcmc
