// Speed benchmarks (never part of the test suite). Prints one JSON line per measurement.
//   nmcmc_bench learned  --config configs/funnel1.json --batch 1024 --mode train|sample [--reps 5] [--threads 1]
//   nmcmc_bench baseline --target-json '{"name":"icg"}' --sampler hmc --chains 64 [--steps 500] [--threads 1]
//   nmcmc_bench transport --target-json '{"name":"funnel","dim":5}' --rows 4 [--layers 8] [--hidden 0] [--reps 2000]
//                        (seconds per pulled-back gradient through a flow: the native pass of Note [The
//                        flow's native pass] against LibTorch's graph, and the target's own gradient)
//   nmcmc_bench fit --target-json '{"name":"funnel","dim":5}' --points 2000 --steps 200 [--layers 8]
//                        (seconds per step of the flow's Fisher fit, Note [The fit's own gradient], against
//                        LibTorch's double back-propagation; same points, same steps)
//   nmcmc_bench summary  --draws 200000 --chains 64 --phi 0.5 [--simple]   (seconds per parameter of the
//                        Stan summary on AR(1) draws; --simple also times the whole-tensor reference)
#include <CLI/CLI.hpp>
#include "nmcmc/process/allocator.hpp"
#include "nmcmc/process/blas_kernels.hpp"
#include "nmcmc/process/environment.hpp"
#include "nmcmc/process/gemm.hpp"
#include <torch/csrc/autograd/profiler_legacy.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/targets/targets.hpp"

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
double peak_rss_mb() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

/// A config's target and a fresh learned sampler for it, training at `batch` for "ever".
struct LearnedSetup {
  nmcmc::TrainConfig cfg;
  std::shared_ptr<nmcmc::Target> target;
  nmcmc::LearnedSampler sampler{nullptr};
  LearnedSetup(const std::string& config, int64_t batch, const std::string& matmul, const std::string& gemm,
               bool keep_zero_rows)
      : cfg(nmcmc::parse_train_config(nmcmc::read_train_config_file(config))),
        target(nmcmc::make_target(cfg.target, torch::kFloat32)) {
    auto model = cfg.model;
    model.dim = target->dim();
    if (!matmul.empty()) model.matmul = nmcmc::parse_enum<nmcmc::MatmulOption>(matmul);
    if (!gemm.empty()) model.gemm = nmcmc::parse_enum<nmcmc::GemmBackend>(gemm);
    cfg.train.batch = batch;
    cfg.train.budget.steps = 1000000;
    sampler = nmcmc::LearnedSampler(model);
    nmcmc::LinearPolicy policy = sampler->linear_policy();
    policy.skip_zero_gradient_rows = !keep_zero_rows;
    sampler->set_linear_policy(policy);
  }
};

