// The sampling request behind `nmcmc sample` and the Python package's nmcmc.sample.
#include <fmt/format.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/training/trainer.hpp"
#include "nmcmc/version.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {
/// A request turned into what runs it: the kernel, the target, the run's options and the config
/// written with its outputs.
struct Prepared {
  std::unique_ptr<Kernel> kernel;
  std::shared_ptr<Target> target;
  RunOptions run;
  json config, model_meta;
  bool learned = false;
};

Prepared prepare(const SampleRequest& a) {
  torch::TensorOptions options = a.options;
  std::unique_ptr<Kernel> kernel;
  // The metric: `metric`, or adapt_mass (= diag); NUTS adapts a diagonal one by default, as Stan.
  const bool nuts = a.sampler == "nuts";
  if (a.metric && a.adapt_mass && *a.metric != "diag") throw UsageError("--adapt-mass means --metric diag");
  const MetricKind metric = parse_metric(a.metric.value_or(a.adapt_mass || nuts ? "diag" : "unit"));
  json target_spec = a.target;
  json model_meta;
  const bool learned = a.sampler == "learned";
  if (learned && metric != MetricKind::kUnit) throw UsageError("--metric and --adapt-mass do not apply to the learned sampler");
  if (learned) {
    if (!a.model) throw UsageError("--sampler learned needs --model FILE (from `nmcmc train`)");
    LearnedRun lr = load_learned_run(*a.model, a.target.is_null() ? std::nullopt : std::optional<json>(a.target),
                                     options, a.dtype_given, a.matmul);
    kernel = std::make_unique<MetropolisHastings>(lr.proposal);
    target_spec = lr.target_spec;
    model_meta = lr.meta;
    options = lr.options;
  } else {
    if (a.model) throw UsageError("--model goes with --sampler learned");
    if (a.matmul) throw UsageError("--matmul goes with --sampler learned (its networks' GEMMs)");
    if (a.target.is_null()) throw UsageError("give a target");
    kernel = make_baseline_kernel(ProposalOptions()
                                      .set_sampler(a.sampler)
                                      .set_step_size(a.step_size)
                                      .set_leapfrog(a.leapfrog)
                                      .set_jitter(a.jitter)
                                      .set_max_depth(a.max_depth));
  }
  if (a.no_adapt && !a.step_size) throw UsageError("--no-adapt needs --step-size");
  if (learned && a.step_size) throw UsageError("--step-size does not apply to the learned sampler (its step size is learned)");
  std::shared_ptr<Target> target = make_target(target_spec, options);
  if (a.output) ensure_directory(*a.output);  // fail before the run, not after
  RunOptions run;
  // Starting points: "auto" is the learned sampler's own chains (the bootstrap buffer saved with
  // its checkpoint) when it has them - a trained flow has only seen points near the typical set,
  // and from far outside it may reject every proposal - else Stan's uniform(-2, 2).
  std::string init = a.init;
  torch::Tensor buffer;
  if (learned && (init == "auto" || init == "buffer") && !a.init_x.defined()) buffer = load_buffer(*a.model);
  if (init == "auto") init = buffer.defined() ? "buffer" : "uniform";
  if (init == "buffer") {
    if (!learned) throw UsageError("--init buffer needs --sampler learned (the chains saved with its checkpoint)");
    if (!buffer.defined() && !a.init_x.defined()) {
      throw UsageError("--init buffer: the checkpoint " + *a.model +
                       " holds no buffer (it was trained on exact samples); use --init exact, uniform or zero");
    }
  }
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_init(init == "buffer" ? "uniform" : init);
  if (a.init_x.defined()) run.set_init_x(a.init_x);
  else if (init == "buffer") run.set_init_x(buffer);
  run.set_adapt_mass(metric != MetricKind::kUnit).set_dense_mass(metric == MetricKind::kDense);
  // Unset for the learned sampler: its step size is learned, so warm-up is burn-in only.
  if (!learned) run.set_adapt_step(!a.no_adapt);
  run.set_target_accept(a.target_accept.value_or(default_target_accept(a.sampler)));
  run.should_stop = a.should_stop;
  if (a.output) run.scratch_directory = *a.output;  // large draws are memory-mapped there (unlinked)

  Prepared prep;
  json& config = prep.config;
  config = {{"command", a.command},
            {"target", target->spec()},
            {"sampler", a.sampler},
            {"leapfrog", a.leapfrog},
            {"chains", a.chains},
            {"warmup", a.warmup},
            {"draws", a.draws},
            {"seed", a.seed},
            {"init", a.init_x.defined() ? "given" : init},
            {"adapt_step", !a.no_adapt},
            {"adapt_mass", run.adapt_mass},
            {"dtype", options.dtype().toScalarType() == torch::kFloat64 ? "float64" : "float32"},
            {"device", options.device().str()},
            {"threads", torch::get_num_threads()},
            {"nmcmc_version", NMCMC_VERSION}};
  if (nuts) config["max_depth"] = a.max_depth;
  if (metric == MetricKind::kDense || nuts) config["metric"] = metric_name(metric);
  if (learned) config["model"] = {{"file", *a.model}, {"options", model_meta["model"]}, {"trained_steps", model_meta["step"]}};

  prep.kernel = std::move(kernel);
  prep.target = target;
  prep.run = run;
  prep.model_meta = model_meta;
  prep.learned = learned;
  return prep;
}
}  // namespace

