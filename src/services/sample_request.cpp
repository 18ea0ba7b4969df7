// The sampling request behind `nmcmc sample` and the Python package's nmcmc.sample.
#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/training/trainer.hpp"
#include "nmcmc/version.hpp"

namespace nmcmc {

using json = nlohmann::json;

SampleOutcome sample(const SampleRequest& a, const ProgressFn& progress) {
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
                                     options, a.dtype_given);
    kernel = std::make_unique<MetropolisHastings>(lr.proposal);
    target_spec = lr.target_spec;
    model_meta = lr.meta;
    options = lr.options;
  } else {
    if (a.model) throw UsageError("--model goes with --sampler learned");
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

  SampleOutcome out;
  out.target = target;
  json& config = out.config;
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

  // With an output directory the draws go to disk as they are drawn.
  std::unique_ptr<DrawSink> stream;
  if (a.output && (a.formats.csv || a.formats.netcdf)) {
    stream = make_output_sink(*a.output, config, a.formats, learned ? model_meta.value("log", json()) : json());
    run.sink = stream.get();
  }
  out.result = run_sampler(*target, *kernel, run, a.seed, progress);
  if (!out.result.draws.defined() || out.result.draws.size(0) == 0) return out;  // stopped before any draw
  out.summary = summarise(out.result, *target, int64_t{256} << 20, progress);
  if (!out.result.complete) {
    config["complete"] = false;
    config["draws_written"] = out.result.draws.size(0);
  }
  if (a.output) write_run(*a.output, config, out.result, out.summary, /*draws_written=*/true, a.formats);
  return out;
}

}  // namespace nmcmc
