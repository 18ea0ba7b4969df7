// `nmcmc ebm train` and `nmcmc ebm sample`: the EBM loop of Note [EBM training loop] with
// checkpoints, logs and figures.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/services/ebm.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/plot.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

torch::Tensor load_training_images(const EbmOptions& o) {
  torch::Tensor data = load_image_dataset(o.data, o.size, o.channels, o.limit);
  if (data.size(2) < 4 || data.size(3) < 4) throw DataError("images must be at least 4x4");
  return data;
}

/// Pixel-wise standard deviation of z = f(z0; x) over `draws` z0 at each of the images x [n, D].
torch::Tensor z_std(ConvSampler& sampler, const torch::Tensor& x, int64_t draws, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const int64_t n = x.size(0);
  torch::Tensor xs = x.repeat_interleave(draws, 0);
  torch::Tensor z0 = randn(xs.sizes(), gen, xs.options());
  torch::Tensor z = sampler->forward_flow(xs, z0).z.reshape({n, draws, -1});
  return z.std(1);  // [n, D]
}

void write_figures(EbmTrainer& tr, const std::string& out, const std::string& compare_with) {
  const auto& o = tr.options();
  const auto shape = tr.target().spec();
  const int64_t c = shape["channels"], h = shape["height"], w = shape["width"];
  auto images = [&](const torch::Tensor& flat) { return tr.transform().to_unit(flat.reshape({-1, c, h, w})); };
  const int64_t n = std::min<int64_t>(64, tr.buffer().size(0));
  save_image_grid((fs::path(out) / "samples_buffer.png").string(), images(tr.buffer().narrow(0, 0, n)), 8,
                  fmt::format("Replay buffer after {} iterations: {} of its samples", tr.iteration(), n), {}, {},
                  fmt::format("Samples of the energy-based model drawn by the {} sampler (persistent chains).",
                              o.sampler == "learned" ? "learned" : "MALA"));
  {
    torch::NoGradGuard no_grad;
    save_image_grid((fs::path(out) / "data.png").string(), images(tr.data_batch(n)), 8,
                    fmt::format("Training data: {} images", n), {}, {},
                    "A batch of the training set, for comparison with the model's samples.");
  }
  std::vector<std::pair<std::string, std::vector<EbmStats>>> runs = {{o.sampler == "learned" ? "learned" : "MALA", tr.log()}};
  if (!compare_with.empty()) {
    const fs::path other = fs::path(compare_with) / "log.csv";
    if (fs::exists(other)) {
      auto rows = read_ebm_log(other.string());
      json meta = read_ebm_checkpoint_meta((fs::path(compare_with) / "checkpoint.pt").string());
      runs.push_back({meta["options"].value("sampler", "other") == "learned" ? "learned" : "MALA", rows});
    }
  }
  write_ebm_curves((fs::path(out) / "curves.png").string(), runs);
  if (tr.sampler()) {
    // Appendix A.3 f-g: where the proposal moves. 8 buffer samples above the pixel-wise sd of z.
    at::Generator gen = make_generator(o.seed + 99, tr.buffer().device());
    torch::Tensor x = tr.buffer().narrow(0, 0, 8);
    torch::Tensor sd = z_std(tr.sampler(), x, 64, gen);
    torch::Tensor sd_img = sd.reshape({8, c, h, w}).mean(1, true);
    sd_img = sd_img / sd_img.amax({1, 2, 3}, true).clamp_min(1e-12);
    torch::Tensor x_img = images(x).mean(1, true);
    save_image_grid((fs::path(out) / "z_std.png").string(), torch::cat({x_img, sd_img}, 0), 8,
                    "Where the learned proposal moves (appendix A.3 f-g)", {}, {"sample x", "sd of x' - x"},
                    "Top: 8 samples from the buffer. Bottom: the pixel-wise standard deviation of 64 proposals from "
                    "each, scaled to its maximum (white: the proposal moves that pixel most).");
  }
}

}  // namespace

