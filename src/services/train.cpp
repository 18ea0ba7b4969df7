#include "nmcmc/services/train.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/targets.hpp"

#include "seed_streams.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

json TrainConfig::to_json() const {
  json j = {{"name", name}, {"target", target}, {"model", model.to_json()}, {"train", train.to_json()}, {"dtype", dtype}};
  if (transport.kind != TransportKind::kNone) j["transport"] = transport;
  return j;
}

json read_train_config_file(const std::string& path) {
  json config = read_config_file(path);
  if (config.is_object() && config.contains("target") && config["target"].is_object())
    resolve_target_paths(config["target"], fs::path(path).parent_path().string());
  return config;
}

std::string configs_directory() {
  // configs/ sits beside data/ in the source tree and in share/nmcmc when installed.
  const fs::path beside_data = fs::path(data_directory()).parent_path() / "configs";
  if (fs::exists(beside_data / "icg.json")) return beside_data.string();
  return "configs";
}


TrainConfig parse_train_config(const json& j) {
  if (!j.is_object()) throw UsageError("a training config must be a JSON object");
  for (auto& [key, value] : j.items()) {
    if (key != "name" && key != "target" && key != "model" && key != "train" && key != "dtype" && key != "eval" &&
        key != "paper" && key != "transport") {
      throw UsageError("config: unknown section '" + key + "'");
    }
  }
  if (!j.contains("target")) throw UsageError("config: missing \"target\"");
  TrainConfig c;
  c.name = j.value("name", std::string("run"));
  c.target = j["target"];
  json model = j.value("model", json::object());
  if (!model.contains("dim")) model["dim"] = 2;  // replaced by the target's dimension in train()
  c.model = LearnedOptions::from_json(model);
  c.train = TrainOptions::from_json(j.value("train", json::object()));
  c.dtype = j.value("dtype", std::string("float32"));
  if (c.dtype != "float32" && c.dtype != "float64") throw UsageError("config: dtype must be float32 or float64");
  if (j.contains("transport") && !j["transport"].is_null()) {
    const json& t = j["transport"];
    if (!t.is_object()) throw UsageError("config: \"transport\" must be an object, e.g. {\"kind\": \"flow\"}");
    for (auto& [key, value] : t.items()) {
      if (key != "kind" && key != "layers" && key != "hidden" && key != "rounds") {
        throw UsageError("config: unknown transport option '" + key + "' (kind, layers, hidden, rounds)");
      }
    }
    try {
      c.transport = t.get<TrainTransport>();
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      throw UsageError(std::string("config: transport: ") + e.what());
    }
    if (c.transport.layers < 0) throw UsageError("config: transport.layers must be non-negative");
    if (c.transport.hidden < 0) throw UsageError("config: transport.hidden must be non-negative");
    if (c.transport.rounds < 1) throw UsageError("config: transport.rounds must be at least 1");
    if (c.transport.kind != TransportKind::kNone &&
        (c.train.precondition_sampler == SamplerKind::kRwm || c.train.precondition_sampler == SamplerKind::kLearned)) {
      throw UsageError("config: a flow transport (kind flow or auto) is fitted from gradients: "
                       "train.precondition_sampler must be nuts, hmc or mala");
    }
    if (c.transport.kind != TransportKind::kNone && c.train.precondition_warmup < 100) {
      throw UsageError("config: a flow transport (kind flow or auto) is fitted in the warm-up: "
                       "train.precondition_warmup must be at least 100");
    }
  }
  return c;
}

int64_t default_hidden(int64_t dim) { return std::clamp<int64_t>(4 * dim, 64, 256); }

json default_train_config() {
  return {{"model", {{"variant", "langevin"}, {"precondition", "auto"}, {"learn_precondition", true}, {"hidden", 0}}},
          {"train", {{"rho", 0.3}, {"batch", 64}, {"steps", 3000}, {"patience", 200}, {"min_gain", 0.01}, {"max_seconds", 90}}},
          {"transport", {{"kind", "auto"}}}};
}

