#pragma once
/// Figures shared by `nmcmc demo`, `reproduce` and `compare`, and drawing them with matplotlib.
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

/// Training curves: accept rate, beta, proposal entropy, loss, eps (one panel each).
void plot_training_curves(const std::string& path, const std::vector<TrainStats>& log, const std::string& title);

/// Traces of coordinate `dim` of the first chain of each run: draws [S, C, D] per run.
void plot_traces(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dim,
                 int64_t max_steps, const std::string& ylabel);

/// Scatter of two coordinates of the draws of each run, with exact draws (if given) in grey.
void plot_pairs(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dx,
                int64_t dy, const torch::Tensor& exact, const std::vector<std::string>& labels);

/// The plotting script and the Python that runs it: $NMCMC_PLOT_SCRIPT, else the source tree's
/// scripts/nmcmc_plot.py, else the installed share/nmcmc/nmcmc_plot.py; $NMCMC_PYTHON, else
/// /usr/bin/python3 (Debian's, with python3-matplotlib).
std::string plot_script_path();
std::string plot_python();

/// What drawing figures came to: how many specs were drawn, or why none were (and what to do).
struct RenderOutcome {
  bool drawn = false;
  int64_t specs = 0;
  std::string message;
};
/// Draws figure specs (*.figure.json) as PNG and SVG in one Python process. Never throws: a
/// missing Python or matplotlib is reported in the message (the specs stay, to draw later).
RenderOutcome render_figures(const std::vector<std::string>& specs);
/// render_figures over the specs queued by save_figure in this process (then empties the queue).
RenderOutcome render_pending_figures();
/// Every *.figure.json under `directory`, recursively (UsageError if it is not a directory).
std::vector<std::string> find_figure_specs(const std::string& directory);

/// `nmcmc report`: the HTML page of a run directory (default RUN_DIR/report.html) with its
/// figures; returns its path. UsageError for a directory that is not a run, IoError when the
/// plotting tools are missing (with how to install them).
std::string write_report(const std::string& run_dir, const std::optional<std::string>& output);

}  // namespace nmcmc
