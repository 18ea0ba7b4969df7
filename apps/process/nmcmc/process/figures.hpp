#pragma once
/// Drawing figure specs (io/plot.hpp) with matplotlib, and `nmcmc report`: the program runs
/// scripts/nmcmc_plot.py in a Python child process. Not part of the library: the library only
/// writes specs.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace nmcmc {

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
/// Every *.figure.json under `directory`, recursively (UsageError if it is not a directory).
std::vector<std::string> find_figure_specs(const std::string& directory);
/// The specs under `directory` written at or after `since` (none if it is not a directory): what a
/// command that writes there drew up. Never throws.
std::vector<std::string> figure_specs_written_since(const std::string& directory, std::filesystem::file_time_type since);

/// `nmcmc report`: the HTML page of a run directory (default RUN_DIR/report.html) with its
/// figures; returns its path. UsageError for a directory that is not a run, IoError when the
/// plotting tools are missing (with how to install them).
std::string write_report(const std::string& run_dir, const std::optional<std::string>& output);

}  // namespace nmcmc