namespace {
/// Seeds the trainer's bootstrap buffer from a warm-up's draws [S, C, D]: the last draws of every
/// chain (where the warm-up left them), enough rows for one batch.
void seed_buffer_from(Trainer& trainer, const torch::Tensor& draws, const torch::TensorOptions& options) {
  const int64_t chains = draws.size(1);
  const int64_t want = std::min<int64_t>(draws.size(0), (trainer.options().batch + chains - 1) / chains + 1);
  trainer.seed_buffer(draws.narrow(0, draws.size(0) - want, want).reshape({-1, draws.size(2)}).flip(0).to(options));
}

/// A warm-up run's progress (run_sampler's) as training's phase "precondition": its step counts
/// the warm-up's iterations and then the draws'. Empty without `progress`.
ProgressFn precondition_progress(const TrainProgressFn& progress, int64_t warmup, int64_t draws) {
  if (!progress) return nullptr;
  return [progress, warmup, draws](const Progress& p) {
    TrainProgress tp;
    tp.phase = "precondition";
    tp.stats.step = p.phase == "warmup" ? p.iteration : warmup + p.iteration;
    tp.stats.accept = p.accept;
    tp.stats.eps = p.step_size;
    tp.total = warmup + draws;
    tp.elapsed = p.elapsed;
    progress(tp);
  };
}
}  // namespace

json warm_up_preconditioner(Target& model_target, LearnedSampler& sampler, Trainer& trainer, const TrainOptions& o,
                            const TrainProgressFn& progress, const std::function<bool()>& should_stop,
                            torch::Tensor* end_positions) {
  // In float64 whatever the model's dtype (Note [Training budget]): in float32 the warm-up's step
  // size collapsed on correlated posteriors, and the metric with it. Its draws are the model's
  // first buffer, in the model's dtype.
  std::shared_ptr<Target> t64;
  if (model_target.options().dtype() != torch::kFloat64) {
    t64 = make_target(model_target.spec(), model_target.options().dtype(torch::kFloat64));
  }
  Target& target = t64 ? *t64 : model_target;
  const Precondition kind = sampler->options().precondition;
  TORCH_CHECK(kind != Precondition::kNone, "warm_up_preconditioner: the model has precondition = none");
  auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition_sampler));
  RunOptions ro;
  ro.chains = o.precondition_chains;
  ro.warmup = o.precondition_warmup;
  // 0: 100 draws; 400 for lowrank (its factors' variances come from autocorrelated draws: on a
  // 1200-d target with 8 wide directions 400 doubled the ESS for 8 % more gradients, BENCHMARKS.md).
  ro.draws = o.precondition_draws > 0 ? o.precondition_draws : kind == Precondition::kLowRank ? 400 : 100;
  ro.metric = kind == Precondition::kDense ? MetricAdapt::kDense : MetricAdapt::kDiag;
  ro.target_accept = default_target_accept(o.precondition_sampler);
  ro.draws_in_memory_limit = 0;
  ro.should_stop = should_stop;
  const ProgressFn adapter = precondition_progress(progress, ro.warmup, ro.draws);
  SampleResult r = run_sampler(target, *kernel, ro, seed_of(o.seed, SeedStream::kPreconditioner), adapter);
  json record = {{"sampler", o.precondition_sampler}, {"kind", kind},  {"chains", ro.chains}, {"dtype", "float64"},
                 {"warmup", ro.warmup},  {"draws", ro.draws},           {"step_size", r.step_size},
                 {"grads", (r.grads_warmup + r.grads_sampling) * ro.chains},
                 {"seconds", r.seconds_warmup + r.seconds_sampling}};
  if (!r.complete) {
    record["interrupted"] = true;
    return record;
  }
  torch::Tensor draws = r.draws.reshape({-1, target.dim()});  // [S C, D] float64
  if (!torch::isfinite(draws).all().item<bool>() || !r.inv_mass.defined()) {
    throw DataError("preconditioner warm-up: the " + enum_name(o.precondition_sampler) +
                    " chains produced non-finite draws or no metric; set model.precondition = none");
  }
  if (kind == Precondition::kLowRank) {
    // A factor-analysis fit of the warm-up draws' covariance: unique variances and the wide factors.
    auto fit = [&](const torch::Tensor& d) {
      LowRankFactors f = low_rank_factors(d, sampler->options().precondition_rank, ro.chains);
      sampler->set_low_rank_preconditioner(d.mean(0), f.variances, f.directions, f.eigenvalues);
      record["lowrank_factors"] = f.eigenvalues.size(0);
    };
    fit(draws);
    if (o.precondition_refit) {
      // The first stage's diagonal metric mixes slowly along the wide directions, so their fitted
      // variances are noisy. A second stage runs the sampler with the fit as a (dense) metric,
      // adapting only its step size, from where the first left the chains, and refits from its
      // draws, which are nearly independent.
      auto kernel2 = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition_sampler));
      torch::Tensor l = sampler->precondition_matrix().to(torch::kFloat64);
      kernel2->set_inv_mass(l.matmul(l.t()).to(target.options()));
      RunOptions ro2 = ro;
      ro2.warmup = std::max<int64_t>(100, o.precondition_warmup / 4);
      ro2.metric = MetricAdapt::kUnit;
      ro2.init_x = r.draws.select(0, r.draws.size(0) - 1).to(target.options());
      SampleResult r2 = run_sampler(target, *kernel2, ro2, seed_of(o.seed, SeedStream::kPreconditionerRefit), adapter);
      record["refit"] = {{"warmup", ro2.warmup}, {"draws", ro2.draws}, {"first_step_size", r.step_size},
                         {"grads", (r2.grads_warmup + r2.grads_sampling) * ro2.chains},
                         {"seconds", r2.seconds_warmup + r2.seconds_sampling}};
      record["grads"] = record["grads"].get<int64_t>() + record["refit"]["grads"].get<int64_t>();
      record["seconds"] = record["seconds"].get<double>() + record["refit"]["seconds"].get<double>();
      if (!r2.complete) {
        record["interrupted"] = true;
        return record;
      }
      torch::Tensor draws2 = r2.draws.reshape({-1, target.dim()});
      if (!torch::isfinite(draws2).all().item<bool>()) {
        throw DataError("preconditioner warm-up: the second stage produced non-finite draws; set "
                        "train.precondition_refit = false or model.precondition = diag");
      }
      fit(draws2);
      record["step_size"] = r2.step_size;  // in the fit's coordinates, as eps is: where eps starts
      r = std::move(r2);                   // its draws seed the buffer
    }
  } else {
    sampler->set_preconditioner(draws.mean(0), r.inv_mass);
  }
  if (o.eps_from_warmup) sampler->set_eps(r.step_size);
  seed_buffer_from(trainer, r.draws, model_target.options());
  if (end_positions) *end_positions = r.draws[r.draws.size(0) - 1].to(torch::kFloat64);  // [C, D]
  record["divergent"] = r.divergent.sum().item<int64_t>();
  {
    // Note [Choosing the transport]: how far the Gaussian the affine map fits is from the target,
    // from the last draws and their gradients.
    torch::Tensor x = r.draws.reshape({-1, target.dim()});
    const int64_t rows = TransportRules().fisher_rows;
    x = x.narrow(0, std::max<int64_t>(0, x.size(0) - rows), std::min<int64_t>(x.size(0), rows));
    const double f = gaussian_fisher_per_dim(target, x);
    record["fisher_per_dim"] = std::isfinite(f) ? json(f) : json(nullptr);
    record["grads"] = record["grads"].get<int64_t>() + x.size(0);
  }
  if (o.eps_from_warmup && o.beta_from_warmup) record["beta"] = trainer.warm_start_beta();
  return record;
}