void write_ebm_curves(const std::string& path, const std::vector<std::pair<std::string, std::vector<EbmStats>>>& runs) {
  struct Panel {
    const char* title;
    const char* ylabel;
    std::function<double(const EbmStats&)> value;
  };
  std::vector<Panel> panels = {
      {"proposal entropy", "log det + D log ε (nats)", [](const EbmStats& s) { return s.entropy; }},
      {"expected squared jump", "E[a |x' - x|²] (logit space)", [](const EbmStats& s) { return s.jump; }},
      {"energy gap", "E(data) - E(samples)", [](const EbmStats& s) { return s.energy_diff; }},
      {"accept rate (sampler phase)", "mean accept probability", [](const EbmStats& s) { return s.accept; }},
  };
  std::vector<Plot> plots;
  for (const auto& p : panels) {
    Plot plot(p.title);
    plot.xlabel("training iteration").ylabel(p.ylabel);
    int colour = 0;
    for (const auto& [label, rows] : runs) {
      std::vector<double> xs, ys;
      for (const auto& r : rows) {
        const double v = p.value(r);
        if (std::isfinite(v)) {
          xs.push_back(static_cast<double>(r.iteration));
          ys.push_back(v);
        }
      }
      if (!xs.empty()) plot.line(xs, ys, palette(colour), label);
      ++colour;
    }
    plots.push_back(plot);
  }
  save_figure(path, plots, 2, "Training of the energy-based model");
}

json run_ebm_training(const EbmOptions& options, const std::string& output, bool resume,
                      const std::function<void(const EbmProgress&)>& progress, const std::function<bool()>& should_stop,
                      const std::string& compare_with, const std::function<void(int64_t, int64_t)>& longrun_progress,
                      std::shared_ptr<parallel::Communicator> comm) {
  if (!comm) comm = parallel::single_process();
  const bool root = comm->is_root(), distributed = comm->world_size() > 1;
  if (root) ensure_directory(output);
  comm->barrier();
  const std::string ckpt = (fs::path(output) / "checkpoint.pt").string();
  const std::string log_path = (fs::path(output) / "log.csv").string();
  EbmOptions o = options;
  const bool found = fs::exists(ckpt);
  const double seen = parallel::all_reduce_doubles(*comm, {found ? 1.0 : 0.0})[0];
  if (seen > 0 && seen < comm->world_size()) {
    throw UsageError(comm->where() + ": '" + ckpt + "' exists on only some processes; every process needs the output "
                     "directory (a directory all machines share)");
  }
  if (resume && found) {
    // The run continues with its own options; only the length may be extended.
    json meta = read_ebm_checkpoint_meta(ckpt);
    json stored = meta.at("options");
    stored["iterations"] = std::max<int64_t>(o.iterations, stored.value("iterations", int64_t{0}));
    stored["device"] = o.device;
    o = EbmOptions::from_json(stored);
  } else if (!resume && found) {
    throw UsageError("'" + ckpt + "' exists: pass --resume to continue it, or choose another --output");
  }
  torch::Tensor data = load_training_images(o);
  EbmTrainer tr(o, data, comm);
  if (resume && found) tr.load(ckpt);
  if (root) write_atomically((fs::path(output) / "options.json").string(), [&](std::ostream& os) { os << o.to_json().dump(2) << "\n"; });
  const auto t0 = Clock::now();
  const int64_t start = tr.iteration();
  bool interrupted = false;
  EbmStats last;
  while (tr.iteration() < o.iterations) {
    bool stop = should_stop && should_stop();
    if (distributed) stop = parallel::all_reduce_doubles(*comm, {stop ? 1.0 : 0.0})[0] > 0;  // all stop together
    if (stop) {
      interrupted = true;
      break;
    }
    last = tr.iterate();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (progress && root) progress({last, o.iterations, static_cast<double>(tr.iteration() - start) / std::max(secs, 1e-9)});
    if (tr.iteration() % o.checkpoint_every == 0 && tr.iteration() < o.iterations) {
      tr.save(ckpt);
      if (root) write_ebm_log(log_path, tr.log());
    }
  }
  tr.save(ckpt);
  if (root) write_ebm_log(log_path, tr.log());
  json summary;
  summary["interrupted"] = interrupted;
  if (!root) return summary;
  summary["iterations"] = tr.iteration();
  if (distributed) summary["world_size"] = comm->world_size();
  summary["ebm_updates"] = tr.log().empty() ? 0 : tr.log().back().updates;
  summary["seconds_this_invocation"] = std::chrono::duration<double>(Clock::now() - t0).count();
  summary["seconds_total"] = tr.log().empty() ? 0.0 : tr.log().back().elapsed;
  if (!tr.log().empty()) {
    const auto& s = tr.log().back();
    const double updates = std::max<int64_t>(1, s.updates);
    // Per negative sample and EBM update: the sampling chains' gradients, plus the sampler
    // phase's gradients spread over the negatives (sampler_batch rows vs neg_batch rows).
    const double sampling = static_cast<double>(s.grads_sampling) / updates;
    const double training = static_cast<double>(s.grads_training) / std::max<int64_t>(1, s.iteration) *
                            static_cast<double>(o.sampler_batch) / static_cast<double>(o.neg_batch);
    summary["grads_per_update_sampling"] = sampling;
    summary["grads_per_update_sampler_training"] = training;
    summary["grads_per_update_total"] = sampling + training;
    summary["final"] = {{"accept", s.accept}, {"entropy", s.entropy}, {"jump", s.jump},
                        {"energy_diff", s.energy_diff}, {"eps", s.eps}};
  }
  if (!interrupted) {
    write_figures(tr, output, compare_with);
    summary["figures"] = {"samples_buffer.png", "data.png", "curves.png"};
    if (tr.sampler()) summary["figures"].push_back("z_std.png");
  }
  auto write_summary = [&] {
    write_atomically((fs::path(output) / "summary.json").string(), [&](std::ostream& os) { os << summary.dump(2) << "\n"; });
  };
  write_summary();
  if (!interrupted && options.longrun_steps > 0) {
    const std::string png = (fs::path(output) / "longrun.png").string();
    summary["longrun"] = run_ebm_longrun(output, options.longrun_steps, 8, png, longrun_progress, options.device);
    write_summary();
  }
  return summary;
}

