// The `nmcmc` command line: parse, validate, call services, map errors to exit codes.
// Each command lives in its own file (cmd_*.cpp); what they share is in cli.hpp.
#include <filesystem>
#include <iostream>

#include "cli.hpp"
#include "nmcmc/process/allocator.hpp"
#include "nmcmc/process/blas_kernels.hpp"
#include "nmcmc/process/environment.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/process/figures.hpp"
#include "nmcmc/process/gemm.hpp"
#include "nmcmc/process/stan_build.hpp"

namespace {
int run_parsed(const std::vector<nmcmc::cli::Command>& commands);
/// Draws the figure specs the parsed command wrote into its figure directory since `start`.
void draw_figures(const std::vector<nmcmc::cli::Command>& commands, std::filesystem::file_time_type start);
}

int main(int argc, char** argv) {
  nmcmc::use_best_blas_kernels(argv);  // Note [OpenBLAS's kernels]: may run this program again
  using namespace nmcmc::cli;
  // A second before now: file times come from a coarse clock, a spec written at once may carry
  // an older stamp; a spec written within the second before is drawn again (harmless).
  const auto start = std::filesystem::file_time_type::clock::now() - std::chrono::seconds(1);
  nmcmc::tune_allocator();  // Note [Allocator policy]
  nmcmc::apply_environment();  // NMCMC_DATA_DIR, NMCMC_FASHION_MNIST: the library reads no variable
  nmcmc::warn_gemm_environment();
  set_command_line(argc, argv);
  // Note [Stan programs]: --stan programs are compiled on first use and cached.
  nmcmc::register_stan_builder([](const std::string& message) { std::cerr << "nmcmc: " << message << std::endl; });
  CLI::App app{"nmcmc: neural-network MCMC that maximises proposal entropy (Li, Chen & Sommer 2021)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  app.set_version_flag("--version", [] { return version_text(/*measure_blas=*/false); }, "nmcmc, LibTorch and BLAS versions");

  std::vector<Command> commands = {add_targets_command(app), add_sample_command(app), add_train_command(app),
                                   add_reference_command(app), add_info_command(app), add_reproduce_command(app)};
  Command ebm_sample;
  commands.push_back(add_ebm_commands(app, ebm_sample));
  commands.push_back(ebm_sample);
  commands.push_back(add_demo_command(app));
  commands.push_back(add_compare_command(app));
  commands.push_back(add_report_command(app));
  commands.push_back(add_figures_command(app));
  commands.push_back(add_launch_command(app));
  commands.push_back(add_stan_syntax_command(app));

  if (argc > 1 && argv[1][0] != '-') {
    const std::string command = argv[1];
    auto subs = app.get_subcommands([](CLI::App*) { return true; });
    if (std::none_of(subs.begin(), subs.end(), [&](CLI::App* s) { return s->get_name() == command; })) {
      std::cerr << "nmcmc: unknown command '" << command << "' (run `nmcmc --help`)\n";
      return nmcmc::kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "nmcmc: " << e.what() << "\n(run `nmcmc --help` or `nmcmc COMMAND --help`)\n";
    return nmcmc::kExitUsage;
  }

  // The command; then the figures it described (also when it failed halfway).
  const int rc = run_parsed(commands);
  draw_figures(commands, start);
  return rc;
}

namespace {
void draw_figures(const std::vector<nmcmc::cli::Command>& commands, std::filesystem::file_time_type start) {
  for (const auto& c : commands) {
    if (!c.app->parsed() || !c.figure_dir) continue;
    std::string dir;
    try {
      dir = c.figure_dir();
    } catch (const std::exception&) {
      return;
    }
    const nmcmc::RenderOutcome figures = nmcmc::render_figures(nmcmc::figure_specs_written_since(dir, start));
    if (figures.specs > 0) (figures.drawn ? std::cout : std::cerr) << "nmcmc: " << figures.message << "\n";
    return;
  }
}

const std::string& prefix() { return nmcmc::cli::message_prefix(); }
int run_parsed(const std::vector<nmcmc::cli::Command>& commands) {
  try {
    for (const auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
  } catch (const nmcmc::UsageError& e) {
    std::cerr << prefix() << ": " << e.what() << "\n";
    return nmcmc::kExitUsage;
  } catch (const nmcmc::DataError& e) {
    std::cerr << prefix() << ": " << e.what() << "\n";
    return nmcmc::kExitData;
  } catch (const nmcmc::IoError& e) {
    std::cerr << prefix() << ": " << e.what() << "\n";
    return nmcmc::kExitIo;
  } catch (const nmcmc::ExitError& e) {
    std::cerr << prefix() << ": " << e.what() << "\n";
    return e.code;
  } catch (const nmcmc::DistError& e) {
    std::cerr << "\nnmcmc: " << e.what() << "\n";  // the message says which rank
    return nmcmc::kExitUnavailable;
  } catch (const c10::Error& e) {
    std::cerr << prefix() << ": internal error: " << e.what_without_backtrace() << "\n";
    return nmcmc::kExitSoftware;
  } catch (const std::exception& e) {
    std::cerr << prefix() << ": internal error: " << e.what() << "\n";
    return nmcmc::kExitSoftware;
  }
  return nmcmc::kExitUsage;
}
}  // namespace
