// `nmcmc demo` (`make demo`): the README's main job.
#include <iostream>

#include "cli.hpp"
#include "nmcmc/services/demo.hpp"

namespace nmcmc::cli {

Command add_demo_command(CLI::App& app) {
  auto output = std::make_shared<std::string>("demo_out");
  auto quiet = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("demo", "the README's main job");
  cmd->add_option("--output,-o", *output, "output directory")->capture_default_str();
  cmd->add_flag("--quiet,-q", *quiet, "no progress line");
  return {cmd, [output, quiet] {
            torch::set_num_threads(1);
            install_stop_handler();
            const bool done = run_demo(*output, [](const std::string& s) { std::cout << s << std::endl; },
                                       train_progress(*quiet), sample_progress(*quiet), stop_requested);
            if (!done) {
              std::cerr << "\nnmcmc: interrupted; run `make demo` again to continue training\n";
              return 130;
            }
            return 0;
          },
          [output] { return *output; }};
}

}  // namespace nmcmc::cli
