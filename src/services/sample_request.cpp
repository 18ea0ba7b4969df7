// The sampling request behind `nmcmc sample` and the Python package's nmcmc.sample.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/core/tensor_options.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/mapped_draws.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/kernels/warm_start.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/stan.hpp"
#include "nmcmc/targets/torchscript.hpp"
#include "nmcmc/training/trainer.hpp"
#include "nmcmc/version.hpp"
#include "seed_streams.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {
/// A request turned into what runs it: the kernel, the target, the run's options and the config
/// written with its outputs.
struct Prepared {
  std::unique_ptr<Kernel> kernel;
  std::shared_ptr<Target> target;
  RunOptions run;
  OutputFormats formats;  // checked before the run
  json config, model_meta;
  bool learned = false;
  bool other_data = false;  // a learned model on other data of its Stan program
  torch::Tensor warm_metric;  // Note [Warm starts]: the metric the kernel took from it (kept unless adapted)
  std::shared_ptr<TransportedTarget> latent;  // a learned model trained in a flow's latent space: runs on it
};

// Note [The sample options' rules]
// Every rule that ties one of `nmcmc sample`'s options to another is one row of kSampleRules,
// checked in order before anything is read, built or written: a refused request costs nothing,
// leaves no output and gets one message (the first broken rule's). Rules about one value alone
// (a positive chain count, a known metric) are the parsers' and the options' own.
struct SampleRule {
  bool (*broken)(const SampleOptions& a, const SampleRequest& request);
  const char* message;
};

bool is_learned(const SampleOptions& a) { return a.sampler == SamplerKind::kLearned; }
bool has_transport(const SampleOptions& a) { return a.transport.kind != TransportKind::kNone; }

const SampleRule kSampleRules[] = {
    {[](const SampleOptions& a, const SampleRequest&) { return a.metric && a.adapt_mass && *a.metric != "diag"; },
     "--adapt-mass means --metric diag"},
    {[](const SampleOptions& a, const SampleRequest&) {
       return is_learned(a) && (a.adapt_mass || (a.metric && *a.metric != "unit"));
     },
     "--metric and --adapt-mass do not apply to the learned sampler"},
    {[](const SampleOptions& a, const SampleRequest&) { return has_transport(a) && is_learned(a); },
     "--transport applies to nuts, hmc and mala; the learned sampler gets its flow in training "
     "(nmcmc train --transport flow) and samples in it"},
    {[](const SampleOptions& a, const SampleRequest&) { return has_transport(a) && a.sampler == SamplerKind::kRwm; },
     "--transport works from gradients: use nuts, hmc or mala (rwm computes none)"},
    {[](const SampleOptions& a, const SampleRequest&) { return is_learned(a) && !a.model; },
     "--sampler learned needs --model FILE (from `nmcmc train`)"},
    {[](const SampleOptions& a, const SampleRequest&) { return !is_learned(a) && a.model; },
     "--model goes with --sampler learned"},
    {[](const SampleOptions& a, const SampleRequest&) { return !is_learned(a) && a.matmul; },
     "--matmul goes with --sampler learned (its networks' GEMMs)"},
    {[](const SampleOptions& a, const SampleRequest&) { return !is_learned(a) && a.persistence; },
     "--persistence goes with --sampler learned (its base draw)"},
    {[](const SampleOptions& a, const SampleRequest&) { return a.persistence && !(*a.persistence >= 0 && *a.persistence < 1); },
     "--persistence must be in [0, 1)"},
    {[](const SampleOptions& a, const SampleRequest&) { return a.thin && *a.thin < 1; },
     "--thin must be at least 1"},
    {[](const SampleOptions& a, const SampleRequest&) { return !is_learned(a) && a.gemm; },
     "--gemm goes with --sampler learned (its networks' GEMMs)"},
    {[](const SampleOptions& a, const SampleRequest& r) { return !is_learned(a) && r.target.is_null(); },
     "give a target"},
    {[](const SampleOptions& a, const SampleRequest&) { return a.no_adapt && !a.step_size; },
     "--no-adapt needs --step-size"},
    {[](const SampleOptions& a, const SampleRequest&) { return a.step_size_per_chain && a.sampler != SamplerKind::kNuts; },
     "--step-size-per-chain goes with --sampler nuts (the other samplers have one step size for all chains)"},
    {[](const SampleOptions& a, const SampleRequest&) { return is_learned(a) && a.step_size; },
     "--step-size does not apply to the learned sampler (its step size is learned)"},
    {[](const SampleOptions& a, const SampleRequest&) {
       return !a.warm_start.is_null() && (is_learned(a) || a.sampler == SamplerKind::kRwm || has_transport(a));
     },
     "--warm-start applies to nuts, hmc and mala without a transport (the learned sampler starts from another "
     "data set's model with `nmcmc train --from`)"},
    {[](const SampleOptions& a, const SampleRequest&) { return a.init == "buffer" && !is_learned(a); },
     "--init buffer needs --sampler learned (the chains saved with its checkpoint)"},
};

