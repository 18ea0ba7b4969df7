// `nmcmc compare`: NUTS, HMC, MALA and the learned sampler on one target, on one footing.
#include <iostream>

#include "cli.hpp"
#include "nmcmc/services/compare.hpp"

namespace nmcmc::cli {

namespace {
struct CompareArgs {
  TargetArgs target;
  ComputeArgs compute;
  CompareOptions options;
  std::optional<std::string> table, warm_start;
  std::vector<std::string> nuts_metrics;
  bool quiet = false;
  DistArgs dist;
};

int run(CompareArgs& a, const CLI::App* cmd) {
  if (a.table) {
    std::cout << compare_table(read_config_file(*a.table));
    return 0;
  }
  if (a.warm_start) a.options.warm_start = *a.warm_start;
  for (const auto& m : a.nuts_metrics) {
    const MetricAdapt metric = parse_enum<MetricAdapt>(m);
    if (metric == MetricAdapt::kUnit) throw UsageError("--nuts-metrics: NUTS's metrics are diag, dense, fisher-diag or fisher-lowrank");
    a.options.nuts_metrics.push_back(metric);
  }
  a.compute.options(a.options.dtype);  // validates and applies --threads
  if (a.compute.device != "cpu") throw UsageError("compare runs on the CPU for now (--device cpu)");
  a.options.dtype = a.compute.dtype.value_or("float32");
  a.options.target = TargetArgs::given(cmd) || (!a.options.model && !a.options.config) ? a.target.spec() : nlohmann::json();
  torch::TensorOptions cpu;
  auto comm = a.dist.connect(cpu);
  const bool root = comm->is_root();
  if (root) warn_blas();
  install_stop_handler();
  auto say = [](const std::string& line) { std::cout << line << std::endl; };
  nlohmann::json r = compare(a.options, say, train_progress(a.quiet || !root), sample_progress(a.quiet || !root),
                             stop_requested, comm);
  if (!root) return 0;
  std::cout << "\n" << compare_table(r) << "\nWrote " << a.options.output << "/compare.json, compare.md and compare_traces.png\n";
  return 0;
}
}  // namespace

Command add_compare_command(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  auto* cmd = app.add_subcommand("compare", "NUTS (each metric), HMC, MALA and the learned sampler on one target: ESS per draw, gradient and second, sampling only and all-in");
  a->target.add(cmd);
  a->compute.add(cmd);
  cmd->add_option("--model", a->options.model, "a trained learned sampler (from `nmcmc train`)");
  cmd->add_option("--config,-c", a->options.config, "a training config: train the learned sampler first (resumable)");
  cmd->add_option("--chains", a->options.chains, "chains per sampler")->capture_default_str();
  cmd->add_option("--warmup", a->options.warmup, "warm-up steps")->capture_default_str();
  cmd->add_option("--draws", a->options.draws, "draws per chain")->capture_default_str();
  cmd->add_option("--seed", a->options.seed, "random seed (a non-negative integer)")->check(cli::seed_validator())->capture_default_str();
  cmd->add_option("--nuts-metrics", a->nuts_metrics,
                  "NUTS's metrics, comma-separated (default: diag,dense,fisher-diag,fisher-lowrank; dense up to D = 1000); "
                  "the learned sampler is compared with the best")
      ->delimiter(',');
  add_transport_options(cmd, a->options.transport,
                        "flow: also NUTS on the target pulled back through a flow fitted in warm-up (nuts_flow); auto: "
                        "also NUTS with the flow only where its warm-up's draws are far from any Gaussian (nuts_auto)",
                        /*sampling=*/true, kDefaultTransportRounds);
  cmd->add_option("--leapfrog", a->options.hmc_leapfrog, "HMC leapfrog steps")->capture_default_str();
  cmd->add_option("--warm-start", a->warm_start,
                  "a previous run of the same model on other data (its output directory or summary.json): adds "
                  "nuts_warm, NUTS started where it ended with its step size and metric (docs/commands.md)");
  cmd->add_option("--warm-warmup", a->options.warm_warmup, "nuts_warm's warm-up iterations")->capture_default_str();
  cmd->add_option("--output,-o", a->options.output, "output directory")->capture_default_str();
  cmd->add_option("--table", a->table, "only print the table of an existing compare.json");
  cmd->add_flag("--quiet,-q", a->quiet, "no progress line");
  a->dist.add(cmd);
  return {cmd, [a, cmd] { return run(*a, cmd); }, [a] { return a->options.output; }};
}

}  // namespace nmcmc::cli