SampleOutcome sample(const SampleRequest& a, const ProgressFn& progress,
                     std::shared_ptr<parallel::Communicator> comm) {
  if (comm && comm->world_size() > 1) return sample_sharded(a, progress, *comm);
  Prepared prep = prepare(a);
  SampleOutcome out;
  out.target = prep.target;
  out.config = prep.config;
  json& config = out.config;
  Target* target = prep.target.get();
  RunOptions& run = prep.run;
  // With an output directory the draws go to disk as they are drawn.
  std::unique_ptr<DrawSink> stream;
  if (a.output && (a.formats.csv || a.formats.netcdf)) {
    stream = make_output_sink(*a.output, config, a.formats, prep.learned ? prep.model_meta.value("log", json()) : json());
    run.sink = stream.get();
  }
  out.result = run_sampler(*target, *prep.kernel, run, a.seed, progress);
  if (!out.result.draws.defined() || out.result.draws.size(0) == 0) return out;  // stopped before any draw
  out.summary = summarise(out.result, *target, int64_t{256} << 20, progress);
  if (!out.result.complete) {
    config["complete"] = false;
    config["draws_written"] = out.result.draws.size(0);
  }
  if (a.output) write_run(*a.output, config, out.result, out.summary, /*draws_written=*/true, a.formats);
  return out;
}

namespace {
/// [S, c, ...] per rank -> [S, C, ...] over all ranks (chains in rank order).
torch::Tensor gather_chains(parallel::Communicator& comm, const torch::Tensor& t) {
  if (!t.defined()) return t;
  const bool is_bool = t.scalar_type() == torch::kBool;
  torch::Tensor local = (is_bool ? t.to(torch::kUInt8) : t).transpose(0, 1).contiguous();
  torch::Tensor all = comm.all_gather_rows(local).transpose(0, 1).contiguous();
  return is_bool ? all.to(torch::kBool) : all;
}
}  // namespace

