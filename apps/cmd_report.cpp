// `nmcmc report RUN_DIR`: one HTML page about a run; `nmcmc figures DIR`: draw figure specs.
#include <iostream>

#include "cli.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/process/figures.hpp"

namespace nmcmc::cli {

Command add_report_command(CLI::App& app) {
  struct Args {
    std::string run_dir;
    std::optional<std::string> output;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "report",
      "write an HTML report of a run directory (from sample/compare/demo): traces, rank plots, autocorrelation, "
      "pair plot of the worst-mixing parameters, ESS and R-hat tables, training curves, the compare table");
  cmd->add_option("run_dir", a->run_dir, "the run's directory (with summary.json or compare.json)")->required();
  cmd->add_option("--output,-o", a->output, "the HTML file (default RUN_DIR/report.html; figures beside it in report_files/)");
  return {cmd, [a] {
            const std::string page = write_report(a->run_dir, a->output);
            std::cout << "wrote " << page << "\n";
            return 0;
          }};
}

Command add_figures_command(CLI::App& app) {
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("figures", "draw (again) every figure spec (*.figure.json) under the directories, as PNG and SVG");
  cmd->add_option("directories", *dirs, "output directories of demo, reproduce, compare, ebm")->required();
  return {cmd, [dirs] {
            std::vector<std::string> specs;
            for (const auto& d : *dirs) {
              auto found = find_figure_specs(d);
              specs.insert(specs.end(), found.begin(), found.end());
            }
            if (specs.empty()) throw UsageError("no figure specs (*.figure.json) found");
            RenderOutcome r = render_figures(specs);
            (r.drawn ? std::cout : std::cerr) << "nmcmc: " << r.message << "\n";
            return r.drawn ? 0 : kExitIo;
          }};
}

}  // namespace nmcmc::cli
