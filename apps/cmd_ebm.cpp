// `nmcmc ebm train` and `nmcmc ebm sample`: the image EBM of paper section 4.2.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "cli.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/services/ebm.hpp"

namespace nmcmc::cli {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct EbmArgs {
  bool draws_figures = true;  // false on ranks other than 0 of a distributed run
  std::string data = "fashion-mnist", output = "ebm", profile = "cpu", sampler = "learned", device = "cpu";
  std::optional<std::string> config, compare;
  std::vector<std::string> sets;
  std::optional<int64_t> iterations, size, channels, limit;
  bool resume = false, quiet = false;
  int threads = 1;
  DistArgs dist;
};

struct EbmSampleArgs {
  std::string model = "ebm", device = "cpu";
  std::optional<std::string> output;
  int64_t steps = 2000, chains = 8;
  int threads = 1;
  bool quiet = false;
};

void set_threads(int threads) {
  if (threads < 0) throw UsageError("--threads must be non-negative");
  if (threads > 0) torch::set_num_threads(threads);
}

std::function<void(int64_t, int64_t)> longrun_progress(bool quiet) {
  if (quiet) return nullptr;
  auto line = std::make_shared<ProgressLine>(false);
  auto t0 = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  return [line, t0](int64_t k, int64_t n) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - *t0).count();
    line->update("long run", k, n, secs > 0 ? static_cast<double>(k) / secs : 0, "MH steps from buffer samples", "steps");
  };
}

int run_train(EbmArgs& a) {
  set_threads(a.threads);
  json cfg = a.config ? read_config_file(*a.config) : json::object();
  if ((a.size || a.channels) && !fs::is_directory(a.data)) {
    throw UsageError(std::string(a.size ? "--size" : "--channels") +
                     " applies to image folders only: Fashion-MNIST and IDX files keep their own shape (" + a.data + ")");
  }
  cfg["data"] = a.data;
  cfg["sampler"] = a.sampler;
  cfg["device"] = a.device;
  if (a.iterations) cfg["iterations"] = *a.iterations;
  if (a.size) cfg["size"] = *a.size;
  if (a.channels) cfg["channels"] = *a.channels;
  if (a.limit) cfg["limit"] = *a.limit;
  for (const auto& s : a.sets) apply_override(cfg, s);
  EbmOptions options = EbmOptions::from_json(cfg, a.profile);
  torch::TensorOptions device = torch::TensorOptions().device(torch::Device(options.device));
  auto comm = a.dist.connect(device);
  options.device = device.device().str();  // cuda becomes cuda:LOCAL_RANK
  const bool root = comm->is_root();
  a.draws_figures = root;
  if (root) warn_blas();
  install_stop_handler();
  auto line = std::make_shared<ProgressLine>(a.quiet || !root);
  auto progress = [line](const EbmProgress& p) {
    const auto& s = p.stats;
    line->update("ebm", s.iteration, p.total, p.rate,
                 fmt::format("accept {:.3f} (neg {:.3f})  entropy {:.5g}  jump {:.3g}  E(data)-E(neg) {:+.3g}  eps {:.3g}  updates {}",
                             s.accept, s.mcmc_accept, s.entropy, s.jump, s.energy_diff, s.eps, s.updates));
  };
  json summary = run_ebm_training(options, a.output, a.resume, progress, stop_requested, a.compare.value_or(""),
                                  longrun_progress(a.quiet || !root), comm);
  if (!root) return summary.value("interrupted", false) ? 130 : 0;
  if (summary.value("interrupted", false)) {
    std::cerr << "\ninterrupted: checkpoint saved in " << a.output << "/checkpoint.pt; continue with --resume\n";
    return 130;
  }
  std::cout << summary.dump(2) << "\n";
  std::cout << "figures and checkpoint in " << a.output << "/\n";
  return 0;
}

int run_sample(const EbmSampleArgs& a) {
  set_threads(a.threads);
  const std::string png = a.output.value_or((fs::path(a.model) / "longrun.png").string());
  json r = run_ebm_longrun(a.model, a.steps, a.chains, png, longrun_progress(a.quiet), a.device);
  std::cout << r.dump(2) << "\n";
  return 0;
}

}  // namespace

Command add_ebm_commands(CLI::App& app, Command& sample) {
  auto* ebm = app.add_subcommand("ebm", "deep energy-based image models trained with the learned sampler (paper 4.2)");
  ebm->require_subcommand(1);
  auto a = std::make_shared<EbmArgs>();
  auto* train = ebm->add_subcommand("train", "train an EBM by PCD with the learned sampler (or MALA); resumable");
  train->add_option("--data", a->data, "fashion-mnist | an IDX file | a folder of PNG/JPEG images")->capture_default_str();
  train->add_option("--output,-o", a->output, "output directory (checkpoint, log, figures)")->capture_default_str();
  train->add_option("--profile", a->profile, "cpu (small, ~1 h on 2 vCPUs) | paper | smoke")->capture_default_str();
  train->add_option("--sampler", a->sampler, "learned | mala (the baseline)")->capture_default_str();
  train->add_option("--config,-c", a->config, "JSON of EBM options over the profile's");
  train->add_option("--iterations", a->iterations, "override the number of iterations");
  train->add_option("--size", a->size, "image folders: resize to SIZE x SIZE");
  train->add_option("--channels", a->channels, "image folders: 1 (grayscale) or 3 (colour)");
  train->add_option("--limit", a->limit, "use only the first N images");
  train->add_option("--set", a->sets, "override an option: key=value or conv.key=value");
  train->add_option("--compare", a->compare, "another run's directory, drawn in the curves (learned vs MALA)");
  train->add_flag("--resume", a->resume, "continue OUTPUT/checkpoint.pt");
  train->add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  train->add_option("--threads", a->threads, "intra-op threads")->capture_default_str();
  train->add_flag("--quiet,-q", a->quiet, "no progress line");
  a->dist.add(train);

  auto b = std::make_shared<EbmSampleArgs>();
  auto* smp = ebm->add_subcommand("sample", "a long sampling run from buffer samples of a trained EBM, as a grid");
  smp->add_option("--model,-m", b->model, "the training output directory")->capture_default_str();
  smp->add_option("--steps", b->steps, "MH steps")->capture_default_str();
  smp->add_option("--chains", b->chains, "chains (grid columns)")->capture_default_str();
  smp->add_option("--output,-o", b->output, "PNG (default: MODEL/longrun.png)");
  smp->add_option("--threads", b->threads, "intra-op threads")->capture_default_str();
  smp->add_option("--device", b->device, "cpu | cuda | cuda:N")->capture_default_str();
  smp->add_flag("--quiet,-q", b->quiet, "no progress line");
  sample = {smp, [b] { return run_sample(*b); },
            [b] { return fs::path(b->output.value_or((fs::path(b->model) / "longrun.png").string())).parent_path().string(); }};
  return {train, [a] { return run_train(*a); }, [a] { return a->draws_figures ? a->output : std::string(); }};
}

}  // namespace nmcmc::cli