void check_rules(const SampleRequest& request) {
  check_transport_choice(request.options.transport, /*sampling=*/true, "sample");  // Note [The transport's options]
  for (const SampleRule& rule : kSampleRules) {
    if (rule.broken(request.options, request)) throw UsageError(rule.message);
  }
}

/// The kernel a request runs, with the target spec and tensor options it runs on (a learned
/// model brings its own target, dtype and flow).
struct Made {
  std::unique_ptr<Kernel> kernel;
  json target_spec, model_meta;
  torch::TensorOptions options;
  FlowTransport flow{nullptr};
  bool other_data = false;
};

Made make_kernel(const SampleRequest& request, torch::TensorOptions options) {
  const SampleOptions& a = request.options;
  Made m;
  m.target_spec = request.target;
  m.options = options;
  if (!is_learned(a)) {
    m.kernel = make_baseline_kernel(ProposalOptions()
                                        .set_sampler(a.sampler)
                                        .set_step_size(a.step_size)
                                        .set_leapfrog(a.leapfrog)
                                        .set_jitter(a.jitter)
                                        .set_max_depth(a.max_depth));
    return m;
  }
  LearnedRun lr = load_learned_run(*a.model, request.target.is_null() ? std::nullopt : std::optional<json>(request.target),
                                   options, a.dtype.has_value(), a.matmul, a.gemm, a.engine);
  if (a.persistence) std::dynamic_pointer_cast<LearnedProposal>(lr.proposal)->set_persistence(*a.persistence);
  m.kernel = std::make_unique<MetropolisHastings>(lr.proposal);
  m.target_spec = lr.target_spec;
  m.model_meta = lr.meta;
  m.options = lr.options;
  m.flow = lr.transport;
  m.other_data = lr.other_data;
  return m;
}

/// Sets the run's starting points and returns the init recorded: "auto" is the learned sampler's
/// own chains (the bootstrap buffer saved with its checkpoint) when it has them - a trained flow
/// has only seen points near the typical set, and from far outside it may reject every proposal -
/// else Stan's uniform(-2, 2); a warm start's chains where it has them. With a flow (`latent`) the
/// chains run in z: the buffer is in z, other starting points are drawn in x and mapped.
std::string set_starting_points(const SampleRequest& request, Target& target, const torch::TensorOptions& options,
                                const WarmStart* warm_start, TransportedTarget* latent, RunOptions& run) {
  const SampleOptions& a = request.options;
  std::string init = a.init;
  torch::Tensor buffer;
  if (is_learned(a) && (init == "auto" || init == "buffer") && !request.init_x.defined()) buffer = load_buffer(*a.model);
  if (init == "auto") init = buffer.defined() ? "buffer" : "uniform";
  if (init == "buffer" && !buffer.defined() && !request.init_x.defined()) {
    throw UsageError("--init buffer: the checkpoint " + *a.model +
                     " holds no buffer (it was trained on exact samples); use --init exact, uniform or zero");
  }
  run.set_chains(a.chains).set_warmup(a.warmup).set_draws(a.draws).set_init(init == "buffer" ? "uniform" : init);
  run.set_thin(a.thin.value_or(1));  // the learned sampler's default: prepare
  if (request.init_x.defined()) run.set_init_x(request.init_x);
  else if (init == "buffer") run.set_init_x(buffer);
  else if (warm_start && a.init == "auto") run.set_init_x(warm_start->positions.to(options));
  if (latent) {
    if (request.init_x.defined()) {
      run.set_init_x(latent->to_latent(request.init_x.to(target.options())));
    } else if (init != "buffer") {
      at::Generator gen = make_generator(seed_of(a.seed, SeedStream::kStartingPoints));
      run.set_init_x(latent->to_latent(initial_positions(target, init, a.chains, gen)));
    }
  }
  if (request.init_x.defined()) return "given";
  return warm_start && a.init == "auto" ? "warm start" : init;
}

