// `nmcmc reproduce`: the paper's experiments with one command.
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "nmcmc/process/launch.hpp"
#include "nmcmc/services/reproduce.hpp"

namespace nmcmc::cli {

namespace {
struct ReproduceArgs {
  ReproduceOptions options;
  std::string only;
  std::optional<std::string> table;
  bool quiet = false, no_figures = false;
};

int run(ReproduceArgs a) {
  if (a.table) {
    std::cout << results_table(read_config_file(*a.table));
    return 0;
  }
  std::stringstream ss(a.only);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) a.options.only.push_back(item);
  }
  a.options.figures = !a.no_figures;
  a.options.run_jobs = run_jobs;
  torch::set_num_threads(1);
  warn_blas();
  // Ctrl-C or SIGTERM during a training checkpoints it and ends the run (exit 130); elsewhere the
  // run ends at the next training or at its end. Every file is written atomically and a rerun
  // resumes: the finished trainings load, an interrupted one continues from its checkpoint.
  install_stop_handler();
  a.options.should_stop = stop_requested;
  auto say = [](const std::string& line) { std::cout << line << std::endl; };
  nlohmann::json results = reproduce(a.options, say, train_progress(a.quiet, "  "));
  if (!a.options.part.empty()) return 0;  // a child of --jobs: the parent writes the tables
  std::cout << "\n" << results_table(results) << "\nWrote " << a.options.output << "/results.json, results.md and the figures.\n";
  return 0;
}
}  // namespace

Command add_reproduce_command(CLI::App& app) {
  auto a = std::make_shared<ReproduceArgs>();
  auto* cmd = app.add_subcommand("reproduce", "the paper's experiments with one command, beside the paper's numbers");
  cmd->add_option("--profile", a->options.profile, "smoke (~1-2 min) | cpu (reduced: docs/commands.md) | paper")->capture_default_str();
  cmd->add_option("--only", a->only, "comma-separated: icg,scg,funnel1,funnel3,german,australian,heart,moon,ablation");
  cmd->add_option("--output,-o", a->options.output, "output directory")->capture_default_str();
  cmd->add_option("--configs", a->options.configs, "directory of the experiment configs (default: the shipped configs/)");
  cmd->add_flag("--no-figures", a->no_figures, "skip the figures");
  cmd->add_option("--device", a->options.device, "cpu | cuda | cuda:N: where the trainings and evaluations run")
      ->capture_default_str();
  cmd->add_option("--jobs,-j", a->options.jobs,
                  "experiments run side by side, each in its own process with a one-thread BLAS (the results equal a "
                  "one-job run's with OPENBLAS_NUM_THREADS=1; times and ESS/s include the contention)")
      ->capture_default_str();
  cmd->add_option("--part", a->options.part, "internal: one unit of a --jobs run")->group("");
  cmd->add_flag("--quiet,-q", a->quiet, "no training progress line");
  cmd->add_option("--table", a->table, "only print the table of an existing results.json (e.g. of an unfinished run)");
  return {cmd, [a] { return run(*a); }, [a] { return a->options.output; }};
}

}  // namespace nmcmc::cli
