// `nmcmc reference`: reference posterior moments of a logistic-regression data set.
#include <iostream>

#include "cli.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/services/reference.hpp"

namespace nmcmc::cli {

Command add_reference_command(CLI::App& app) {
  auto a = std::make_shared<ReferenceOptions>();
  auto threads = std::make_shared<int>(1);
  auto* cmd = app.add_subcommand("reference", "compute reference posterior moments of a logistic-regression data set");
  cmd->add_option("--dataset", a->dataset, "german | australian | heart")->required();
  cmd->add_option("--output,-o", a->output, "output JSON (default: data/reference/DATASET.json)");
  cmd->add_option("--chains", a->chains)->capture_default_str();
  cmd->add_option("--warmup", a->warmup)->capture_default_str();
  cmd->add_option("--draws", a->draws)->capture_default_str();
  cmd->add_option("--leapfrog", a->leapfrog)->capture_default_str();
  cmd->add_option("--seed", a->seed, "random seed (a non-negative integer)")->check(cli::seed_validator())->capture_default_str();
  cmd->add_option("--jitter", a->jitter, "HMC step-size jitter")->capture_default_str();
  cmd->add_option("--threads", *threads)->capture_default_str();
  return {cmd, [a, threads] {
            if (*threads < 0) throw UsageError("--threads must be non-negative");
            if (*threads > 0) torch::set_num_threads(*threads);
            a->command = command_line();
            auto r = compute_reference(*a, sample_progress(false));
            std::cout << format_summary(r.summary, 6);
            if (!r.converged) {
              std::cerr << "nmcmc: reference run did not converge (max R-hat " << r.reference["max_rhat"].get<double>()
                        << " >= 1.01); nothing written\n";
              return static_cast<int>(kExitSoftware);
            }
            std::cout << "wrote " << r.path << "\n";
            return 0;
          }};
}

}  // namespace nmcmc::cli