/// The config written with a run's outputs: what was asked and what it ran with.
json record_config(const SampleRequest& request, const Target& target, MetricAdapt metric, const std::string& init,
                   const WarmStart* warm_start, const torch::TensorOptions& options) {
  const SampleOptions& a = request.options;
  json config = {{"command", request.command},
                 {"target", target.spec()},
                 {"sampler", a.sampler},
                 {"leapfrog", a.leapfrog},
                 {"chains", a.chains},
                 {"warmup", a.warmup},
                 {"draws", a.draws},
                 {"seed", a.seed},
                 {"init", init},
                 {"adapt_step", !a.no_adapt},
                 {"adapt_mass", metric != MetricAdapt::kUnit},
                 {"dtype", options.dtype().toScalarType() == torch::kFloat64 ? "float64" : "float32"},
                 {"device", options.device().str()},
                 {"threads", torch::get_num_threads()},
                 {"nmcmc_version", NMCMC_VERSION}};
  const bool nuts = a.sampler == SamplerKind::kNuts;
  if (nuts) config["max_depth"] = a.max_depth;
  if (is_learned(a)) config["persistence"] = a.persistence.value_or(kDefaultPersistence);  // Note [Persistent noise]
  if (auto* module = dynamic_cast<const TorchScriptTarget*>(&target)) {
    config["engine"] = {{"kind", module->engine()}, {"note", module->engine_note()}};  // Note [Native engine]
  }
  if (has_transport(a)) {
    const TransportOptions t = transport_options(a.transport, kDefaultTransportRounds);
    config["transport"] = {{"kind", t.kind}, {"layers", t.layers}, {"rounds", t.rounds}, {"global_moves", t.global_moves}};
  }
  if (metric != MetricAdapt::kUnit || nuts) config["metric"] = metric;
  if (a.engine) config["native_copies"] = *a.engine;  // `--engine` (Note [Native copies])
  if (warm_start) {
    config["warm_start"] = {{"sampler", warm_start->sampler},
                            {"step_size", warm_start->step_size},
                            {"metric", warm_start->metric_kind()},
                            {"metric_adapted", metric != MetricAdapt::kUnit},
                            {"source", a.warm_start.is_string() ? a.warm_start : json("record")}};
  }
  return config;
}

Prepared prepare(const SampleRequest& request) {
  const SampleOptions& a = request.options;
  check_rules(request);  // Note [The sample options' rules]
  // Note [Stan programs]: a Stan program's density is float64 throughout, and so are its chains
  // unless asked otherwise (a float32 state rounds away what its scales need).
  const bool stan = request.target.is_object() && request.target.value("name", std::string()) == "stan";
  const OutputFormats formats = parse_formats(a.formats);  // checked before the run
  // The metric: `metric`, or adapt_mass (= diag); NUTS adapts a diagonal one by default, as Stan.
  // Note [Warm starts]: a warm start keeps its metric unless one is asked for.
  const bool warm = !a.warm_start.is_null();
  const bool default_diag = a.adapt_mass || (a.sampler == SamplerKind::kNuts && !warm);
  const MetricAdapt metric = parse_enum<MetricAdapt>(a.metric.value_or(default_diag ? "diag" : "unit"));
  Made made = make_kernel(request, parse_tensor_options(a.dtype.value_or(stan ? "float64" : "float32"), a.device));
  const torch::TensorOptions& options = made.options;
  if (a.engine) {  // Note [Native copies]: the run's engine over a model's own spec; a given spec must agree
    json given = request.target;
    set_target_engine(given, *a.engine);
    set_target_engine(made.target_spec, *a.engine, /*replace=*/true);
  }
  std::shared_ptr<Target> target = make_target(made.target_spec, options);
  std::optional<WarmStart> warm_start;
  torch::Tensor warm_metric;
  if (warm) {
    warm_start = WarmStart::read(a.warm_start);
    warm_start->check_model(*target, "--warm-start");
    warm_metric = warm_start->apply(*made.kernel, options, /*dense=*/true, /*step=*/!a.step_size);
    if (!a.step_size) made.kernel->set_step_size(warm_start->step_size);
  }
  RunOptions run;
  run.set_metric(metric);
  // Unset for the learned sampler: its step size is learned, so warm-up is burn-in only.
  if (!is_learned(a)) run.set_adapt_step(!a.no_adapt);
  run.set_target_accept(a.target_accept.value_or(default_target_accept(a.sampler)));
  run.step_size_per_chain = a.step_size_per_chain;
  run.should_stop = request.should_stop;
  if (a.output) run.scratch_directory = *a.output;  // large draws are memory-mapped there (unlinked)
  std::shared_ptr<TransportedTarget> latent;
  if (made.flow) {
    // Note [Learned proposal in a flow's latent space]: the chains run in z.
    if (made.flow->dim() != target->dim()) {
      throw DataError(fmt::format("model '{}': its flow transport has dimension {}, the target {}", *a.model,
                                  made.flow->dim(), target->dim()));
    }
    latent = std::make_shared<TransportedTarget>(*target, made.flow);
  }
  const std::string init = set_starting_points(request, *target, options, warm_start ? &*warm_start : nullptr, latent.get(), run);

  Prepared prep;
  prep.config = record_config(request, *target, metric, init, warm_start ? &*warm_start : nullptr, options);
  const json& meta = made.model_meta;
  if (is_learned(a)) {
    prep.config["model"] = {{"file", *a.model}, {"options", meta["model"]}, {"trained_steps", meta["step"]}};
    if (!a.thin) run.set_thin(learned_default_thin(meta.value("check", json())));  // Note [The learned sampler's thinning]
  }
  prep.config["thin"] = run.thin;
  if (made.other_data) prep.config["model"]["trained_on"] = meta["target"];
  if (latent) prep.config["model"]["transport"] = meta["transport"];
  prep.kernel = std::move(made.kernel);
  prep.target = target;
  prep.run = run;
  prep.model_meta = made.model_meta;
  prep.learned = is_learned(a);
  prep.other_data = made.other_data;
  if (metric == MetricAdapt::kUnit) prep.warm_metric = warm_metric;
  prep.latent = latent;
  prep.formats = formats;
  return prep;
}
}  // namespace