int main(int argc, char** argv) {
  nmcmc::use_best_blas_kernels(argv);  // Note [OpenBLAS's kernels], as the nmcmc program
  nmcmc::tune_allocator();  // Note [Allocator policy], as the nmcmc program
  nmcmc::warn_gemm_environment();
  CLI::App app{"nmcmc speed benchmarks"};
  app.require_subcommand(1);
  std::string config, mode = "train", target_json = R"({"name":"icg"})", sampler = "hmc";
  int64_t batch = 1024, reps = 5, chains = 64, steps = 500, leapfrog = 10;
  int threads = 1;
  auto* learned = app.add_subcommand("learned", "seconds per training / sampling step of the learned sampler");
  learned->add_option("--config", config)->required();
  learned->add_option("--batch", batch);
  learned->add_option("--mode", mode);
  learned->add_option("--reps", reps);
  learned->add_option("--threads", threads);
  std::string trace, matmul, gemm;
  learned->add_option("--matmul", matmul, "the model's matmul option (default: the config's, else auto)")
      ->check(CLI::IsMember({"auto", "native", "bfloat16"}));
  learned->add_option("--gemm", gemm, "the model's gemm option (default: the config's, else auto; A/B of the backends)")
      ->check(CLI::IsMember({"auto", "onednn", "libtorch"}));
  bool keep_zero_rows = false, libtorch_step = false, native_step = false;
  learned->add_flag("--keep-zero-rows", keep_zero_rows,
                    "multiply every row in the backward pass, also those of zero gradient (Note [Zero-gradient rows]; A/B)");
  learned->add_flag("--native-step", native_step,
                    "sample: the native pass wherever it applies, past model.native_max_flops too (engine native)");
  learned->add_flag("--libtorch-step", libtorch_step,
                    "sample: every step through LibTorch (A/B of Note [The learned step's native pass])");
  learned->add_option("--trace", trace, "write a chrome trace of the timed steps (LibTorch's profiler) to this file");
  auto* baseline = app.add_subcommand("baseline", "MH steps per second of a baseline sampler");
  baseline->add_option("--target-json", target_json);
  baseline->add_option("--sampler", sampler);
  baseline->add_option("--chains", chains);
  baseline->add_option("--steps", steps);
  baseline->add_option("--leapfrog", leapfrog);
  baseline->add_option("--threads", threads);
  double phi = 0.5;
  int64_t draws = 200000;
  bool simple = false;
  auto* summary = app.add_subcommand("summary", "seconds per parameter of the Stan summary (long runs)");
  summary->add_option("--draws", draws);
  summary->add_option("--chains", chains);
  summary->add_option("--phi", phi, "AR(1) coefficient of the draws (0.95+: long autocorrelation, FFT path)");
  summary->add_flag("--simple", simple, "also time the whole-tensor reference implementation");
  auto* dist = app.add_subcommand("distributed", "data-parallel training step: collectives' share and bytes "
                                                 "(run one per rank with the torchrun variables set)");
  dist->add_option("--config", config)->required();
  dist->add_option("--batch", batch, "global batch (split over the ranks)");
  dist->add_option("--reps", reps);
  dist->add_option("--threads", threads);
  auto* transport = app.add_subcommand("transport", "a pulled-back gradient through a flow: native pass against LibTorch's graph");
  int64_t rows = 4, layers = 8, hidden = 0;
  transport->add_option("--target-json", target_json);
  transport->add_option("--rows", rows);
  transport->add_option("--layers", layers);
  transport->add_option("--hidden", hidden);
  transport->add_option("--reps", reps);
  transport->add_option("--threads", threads);
  bool native_only = false;
  transport->add_flag("--native-only", native_only, "time the native pass only (for a profiler)");
  auto* fit = app.add_subcommand("fit", "seconds per step of the flow's Fisher fit: its own gradient against LibTorch's double back-propagation");
  int64_t points = 2000;
  fit->add_option("--target-json", target_json);
  fit->add_option("--points", points, "exact draws of the target to fit");
  fit->add_option("--steps", steps);
  fit->add_option("--layers", layers);
  fit->add_option("--hidden", hidden);
  fit->add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);

  if (*transport) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto target = nmcmc::make_target(json::parse(target_json), f64);
    const int64_t d = target->dim();
    nmcmc::FlowTransport flow(nmcmc::FlowOptions().set_dim(d).set_layers(layers).set_hidden(hidden).set_mask_seed(1));
    at::Generator gen = nmcmc::make_generator(1);
    flow->perturb(0.05, gen);
    nmcmc::TransportedTarget latent(*target, flow);
    torch::Tensor z = torch::randn({rows, d}, gen, f64) * 0.5;
    // LibTorch's graph: what TransportedTarget ran before the native pass
    auto graph = [&] {
      torch::Tensor zl = z.clone().requires_grad_(true);
      nmcmc::TransportPass f = flow->forward(zl);
      nmcmc::EnergyGrad eg = target->energy_and_grad(f.out.detach());
      return torch::autograd::grad({(f.out * eg.grad).sum() - f.log_det.sum()}, {zl})[0];
    };
    auto time_it = [&](auto fn) {
      std::vector<double> s;
      for (int rep = 0; rep < 5; ++rep) {
        auto t0 = Clock::now();
        for (int64_t i = 0; i < reps; ++i) fn();
        s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(reps));
      }
      return median(s);
    };
    const double t_native = time_it([&] { (void)latent.energy_and_grad(z); });
    const double t_graph = native_only ? 0.0 : time_it([&] { (void)graph(); });
    const double t_target = native_only ? 0.0 : time_it([&] { (void)target->energy_and_grad(z); });
    const double diff = (latent.energy_and_grad(z).grad - graph()).abs().max().item<double>();
    json out = {{"bench", "transport"}, {"target", target->spec()}, {"rows", rows}, {"layers", layers},
                {"hidden", hidden > 0 ? hidden : nmcmc::default_flow_hidden(d)},
                {"threads", threads}, {"native_us", 1e6 * t_native}, {"graph_us", 1e6 * t_graph}, {"target_us", 1e6 * t_target},
                {"graph_over_native", t_graph / t_native}, {"max_abs_diff", diff}};
    std::cout << out.dump() << std::endl;
    return 0;
  }

  if (*fit) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto target = nmcmc::make_target(json::parse(target_json), f64);
    const int64_t d = target->dim();
    at::Generator gen = nmcmc::make_generator(1);
    torch::Tensor x = target->sample(points, gen);
    torch::Tensor g = target->energy_and_grad(x).grad;
    json out = {{"bench", "fit"}, {"target", target->spec()}, {"points", points}, {"steps", steps}, {"layers", layers},
                {"hidden", hidden > 0 ? hidden : nmcmc::default_flow_hidden(d)}, {"threads", threads}};
    for (bool own : {true, false}) {
      nmcmc::FlowTransport flow(nmcmc::FlowOptions().set_dim(d).set_layers(layers).set_hidden(hidden).set_mask_seed(1));
      nmcmc::FitOptions o;
      o.steps = steps;
      o.patience = steps;  // every step runs
      o.tolerance = 0.0;
      o.own_gradient = own;
      nmcmc::FitReport r = nmcmc::fit_transport(*flow, x, g, o);
      const std::string key = own ? "own" : "autograd";
      out[key] = {{"seconds", r.seconds}, {"steps", r.steps}, {"steps_per_s", static_cast<double>(r.steps) / r.seconds},
                  {"loss_start", r.loss_start}, {"loss_end", r.loss_end}};
    }
    out["autograd_over_own"] = out["autograd"]["seconds"].get<double>() / out["own"]["seconds"].get<double>();
    std::cout << out.dump() << std::endl;
    return 0;
  }

  if (*dist) {
    auto comm = nmcmc::parallel::connect(nmcmc::dist_options_from_environment());
    LearnedSetup setup(config, batch, matmul, gemm, keep_zero_rows);
    auto& [cfg, target, sampler] = setup;
    nmcmc::Trainer trainer(*target, sampler.ptr(), cfg.train, comm);
    trainer.broadcast_from_root();
    std::vector<double> step_s, comm_s;
    int64_t bytes = 0, calls = 0;
    for (int64_t r = 0; r < reps + 1; ++r) {
      comm->barrier();
      const auto stats0 = comm->stats();
      auto t0 = Clock::now();
      trainer.step();
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r == 0) continue;  // warm-up
      step_s.push_back(sec);
      comm_s.push_back(comm->stats().seconds - stats0.seconds);
      bytes = comm->stats().bytes - stats0.bytes;
      calls = comm->stats().calls - stats0.calls;
    }
    // The all-reduce alone, both ranks aligned by a barrier: what the gradients' transfer costs
    // without the wait for the slower rank.
    int64_t params = 0;
    for (auto& p : sampler->parameters()) params += p.numel();
    std::vector<torch::Tensor> buffer = {torch::ones({params})};
    std::vector<double> pure;
    for (int r = 0; r < 20; ++r) {
      comm->barrier();
      auto t0 = Clock::now();
      comm->all_reduce_sum(buffer);
      pure.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (comm->is_root()) {
      const double step = median(step_s), allreduce = median(pure);
      json out = {{"bench", "distributed"}, {"config", cfg.name}, {"world_size", comm->world_size()},
                  {"global_batch", batch}, {"threads_per_rank", threads}, {"reps", reps},
                  {"seconds_per_step", step}, {"collective_seconds_per_step_incl_wait", median(comm_s)},
                  {"allreduce_seconds_gradients", allreduce}, {"allreduce_share_of_step", allreduce / step},
                  {"collective_share_incl_wait", median(comm_s) / step}, {"bytes_per_step", bytes},
                  {"collectives_per_step", calls}, {"parameters", params}, {"peak_rss_mb", peak_rss_mb()}};
      std::cout << out.dump() << std::endl;
    }
    return 0;
  }

  if (*summary) {
    // AR(1) chains in stationarity, [S, C, 1].
    at::Generator gen = nmcmc::make_generator(7);
    torch::Tensor e = torch::randn({draws, chains}, gen, torch::kFloat64);
    torch::Tensor x = torch::empty_like(e);
    auto xa = x.accessor<double, 2>();
    auto ea = e.accessor<double, 2>();
    const double sd = std::sqrt(1 - phi * phi);
    for (int64_t c = 0; c < chains; ++c) xa[0][c] = ea[0][c];
    for (int64_t t = 1; t < draws; ++t)
      for (int64_t c = 0; c < chains; ++c) xa[t][c] = phi * xa[t - 1][c] + sd * ea[t][c];
    x = x.unsqueeze(2);
    auto time = [&](auto&& f) {
      auto t0 = Clock::now();
      auto r = f();
      return std::make_pair(std::chrono::duration<double>(Clock::now() - t0).count(), r.ess_bulk[0].template item<double>());
    };
    auto [fast_s, fast_ess] = time([&] { return nmcmc::stan_summary(x); });
    json out = {{"bench", "summary"}, {"draws", draws}, {"chains", chains}, {"phi", phi},
                {"seconds_per_parameter", fast_s}, {"ess_bulk", fast_ess}, {"peak_rss_mb", peak_rss_mb()}};
    if (simple) {
      auto [simple_s, simple_ess] = time([&] { return nmcmc::simple::stan_summary(x); });
      out["simple_seconds_per_parameter"] = simple_s;
      out["simple_ess_bulk"] = simple_ess;
    }
    std::cout << out.dump() << std::endl;
    return 0;
  }

  if (*learned) {
    const uint64_t skipped_before = nmcmc::test_hooks::zero_gradient_rows_skipped();
    LearnedSetup setup(config, batch, matmul, gemm, keep_zero_rows);
    auto& [cfg, target, sampler] = setup;
    nmcmc::Trainer trainer(*target, sampler.ptr(), cfg.train);
    const double flops_per_row = static_cast<double>(sampler->flops_per_step());
    std::vector<double> times;
    if (mode == "train") {
      trainer.step();  // warm-up
      std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
      if (!trace.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(trace);
      for (int64_t r = 0; r < reps; ++r) {
        auto t0 = Clock::now();
        trainer.step();
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    } else {
      auto proposal = std::make_shared<nmcmc::LearnedProposal>(sampler);
      sampler->eval();
      sampler->set_engine(libtorch_step ? nmcmc::Engine::kLibTorch
                          : native_step ? nmcmc::Engine::kNative
                                        : nmcmc::Engine::kAuto);
      nmcmc::MetropolisHastings kernel(proposal);
      at::Generator gen = nmcmc::make_generator(1);
      nmcmc::ChainState s = kernel.init(*target, target->has_sampler() ? target->sample(batch, gen) : torch::zeros({batch, target->dim()}));
      s = kernel.step(*target, s, gen).first;  // warm-up
      std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
      if (!trace.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(trace);
      for (int64_t r = 0; r < reps + 1; ++r) {
        auto t0 = Clock::now();
        const int inner = 5;
        for (int i = 0; i < inner; ++i) s = kernel.step(*target, s, gen).first;
        (void)s.energy.sum().item<double>();
        if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
      }
    }
    const double sec = median(times);
    // Training: forward + backward + double backward ~ 3x the flops of the two passes.
    const double flops = flops_per_row * static_cast<double>(batch) * (mode == "train" ? 3.0 : 1.0);
    json out = {{"bench", "learned"}, {"config", cfg.name}, {"mode", mode}, {"batch", batch}, {"threads", threads},
                {"seconds_per_step", sec}, {"network_flops_per_step", flops}, {"network_gflops_per_s", flops / sec / 1e9},
                {"peak_rss_mb", peak_rss_mb()}, {"reps", reps}, {"matmul", sampler->options().matmul},
                {"native_step", mode != "train" && [&] {
                   torch::NoGradGuard no_grad;  // as a sampling step runs
                   return sampler->native_step_applies(torch::zeros({batch, target->dim()}));
                 }()},
                {"amx_bf16", nmcmc::cpu_has_fast_bf16_matmul()},
                {"malloc", nmcmc::tune_allocator().applied ? "heap-reuse" : "default"},
                {"zero_rows_skipped_per_step", static_cast<double>(nmcmc::test_hooks::zero_gradient_rows_skipped() - skipped_before) /
                                                   static_cast<double>(mode == "train" ? reps + 1 : 1)}};
    std::cout << out.dump() << std::endl;
    return 0;
  }
  auto target = nmcmc::make_target(json::parse(target_json), torch::kFloat32);
  nmcmc::MetropolisHastings kernel(nmcmc::make_baseline_proposal(
      nmcmc::ProposalOptions().set_sampler(nmcmc::parse_enum<nmcmc::SamplerKind>(sampler)).set_leapfrog(leapfrog).set_step_size(0.01)));
  at::Generator gen = nmcmc::make_generator(1);
  nmcmc::ChainState s = kernel.init(*target, torch::zeros({chains, target->dim()}));
  for (int i = 0; i < 20; ++i) s = kernel.step(*target, s, gen).first;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) s = kernel.step(*target, s, gen).first;
  (void)s.energy.sum().item<double>();
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  json out = {{"bench", "baseline"}, {"target", target->spec()}, {"sampler", sampler}, {"chains", chains},
              {"threads", threads}, {"steps_per_second", steps / sec}, {"chain_steps_per_second", steps * chains / sec}};
  std::cout << out.dump() << std::endl;
  return 0;
}