json warm_up_transport(Target& model_target, const TrainTransport& tt, const TrainOptions& o, FlowTransport& flow,
                       torch::Tensor& latent_draws, const TrainProgressFn& progress,
                       const std::function<bool()>& should_stop, const torch::Tensor& start) {
  // In float64, as the affine warm-up (Note [Training budget]).
  std::shared_ptr<Target> t64;
  if (model_target.options().dtype() != torch::kFloat64) {
    t64 = make_target(model_target.spec(), model_target.options().dtype(torch::kFloat64));
  }
  Target& target = t64 ? *t64 : model_target;
  auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition_sampler));
  RunOptions ro;
  ro.chains = o.precondition_chains;
  ro.warmup = o.precondition_warmup;
  ro.draws = o.precondition_draws > 0 ? o.precondition_draws : 100;
  ro.metric = MetricAdapt::kDiag;
  ro.target_accept = default_target_accept(o.precondition_sampler);
  ro.should_stop = should_stop;
  TransportOptions t;
  t.kind = tt.kind;
  t.layers = tt.layers;
  t.hidden = tt.hidden;
  t.rounds = tt.rounds;
  // The learned sampler trains in the transport's latent space: an identity there leaves it the raw
  // posterior (kidiq's momiq regression trained so at 7ea8f7d: R-hat 1.15). Where the rounds do not
  // arrive, Note [The transported warm-up starts at the posterior] below runs them again instead.
  t.give_up_far_out = false;
  ProgressFn adapter;
  if (progress) {
    ProgressFn run_progress = precondition_progress(progress, ro.warmup, ro.draws);
    adapter = [progress, run_progress](const Progress& p) {
      if (p.phase != "fit") return run_progress(p);
      TrainProgress tp;  // stats.step: the fit's Adam step; stats.loss: its held-out Fisher loss
      tp.elapsed = p.elapsed;
      tp.phase = "fit";
      tp.stats.step = p.iteration;
      tp.stats.loss = p.accept;
      tp.total = p.total;
      progress(tp);
    };
  }
  // Note [The transported warm-up starts at the posterior]
  // The transport's rounds start from the uniform box, as `nmcmc sample`'s do. Where they end in
  // the transient (the last fit's held-out loss above TransportRules::transient_loss per coordinate: the chains
  // had not arrived) they run again from where a warm-up of the chains alone left them: the
  // affine preconditioner's (Stan's windows, one run of the same sampler, chains, iterations and
  // seed), which with `--transport auto` has run already (`start`) and otherwise runs here (the
  // record's "arrival"). Every gradient and second of the three counts ("from_the_box" and
  // "arrival" in the record, and in its totals). From the box the first round (50 iterations at
  // train's 500) is too short on posteriors far from it with near-singular correlations: on
  // posteriordb's kilpisjarvi with 16 chains it ended at step size 6 with every state's Fisher
  // loss at the clip (chains far out on a flat ridge; a first round restarted twice as long,
  // from the box or from where the chains were, did no better) and every later round stayed
  // there; from the box the last fits of earnings, kidiq's two regressions and sblrc ended at
  // 496-10,000 per coordinate, and training failed or did not converge on five of 13 posteriors
  // (959710e; BENCHMARKS.md "The learned proposal through the flow from the posterior"). One
  // 500-iteration run brings 16 chains there on all of them. Starting there always was tried:
  // on Funnel-3 the learned proposal then mixed x1 3.5x worse (0.046 bulk-ESS per sampling
  // gradient against 0.163 from the box, 4 x 4000 draws): NUTS's warm-up alone leaves the chains
  // away from the funnel's neck, and the flow fitted from there covers it worse.
  auto transported = [&](const torch::Tensor& x_start) {
    RunOptions rt = ro;
    if (x_start.defined()) rt.init_x = x_start.to(target.options());
    return run_with_transport(target, *kernel, rt, t, seed_of(o.seed, SeedStream::kPreconditioner), adapter);
  };
  auto cost = [&](const SampleResult& s) {
    return json{{"grads", (s.grads_warmup + s.grads_sampling) * ro.chains}, {"seconds", s.seconds_warmup + s.seconds_sampling}};
  };
  // Above TransportRules::far_out_loss (services/transport.hpp) the attempt from the box stops after the first
  // round (chains far out take NUTS's longest trajectories: on kilpisjarvi the whole attempt cost
  // about 100 s).
  t.far_out_loss = t.rules.far_out_loss;
  TransportRun tr = transported(torch::Tensor());
  json from_box, arrival;
  const auto last_loss = [](const TransportRun& run) {
    const json& rounds = run.report.value("rounds", json::array());
    return rounds.empty() ? 0.0 : rounds.back()["fit"].value("loss_end", 0.0);
  };
  t.far_out_loss = 0;
  if (tr.result.complete && (tr.far_out || !(last_loss(tr) <= t.rules.transient_loss))) {
    from_box = cost(tr.result);
    from_box["last_fit_loss"] = last_loss(tr);
    from_box["stopped_after_the_first_round"] = tr.far_out;
    from_box["transport"] = tr.report;
    torch::Tensor x0 = start;
    if (!x0.defined()) {
      RunOptions ra = ro;
      ra.draws = 1;
      ra.draws_in_memory_limit = 0;
      SampleResult a = run_sampler(target, *kernel, ra, seed_of(o.seed, SeedStream::kPreconditioner), precondition_progress(progress, ra.warmup, ra.draws));
      arrival = cost(a);
      arrival["warmup"] = ra.warmup;
      arrival["step_size"] = a.step_size;
      if (!a.complete || !a.draws.defined() || a.draws.size(0) == 0) {
        json g = from_box["grads"], sec = from_box["seconds"];
        return json{{"kind", "flow"}, {"from_the_box", from_box}, {"arrival", arrival}, {"interrupted", true},
                    {"grads", g.get<int64_t>() + arrival["grads"].get<int64_t>()},
                    {"seconds", sec.get<double>() + arrival["seconds"].get<double>()}};
      }
      x0 = a.draws[a.draws.size(0) - 1];  // [C, D]
    }
    if (!torch::isfinite(x0).all().item<bool>()) {
      throw DataError("transport warm-up: the chains' warm-up produced non-finite positions; train without the transport");
    }
    tr = transported(x0);
  }
  const SampleResult& r = tr.result;
  json record = {{"kind", "flow"},
                 {"sampler", o.precondition_sampler},
                 {"chains", ro.chains},
                 {"dtype", "float64"},
                 {"warmup", ro.warmup},
                 {"draws", ro.draws},
                 {"step_size", r.step_size},
                 {"grads", (r.grads_warmup + r.grads_sampling) * ro.chains},
                 {"seconds", r.seconds_warmup + r.seconds_sampling},
                 {"transport", tr.report}};
  for (const auto& [key, part] : {std::pair<const char*, const json*>{"from_the_box", &from_box}, {"arrival", &arrival}}) {
    if (part->is_null()) continue;
    record[key] = *part;
    record["grads"] = record["grads"].get<int64_t>() + (*part)["grads"].get<int64_t>();
    record["seconds"] = record["seconds"].get<double>() + (*part)["seconds"].get<double>();
  }
  if (!r.complete || !r.draws.defined() || r.draws.size(0) == 0) {
    record["interrupted"] = true;
    return record;
  }
  flow = tr.flow;
  for (auto& p : flow->parameters()) p.requires_grad_(false);
  TransportedTarget latent(target, flow);
  const auto shape = r.draws.sizes().vec();  // [S, C, D] in x
  latent_draws = latent.to_latent(r.draws.reshape({-1, shape[2]}).to(target.options())).to(torch::kFloat64).reshape(shape);
  if (!torch::isfinite(latent_draws).all().item<bool>()) {
    throw DataError("transport warm-up: the chains produced non-finite draws; train without the transport");
  }
  record["divergent"] = r.divergent.sum().item<int64_t>();
  return record;
}