int64_t learned_default_thin(const json& check) {
  if (!check.is_object()) return 1;
  const double ess = check.value("min_ess_bulk", 0.0);
  const double draws = check.value("chains", 0.0) * check.value("draws", 0.0);
  if (!(ess > 0) || !(draws > 0)) return 1;
  const double half_tau = 0.5 * draws / ess;  // half the steps per effective draw
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(half_tau)), 1, kMaxLearnedThin);
}

SampleOptions sample_options_from_json(const json& j) { return options_from_json<SampleOptions>(j, "sample options"); }

SampleOutcome sample(const SampleRequest& request, const ProgressFn& progress, std::shared_ptr<parallel::Communicator> comm) {
  const SampleOptions& a = request.options;
  if (!comm) comm = parallel::single_process();
  const int world = comm->world_size(), rank = comm->rank();
  Prepared prep = prepare(request);
  const OutputFormats& formats = prep.formats;
  if (world > 1 && dynamic_cast<const StanTarget*>(prep.target.get())) {
    // Note [Draws in the model's own parameters]: each draw is mapped where it is drawn, and the
    // ranks' mapped draws are not gathered yet.
    throw UsageError("a Stan program samples in one process (not under nmcmc launch yet)");
  }
  if ((has_transport(a) || prep.latent) && world > 1) {
    throw UsageError(prep.latent ? "a model trained with a flow transport samples in one process"
                                 : "--transport runs in one process");
  }
  SampleOutcome out;
  out.target = prep.target;
  out.config = prep.config;
  RunOptions& run = prep.run;
  const json training_log = prep.learned ? prep.model_meta.value("log", json()) : json();
  // With an output directory the draws go to disk as they are drawn: every rank streams its
  // chains' Stan CSV files (chain_K.csv, K their numbers in the whole run); the NetCDF file is
  // streamed by a single process, else written by rank 0 over all chains at the end.
  std::unique_ptr<DrawSink> stream;
  if (a.output) ensure_directory(*a.output);  // before the run: a bad directory fails now, not after
  if (a.output && world == 1 && (formats.csv || formats.netcdf)) {
    stream = make_output_sink(*a.output, out.config, formats, training_log);
  } else if (a.output && formats.csv && a.chains >= world) {
    json chain_config = prep.config;
    chain_config["seed"] = a.seed + static_cast<uint64_t>(rank);
    chain_config["world_size"] = world;
    chain_config["rank"] = rank;
    stream = std::make_unique<StanCsvStream>(*a.output, chain_config, parallel::block_of(a.chains, rank, world).first);
  }
  run.sink = stream.get();
  // Note [Draws in the model's own parameters]: a Stan program's draws are reported constrained.
  std::unique_ptr<MappedSink> mapped;
  auto gq_failures = std::make_shared<std::pair<int64_t, std::string>>(0, "");
  if (const auto* stan = dynamic_cast<const StanTarget*>(prep.target.get())) {
    mapped = std::make_unique<MappedSink>(run.sink, DrawMap{stan->constrained_names(true, true), stan->draw_mapper(a.seed, gq_failures)});
    run.sink = mapped.get();
  }
  json transport_report;
  if (has_transport(a)) {
    TransportChoice choice = a.transport;
    if (a.engine) choice.engine = *a.engine;  // the run's engine (Note [Native copies])
    const TransportOptions t = transport_options(choice, kDefaultTransportRounds);
    TransportRun tr = run_with_transport(*prep.target, *prep.kernel, run, t, a.seed, progress);
    out.result = std::move(tr.result);
    transport_report = std::move(tr.report);
    out.config["transport"]["report"] = transport_report;
  } else if (prep.latent) {
    out.result = run_mapped(*prep.latent, *prep.kernel, run, a.seed, progress);
  } else {
    out.result = run_sampler(*prep.target, *prep.kernel, run, a.seed, progress, comm.get());
  }
  // Note [Warm starts]: a metric kept from the warm start is the run's metric (its record carries it on).
  if (prep.warm_metric.defined() && !out.result.inv_mass.defined()) {
    out.result.inv_mass = prep.warm_metric;
    out.result.metric = prep.warm_metric.dim() == 2 ? "dense" : "diag";
  }
  // Note [Warm starts]: where the chains ended, in the space they move in (before mapping).
  json adaptation;
  if (!prep.learned && !has_transport(a) && world == 1 && out.result.complete) {
    adaptation = WarmStart::record(out.result, parameter_labels(*prep.target), prep.config["sampler"].get<std::string>());
  }
  if (mapped) {
    // The mapped result is the last run_sampler's (a transport's final run): its draws in Stan's
    // names; the warm-up's figures stay the whole run's (a transport adds its rounds, fits and trials).
    SampleResult m = mapped->take_result();
    m.grads_warmup = out.result.grads_warmup;
    m.energies_warmup = out.result.energies_warmup;
    m.seconds_warmup = out.result.seconds_warmup;
    out.result = std::move(m);
  }
  SampleResult& r = out.result;
  if (!r.draws.defined() || r.draws.size(0) == 0) return out;  // stopped before any draw
  if (world > 1) {
    out.config["chains"] = a.chains;
    out.config["seed"] = a.seed;
    out.config["world_size"] = world;
    out.config["chain_seeds"] = "seed + r for the chains of rank r (contiguous blocks, the first chains % world_size one longer)";
  }
  if (!comm->is_root()) return out;
  out.summary = summarise(r, *prep.target, int64_t{256} << 20, progress);
  if (!transport_report.is_null()) out.summary["transport"] = transport_report;
  if (!adaptation.is_null()) out.summary["adaptation"] = adaptation;
  if (prep.learned) {
    // Note [Training from a previous model]: a learned model fits the target it samples while its
    // accept rate stays above half of its training's mixing check's (a model on other data than it
    // was trained on, or whose networks no longer match the posterior, falls below that).
    const double accept = r.accept_stat.mean().item<double>();
    const json check = prep.model_meta.value("check", json());
    const double trained = check.is_object() ? check.value("accept", 0.0) : 0.0;
    const bool fits = !(trained > 0) || accept >= 0.5 * trained;
    json& f = out.summary["model_fit"];
    f = {{"accept", accept}, {"trained_accept", trained}, {"fits", fits}, {"other_data", prep.other_data},
         {"note", fits ? "the accept rate is at least half of the training check's"
                       : "the model does not fit this target as it fitted its training's: re-adapt it (nmcmc train "
                         "--from MODEL --steps 0) or train on (nmcmc train --from MODEL)"}};
    if (prep.other_data) f["trained_on"] = prep.model_meta.value("target", json());
    // Note [The mixing check]: a model whose training ended with a check that failed is said to be
    // one again here, where its draws are used.
    if (check.is_object() && check.contains("passes")) {
      f["training_check"] = {{"passes", check.value("passes", false)}, {"why", check.value("why", "")},
                             {"max_rhat", check.value("max_rhat", json())}, {"worst", check.value("worst", json())}};
    }
  }
  if (gq_failures->first > 0) {
    out.summary["generated_quantities_failures"] = gq_failures->first;
    out.summary["first_generated_quantities_failure"] = gq_failures->second;
  }
  if (!r.complete) {
    out.config["complete"] = false;
    out.config["draws_written"] = r.draws.size(0);
  }
  if (a.output) {
    OutputFormats rest = formats;
    if (world > 1) rest.csv = false;  // written by the ranks
    const bool streamed = world == 1 || !rest.netcdf;
    write_run(*a.output, out.config, r, out.summary, /*draws_written=*/streamed, rest, world == 1 ? json() : training_log);
  }
  return out;
}

}  // namespace nmcmc
