// Drawing figure specs and reports with matplotlib: a Python child process of the program.
#include "nmcmc/process/figures.hpp"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/process/command.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

namespace {
std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}
}  // namespace

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

std::vector<std::string> figure_specs_written_since(const std::string& directory, fs::file_time_type since) {
  std::vector<std::string> out;
  std::error_code ec;
  if (directory.empty() || !fs::is_directory(directory, ec)) return out;
  for (const std::string& spec : find_figure_specs(directory)) {
    const auto written = fs::last_write_time(spec, ec);
    if (!ec && written >= since) out.push_back(spec);
  }
  return out;
}

}  // namespace nmcmc