TrainResult train(const TrainConfig& config, torch::Device device, const std::string& output,
                  const std::string& log_path, bool resume, const TrainProgressFn& progress,
                  const std::function<bool()>& should_stop, std::shared_ptr<parallel::Communicator> comm) {
  if (!comm) comm = parallel::single_process();
  auto options = torch::TensorOptions().dtype(config.dtype == "float64" ? torch::kFloat64 : torch::kFloat32).device(device);
  auto target = make_target(config.target, options);
  LearnedOptions model = config.model;
  model.dim = target->dim();
  if (model.hidden == 0) model.hidden = default_hidden(model.dim);  // Note [Training budget]
  const bool distributed = comm->world_size() > 1;
  const bool auto_transport = config.transport.kind == TransportKind::kAuto;
  bool with_transport = config.transport.kind == TransportKind::kFlow;
  if (with_transport && distributed) throw UsageError("training with a flow transport runs in one process");
  // With a transport the flow is the preconditioner; "auto" adds a learned diagonal one in its
  // latent space (Note [Learned proposal in a flow's latent space]).
  const Precondition asked_precondition = model.precondition;
  auto set_precondition = [&] {
    model.precondition = with_transport && asked_precondition == Precondition::kAuto
                             ? Precondition::kDiag
                             : resolve_precondition(asked_precondition, model.dim);
  };
  set_precondition();
  // Resume only when every rank sees the checkpoint (rank 0 writes it; other machines need the
  // same path on a shared directory).
  bool resuming = resume && std::filesystem::exists(output);
  const double seen = parallel::all_reduce_doubles(*comm, {resuming ? 1.0 : 0.0})[0];
  if (seen > 0 && seen < comm->world_size()) {
    throw UsageError(fmt::format("{}: checkpoint '{}' exists on {} of {} processes; to resume, every process needs it "
                                 "(a directory all machines share)", comm->where(), output, seen, comm->world_size()));
  }
  if (auto_transport && resuming) {  // the checkpoint holds the choice
    auto ar = open_learned_checkpoint(output);
    with_transport = read_learned_meta(ar, output).contains("transport");
    if (with_transport && distributed) throw UsageError("checkpoint '" + output + "' was trained with a flow transport, which runs in one process");
    set_precondition();
  }
  TrainOptions train_options = config.train;
  if (resuming && train_options.shards == 0) {
    // A checkpoint keeps its shard count (its random streams): resume on any divisor of it.
    if (auto stored = checkpoint_shards(output)) {
      if (*stored % comm->world_size() != 0) {
        throw UsageError(fmt::format("checkpoint '{}' was trained with {} shard(s) per batch, each with its own random "
                                     "stream and buffer rows; it resumes on a number of processes that divides {}, "
                                     "not on {}", output, *stored, *stored, comm->world_size()));
      }
      train_options.shards = *stored;
    }
  }
  TrainResult result;
  // Every rank runs the same warm-up (same seed); rank 0's result is then broadcast. Distributed, a
  // stop during it waits for the first training step (so all ranks stop together).
  torch::Tensor affine_end;  // where the affine warm-up left the chains [C, D] float64
  auto run_affine_warmup = [&](LearnedSampler& s, Trainer& t, bool& interrupted) {
    json record = warm_up_preconditioner(*target, s, t, config.train, progress, distributed ? nullptr : should_stop,
                                         &affine_end);
    interrupted = parallel::all_reduce_doubles(*comm, {record.value("interrupted", false) ? 1.0 : 0.0})[0] > 0;
    return record;
  };
  // Note [Choosing the transport]: the affine warm-up first; its model and trainer are kept when
  // the affine map fits.
  LearnedSampler affine_sampler{nullptr};
  std::unique_ptr<Trainer> affine_trainer;
  json affine_record, auto_record;
  if (auto_transport && !resuming) {
    affine_sampler = LearnedSampler(model);
    affine_trainer = std::make_unique<Trainer>(*target, affine_sampler.ptr(), train_options, comm);
    if (affine_sampler->preconditioned()) {
      bool interrupted = false;
      affine_record = run_affine_warmup(affine_sampler, *affine_trainer, interrupted);
      if (interrupted) {
        result.interrupted = true;
        result.saved = false;
        return result;
      }
      const json f = affine_record.value("fisher_per_dim", json(nullptr));
      const bool misfit = f.is_number() && f.get<double>() > TransportRules().flow_fisher_per_dim;
      auto_record = {{"fisher_per_dim", f},
                     {"threshold", TransportRules().flow_fisher_per_dim},
                     {"chose", misfit && !distributed ? "flow" : "affine"},
                     {"affine_grads", affine_record.value("grads", int64_t{0})},
                     {"affine_seconds", affine_record.value("seconds", 0.0)}};
      if (misfit && distributed) auto_record["why"] = "a distributed run keeps the affine map";
      affine_record["auto"] = auto_record;
      if (misfit && !distributed) {
        with_transport = true;
        set_precondition();
        affine_trainer.reset();
        affine_sampler = nullptr;
      }
    }
  }
  // Note [Learned proposal in a flow's latent space]: the flow comes from the checkpoint when
  // resuming, else from its warm-up, and the proposal trains on the pulled-back target.
  FlowTransport flow(nullptr);
  torch::Tensor latent_draws;  // [S, C, D] float64, the transport warm-up's draws in z
  json transport_record;
  if (with_transport && resuming) {
    auto ar = open_learned_checkpoint(output);
    json meta = read_learned_meta(ar, output);
    flow = load_transport(ar, meta, output);
    if (!flow) throw UsageError("checkpoint '" + output + "' was trained without a transport; resume it without one");
    if (meta.contains("preconditioner")) transport_record = meta["preconditioner"];
  } else if (with_transport) {
    TrainTransport tt = config.transport;
    tt.kind = TransportKind::kFlow;
    // Note [The transported warm-up starts at the posterior]: where it ends in the transient it
    // runs again from where the affine warm-up (auto's, if it ran) left the chains.
    transport_record = warm_up_transport(*target, tt, config.train, flow, latent_draws, progress, should_stop, affine_end);
    if (!auto_record.is_null()) {  // all-in: the affine warm-up that chose the flow is paid too
      transport_record["auto"] = auto_record;
      transport_record["grads"] = transport_record.value("grads", int64_t{0}) + auto_record["affine_grads"].get<int64_t>();
      transport_record["seconds"] = transport_record.value("seconds", 0.0) + auto_record["affine_seconds"].get<double>();
    }
    if (transport_record.value("interrupted", false)) {
      result.interrupted = true;
      result.saved = false;
      return result;
    }
  }
  std::unique_ptr<TransportedTarget> latent;
  if (flow) latent = std::make_unique<TransportedTarget>(*target, flow);
  Target& train_target = latent ? static_cast<Target&>(*latent) : *target;
  LearnedSampler sampler = affine_trainer ? affine_sampler : LearnedSampler(model);
  std::unique_ptr<Trainer> trainer_owner =
      affine_trainer ? std::move(affine_trainer) : std::make_unique<Trainer>(train_target, sampler.ptr(), train_options, comm);
  Trainer& trainer = *trainer_owner;
  json extra = {{"name", config.name}, {"config", config.to_json()}};
  if (flow) extra["transport"] = {{"kind", TransportKind::kFlow}, {"flow", flow->options()}};
  if (resuming) {
    if (!with_transport) {
      auto ar = open_learned_checkpoint(output);
      if (read_learned_meta(ar, output).contains("transport")) {
        throw UsageError("checkpoint '" + output + "' was trained in a flow transport's latent space; resume it with "
                         "the transport (--transport flow)");
      }
    }
    json meta = trainer.load(output);
    if (meta.contains("preconditioner")) extra["preconditioner"] = result.preconditioner = meta["preconditioner"];
  } else if (with_transport) {
    // The latent draws set the affine preconditioner on top of the flow (near the identity when
    // the flow fits), the step size, the buffer and beta, as the affine warm-up's draws do.
    const int64_t d = target->dim();
    torch::Tensor flat = latent_draws.reshape({-1, d});
    if (model.precondition == Precondition::kLowRank) {
      LowRankFactors f = low_rank_factors(flat, model.precondition_rank, latent_draws.size(1));
      sampler->set_low_rank_preconditioner(flat.mean(0), f.variances, f.directions, f.eigenvalues);
    } else if (model.precondition == Precondition::kDense) {
      torch::Tensor c = flat - flat.mean(0);
      sampler->set_preconditioner(flat.mean(0), c.t().matmul(c) / double(std::max<int64_t>(1, flat.size(0) - 1)));
    } else if (model.precondition == Precondition::kDiag) {
      sampler->set_preconditioner(flat.mean(0), flat.var(0));
    }
    if (config.train.eps_from_warmup) sampler->set_eps(transport_record.value("step_size", 0.1));
    seed_buffer_from(trainer, latent_draws, target->options());
    if (config.train.eps_from_warmup && config.train.beta_from_warmup) transport_record["beta"] = trainer.warm_start_beta();
    extra["preconditioner"] = result.preconditioner = transport_record;
    trainer.broadcast_from_root();
  } else {
    if (sampler->preconditioned()) {
      json record = affine_record;
      if (record.is_null()) {
        bool interrupted = false;
        record = run_affine_warmup(sampler, trainer, interrupted);
        if (interrupted) {
          result.interrupted = true;
          result.saved = false;
          return result;
        }
      }
      extra["preconditioner"] = result.preconditioner = record;
    }
    trainer.broadcast_from_root();
  }
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  const int64_t total = config.train.steps;
  auto checkpoint = [&] {
    if (flow) {
      trainer.save(output, extra, [&](torch::serialize::OutputArchive& ar) { write_transport(ar, *flow); });
    } else {
      trainer.save(output, extra);  // collective: rank 0 writes
    }
    if (comm->is_root()) write_training_log(log_path, trainer.log());
  };
  // Note [Training budget]: the proposal entropy's moving average and when it last gained enough.
  const TrainOptions& budget = config.train;
  const double min_gain = budget.min_gain * static_cast<double>(target->dim());
  double ema = 0, best = -INFINITY;
  int64_t best_step = trainer.current_step(), entropies = 0;
  double trained = 0;
  // Note [A long warm-up shortens training]: `max_seconds` bounds the training steps; when the
  // preconditioner's (or the transport's) warm-up took more than kWarmupAllowance of it, the
  // excess comes out of training's time, down to a quarter of max_seconds. With the defaults (90 s)
  // a posterior whose gradient is cheap trains as before, and one whose warm-up is long (GARCH:
  // 16 chains x 600 NUTS iterations of a 200-step recursion, ~100 s) still hands over a sampler
  // within about two minutes of `nmcmc train` (issue #35's goal) instead of three. The allowance,
  // 25 s, leaves 5 s of the two minutes to loading the module and writing the checkpoint: with 30
  // the latent GP, whose warm-up (the affine one, then the flow's) takes ~80 s, took 121.5 s.
  constexpr double kWarmupAllowance = 25.0;
  double time_limit = budget.max_seconds;
  if (time_limit > 0 && result.preconditioner.is_object()) {
    const double warm = result.preconditioner.value("seconds", 0.0);
    if (warm > kWarmupAllowance) {
      time_limit = std::max(0.25 * budget.max_seconds, budget.max_seconds - (warm - kWarmupAllowance));
      // recorded with the warm-up that caused it (checkpoint meta "preconditioner")
      result.preconditioner["train_time_limit"] = time_limit;
      extra["preconditioner"]["train_time_limit"] = time_limit;
    }
  }
  while (trainer.current_step() < total) {
    const bool stop = should_stop && should_stop();
    if (stop && !distributed) {
      checkpoint();
      result.interrupted = true;
      result.stopped = "interrupted";
      break;
    }
    TrainStats s = trainer.step(stop);
    if (trainer.stop_agreed()) {  // some rank was asked to stop: all save this step and end
      checkpoint();
      result.interrupted = true;
      result.stopped = "interrupted";
      break;
    }
    trained += s.seconds;
    if (std::isfinite(s.entropy)) {
      ema = entropies++ == 0 ? s.entropy : 0.98 * ema + 0.02 * s.entropy;
      if (ema > best + min_gain) {
        best = ema;
        best_step = s.step;
      }
    }
    // Every rank decides alike: the entropy and the step are the all-reduced ones; the time is rank 0's.
    std::string why;
    if (budget.patience > 0 && s.step - best_step >= budget.patience && s.step < total) why = "plateau";
    if (time_limit > 0 && s.step < total &&
        parallel::all_reduce_doubles(*comm, {comm->is_root() && trained > time_limit ? 1.0 : 0.0})[0] > 0) {
      why = "time";
    }
    if (!why.empty()) {
      checkpoint();
      result.stopped = why;
      if (progress) {
        progress({"train", s, total, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
      }
      break;
    }
    if (s.step % config.train.checkpoint_every == 0 || s.step == total) checkpoint();
    auto now = std::chrono::steady_clock::now();
    if (progress && (std::chrono::duration<double>(now - last).count() > 0.5 || s.step == total)) {
      last = now;
      progress({"train", s, total, std::chrono::duration<double>(now - t0).count()});
    }
  }
  const bool written = comm->is_root() ? std::filesystem::exists(output) : true;
  const bool need = total == 0 || (trainer.current_step() == total &&
                                   parallel::all_reduce_doubles(*comm, {written ? 0.0 : 1.0})[0] > 0);
  if (need) checkpoint();
  result.steps = trainer.current_step();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.log = trainer.log();
  result.grads = result.log.empty() ? 0 : result.log.back().grads;
  result.comm = comm->stats();
  result.shards = trainer.shards();
  result.skipped = trainer.skipped_steps();
  result.bad_rows = trainer.bad_rows();
  if (result.steps > 0 && result.skipped == result.steps) {
    throw DataError(fmt::format("training learned nothing: all {} steps were skipped because the gradient was not "
                                "finite (the density overflows or fails where the proposals go?); the checkpoint {} "
                                "holds the untrained proposal",
                                result.steps, output));
  }
  // Every proposal of every step met a non-finite energy or gradient (rejected, not trained on):
  // the steps ran but there was nothing to learn from (posteriordb's kilpisjarvi through a flow
  // fitted to a warm-up whose chains had not arrived: 19,264 of 19,264, and `train` had exited 0).
  const int64_t rows = result.steps * trainer.options().batch;
  if (result.steps > 0 && result.bad_rows >= rows) {
    throw DataError(fmt::format("training learned nothing: all {} proposals of its {} steps met a non-finite energy or "
                                "gradient and were rejected (the density overflows or fails where the proposals go, "
                                "or the warm-up ended far from the posterior?); the checkpoint {} holds the untrained "
                                "proposal",
                                rows, result.steps, output));
  }
  return result;
}

}  // namespace nmcmc
