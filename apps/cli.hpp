#pragma once
// What every `nmcmc` command shares: the option groups, the one progress line, the stop flag.
// The commands themselves (one file each) only parse, validate and call services.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nmcmc/core/enum_names.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"

namespace nmcmc::cli {

/// CLI11's check for an enum's names: the UsageError's message for a wrong one.
template <typename E>
CLI::Validator enum_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          (void)parse_enum<E>(s);
          return {};
        } catch (const UsageError& e) {
          return e.what();
        }
      },
      "", "");
}

/// CLI11's check for a seed: a whole number from 0 to 2^64 - 1 (CLI11 alone reads -1 into an
/// unsigned option as 2^64 - 1, silently).
inline CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        return digits ? std::string() : "a seed is a non-negative whole number, got '" + s + "'";
      },
      "", "");
}

/// An option that takes one of an enum's names (core/enum_names.hpp): a name that is not one of
/// them is refused at parsing with the choices ("--sampler: unknown sampler 'gibbs' (choose ...)").
template <typename E>
CLI::Option* add_enum_option(CLI::App* cmd, const std::string& name, E& field, const std::string& help) {
  auto* o = cmd->add_option_function<std::string>(name, [&field](const std::string& s) { field = parse_enum<E>(s); },
                                                  help + " (" + enum_choices<E>() + ")");
  o->check(enum_validator<E>());
  o->default_str(enum_name(field));
  return o;
}
template <typename E>
CLI::Option* add_enum_option(CLI::App* cmd, const std::string& name, std::optional<E>& field, const std::string& help) {
  auto* o = cmd->add_option_function<std::string>(name, [&field](const std::string& s) { field = parse_enum<E>(s); },
                                                  help + " (" + enum_choices<E>() + ")");
  o->check(enum_validator<E>());
  return o;
}

/// --transport (its help: `kind_help`), --transport-layers, --transport-rounds and, where the
/// command samples, --global-moves, bound to one TransportChoice (Note [The transport's options]);
/// `default_rounds` is the command's. Unset numbers stay unset.
void add_transport_options(CLI::App* cmd, TransportChoice& choice, const std::string& kind_help, bool sampling,
                           int64_t default_rounds);

/// Note [The mixing check]: "; slowest: NAME (R-hat R)" for a check record that names the
/// parameter that mixed worst, else "".
std::string slowest_parameter_phrase(const nlohmann::json& check);

/// The whole command line, as typed (recorded in outputs).
const std::string& command_line();
void set_command_line(int argc, char** argv);

/// A registered command: its CLI11 sub-app and what runs it once parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
  /// The directory its figure specs go to (empty or unset: it draws none); the program draws
  /// those written while the command ran once it ends (apps/process/figures.hpp).
  std::function<std::string()> figure_dir;
};

/// Options of every command that builds a target. Unset options are left out of the spec, so
/// the target's own default applies; a given value is always passed on and validated there.
struct TargetArgs {
  std::optional<std::string> name;  // unset: funnel, or torchscript with --module
  std::optional<int64_t> dim;
  std::optional<double> sigma;
  std::optional<std::string> dataset, file, spec_json, module, module_output, module_engine, stan, stan_data;
  std::optional<int> label_column;
  std::optional<int64_t> target_seed;
  void add(CLI::App* cmd);
  /// The target spec; UsageError for malformed --target-json.
  nlohmann::json spec() const;
  /// Whether any target option was given on the command line of `cmd`.
  static bool given(const CLI::App* cmd);
};

/// Options of every command that computes: device, dtype, threads.
struct ComputeArgs {
  std::string device = "cpu";
  std::optional<std::string> dtype;
  int threads = 1;
  void add(CLI::App* cmd, const char* dtype_help = "float32 | float64 (default float32)");
  /// Applies --threads and returns the tensor options; UsageError for bad values.
  torch::TensorOptions options(const std::string& default_dtype = "float32") const;
};

/// How a command joins a distributed run (Note [Data parallelism]): the torchrun environment
/// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, as `nmcmc launch` sets it), each
/// value replaced by its flag when given.
struct DistArgs {
  std::optional<int> rank, world_size, local_rank, master_port;
  std::optional<std::string> master_addr, backend;
  std::optional<double> timeout;
  void add(CLI::App* cmd);
  parallel::DistOptions resolve() const;
  /// Joins the run (world size 1: a single process) and labels this process's messages with its
  /// rank. CUDA without an index becomes cuda:LOCAL_RANK.
  std::shared_ptr<parallel::Communicator> connect(torch::TensorOptions& options) const;
};
/// "nmcmc", or "nmcmc [rank r/N]" in a distributed run: how messages start.
const std::string& message_prefix();

/// The one progress line (stderr): "[label] done/total pct  stats  rate unit/s  ETA m:ss";
/// rewritten in place on a terminal, at most every 10 s (and at the end) otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet, std::string indent = "");
  void update(const std::string& label, int64_t done, int64_t total, double rate, const std::string& stats,
              const char* unit = "it");

 private:
  bool quiet_, tty_;
  std::string indent_;
  std::shared_ptr<double> last_print_;
};

/// The sampling progress line (warm-up and sampling phases) on a ProgressLine.
ProgressFn sample_progress(bool quiet);
/// The training progress line of `train`, `reproduce` and `demo`.
TrainProgressFn train_progress(bool quiet, const std::string& indent = "");

/// "m:ss" or "h:mm:ss"; "--:--" when unknown.
std::string format_seconds(double seconds);

/// Set by SIGINT/SIGTERM once install_stop_handler() ran; services poll it between steps.
bool stop_requested();
void install_stop_handler();

/// Prints the BLAS warning when LibTorch runs on a slow BLAS.
void warn_blas();

// The commands (one file each).
Command add_targets_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_reference_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_stan_syntax_command(CLI::App& app);
Command add_reproduce_command(CLI::App& app);
Command add_ebm_commands(CLI::App& app, Command& sample);  // returns `ebm train`; `ebm sample` in `sample`
Command add_demo_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_figures_command(CLI::App& app);
Command add_launch_command(CLI::App& app);

/// The version line of --version and `info`: nmcmc, LibTorch and the BLAS in use.
std::string version_text(bool measure_blas);

}  // namespace nmcmc::cli