SampleResult run_sampler_sharded(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                                 const ProgressFn& progress, parallel::Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  if (options.chains < world) {
    throw UsageError(fmt::format("{} chains cannot be shared by {} processes: give at least one chain each",
                                 options.chains, world));
  }
  auto [begin, end] = parallel::block_of(options.chains, rank, world);
  // This rank's chains are the run `chains = end - begin, seed = seed + rank`, with their own
  // warm-up and adaptation (as Stan's chains): Note [Data parallelism].
  RunOptions run = options;
  run.chains = end - begin;
  const uint64_t my_seed = seed + static_cast<uint64_t>(rank);
  if (run.init_x.defined()) {  // given or buffer starting points: the rows the whole run gives these chains
    torch::Tensor rows = torch::arange(begin, end, torch::kInt64).remainder(run.init_x.size(0));
    run.init_x = run.init_x.index_select(0, rows.to(run.init_x.device()));
  }
  SampleResult mine = run_sampler(target, kernel, run, my_seed, rank == 0 ? progress : nullptr);

  // Runs stopped early (Ctrl-C reaches the ranks at slightly different draws) keep the draws all have.
  const int64_t have = mine.draws.defined() ? mine.draws.size(0) : 0;
  const double c = static_cast<double>(run.chains);
  std::vector<double> t = parallel::all_reduce_doubles(
      comm, {mine.complete ? 0.0 : 1.0, mine.seconds_warmup, mine.seconds_sampling, mine.grads_warmup * c,
             mine.grads_sampling * c, mine.energies_warmup * c, mine.energies_sampling * c});
  const int64_t common = comm.all_gather_rows(torch::tensor({have}, torch::kInt64)).min().item<int64_t>();
  const double total = static_cast<double>(options.chains);
  SampleResult r;
  r.complete = t[0] == 0;
  r.seed = seed;
  r.draws_planned = mine.draws_planned;
  r.names = mine.names;
  r.max_tree_depth = mine.max_tree_depth;
  r.seconds_warmup = t[1] / world;  // the ranks run side by side: their mean wall time
  r.seconds_sampling = t[2] / world;
  r.grads_warmup = std::llround(t[3] / total);
  r.grads_sampling = std::llround(t[4] / total);
  r.energies_warmup = std::llround(t[5] / total);
  r.energies_sampling = std::llround(t[6] / total);
  if (common == 0) return r;  // stopped before any rank drew
  auto first = [&](const torch::Tensor& x) { return x.defined() ? x.narrow(0, 0, common) : x; };
  if (mine.draws.defined()) r.draws = gather_chains(comm, first(mine.draws).to(torch::kFloat64));
  r.lp = gather_chains(comm, first(mine.lp));
  r.accept_stat = gather_chains(comm, first(mine.accept_stat));
  r.divergent = gather_chains(comm, first(mine.divergent));
  r.tree_depth = gather_chains(comm, first(mine.tree_depth));
  r.energy = gather_chains(comm, first(mine.energy));
  torch::Tensor per_chain = mine.n_grad_chain.defined()
                                ? first(mine.n_grad_chain)
                                : first(mine.n_grad).unsqueeze(1).expand({common, run.chains}).contiguous();
  r.n_grad_chain = gather_chains(comm, per_chain);
  r.n_grad = std::get<0>(r.n_grad_chain.max(1));
  r.step_size_chain = gather_chains(comm, torch::full({1, run.chains}, mine.step_size, torch::kFloat64)).squeeze(0);
  r.step_size = r.step_size_chain.mean().item<double>();
  if (mine.inv_mass.defined()) {
    std::vector<int64_t> reps(mine.inv_mass.dim() + 1, 1);
    reps[0] = run.chains;
    r.inv_mass_chain = comm.all_gather_rows(mine.inv_mass.unsqueeze(0).repeat(reps));
    r.inv_mass = mine.inv_mass;  // rank 0's (each chain's own is in inv_mass_chain)
  }
  return r;
}

SampleOutcome sample_sharded(const SampleRequest& a, const ProgressFn& progress, parallel::Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  Prepared prep = prepare(a);
  SampleOutcome out;
  out.target = prep.target;
  RunOptions run = prep.run;
  // Each rank streams its chains' Stan CSV files (chain_K.csv, K their numbers in the whole run);
  // rank 0 writes the NetCDF file and summary.json over all chains at the end.
  std::unique_ptr<DrawSink> stream;
  if (a.output && a.formats.csv && a.chains >= world) {
    json chain_config = prep.config;
    chain_config["seed"] = a.seed + static_cast<uint64_t>(rank);
    chain_config["world_size"] = world;
    chain_config["rank"] = rank;
    stream = std::make_unique<StanCsvStream>(*a.output, chain_config, parallel::block_of(a.chains, rank, world).first);
    run.sink = stream.get();
  }
  out.result = run_sampler_sharded(*prep.target, *prep.kernel, run, a.seed, progress, comm);
  SampleResult& r = out.result;
  if (!r.draws.defined()) return out;
  out.config = prep.config;
  out.config["chains"] = a.chains;
  out.config["seed"] = a.seed;
  out.config["world_size"] = world;
  out.config["chain_seeds"] = "seed + r for the chains of rank r (contiguous blocks, the first chains % world_size one longer)";
  if (!comm.is_root()) return out;
  out.summary = summarise(r, *prep.target, int64_t{256} << 20, progress);
  if (!r.complete) {
    out.config["complete"] = false;
    out.config["draws_written"] = r.draws.size(0);
  }
  if (a.output) {
    OutputFormats rest = a.formats;
    rest.csv = false;  // written by the ranks
    write_run(*a.output, out.config, r, out.summary, /*draws_written=*/!rest.netcdf, rest,
              prep.learned ? prep.model_meta.value("log", json()) : json());
  }
  return out;
}

}  // namespace nmcmc