json run_ebm_longrun(const std::string& model_dir, int64_t steps, int64_t chains, const std::string& png,
                     const std::function<void(int64_t, int64_t)>& progress, const std::string& device) {
  const std::string ckpt = (fs::path(model_dir) / "checkpoint.pt").string();
  json meta = read_ebm_checkpoint_meta(ckpt);
  json stored = meta.at("options");
  stored["device"] = device;
  EbmOptions o = EbmOptions::from_json(stored);
  if (steps < 1 || chains < 1) throw UsageError("ebm sample: steps and chains must be positive");
  if (chains > o.buffer) throw UsageError("ebm sample: at most " + std::to_string(o.buffer) + " chains (the buffer size)");
  // The trainer is rebuilt only to restore the networks and buffer; a one-image stand-in data set
  // of the right shape avoids reading the training data.
  const auto shape = meta.at("shape");
  torch::Tensor stand_in = torch::zeros({1, shape[0].get<int64_t>(), shape[1].get<int64_t>(), shape[2].get<int64_t>()}, torch::kUInt8);
  EbmTrainer tr(o, stand_in);
  tr.load(ckpt);
  if (tr.sampler()) tr.sampler()->eval();
  MetropolisHastings kernel(tr.proposal());
  at::Generator gen = make_generator(o.seed + 12345, torch::Device(o.device));
  ChainState state = kernel.init(tr.target(), tr.buffer().narrow(0, 0, chains));
  const int64_t c = shape[0], h = shape[1], w = shape[2];
  const int64_t snaps = 8;
  std::vector<torch::Tensor> rows = {state.x};
  double accept = 0;
  const auto t0 = Clock::now();
  for (int64_t k = 1; k <= steps; ++k) {
    auto [next, info] = kernel.step(tr.target(), state, gen);
    accept += info.accept_prob.mean().item<double>();
    state = next;
    const int64_t next_snap = (static_cast<int64_t>(rows.size()) * steps + snaps - 1) / snaps;  // ceil(j * steps / snaps)
    if (k >= next_snap && static_cast<int64_t>(rows.size()) <= snaps) rows.push_back(state.x);
    if (progress) progress(k, steps);
  }
  while (static_cast<int64_t>(rows.size()) < snaps + 1) rows.push_back(state.x);
  // Grid: one column per chain, one row per snapshot (step 0 at the top).
  torch::Tensor grid = torch::stack(rows, 0).reshape({-1, c, h, w});
  std::vector<std::string> rows_labelled;
  for (int64_t r = 0; r <= snaps; ++r) rows_labelled.push_back(fmt::format("step {}", (r * steps + snaps - 1) / snaps));
  rows_labelled.back() = fmt::format("step {}", steps);
  save_image_grid(png, tr.transform().to_unit(grid), chains, fmt::format("A long run: {} chains, {} MCMC steps", chains, steps),
                  {}, rows_labelled,
                  "One column per chain, started from the replay buffer; rows are snapshots (step 0 at the top). "
                  "Samples that stay digit-like over long runs indicate a stable energy.");
  torch::NoGradGuard no_grad;
  torch::Tensor e0 = tr.target().energy(rows.front()), e1 = tr.target().energy(state.x);
  return {{"steps", steps},
          {"chains", chains},
          {"accept", accept / static_cast<double>(steps)},
          {"energy_start", e0.mean().item<double>()},
          {"energy_end", e1.mean().item<double>()},
          {"seconds", std::chrono::duration<double>(Clock::now() - t0).count()},
          {"figure", png}};
}

}  // namespace nmcmc
