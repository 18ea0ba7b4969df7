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
#include "train_parts.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

json TrainConfig::to_json() const {
  json j = {{"name", name}, {"target", target}, {"model", model.to_json()}, {"train", train.to_json()}, {"dtype", dtype}};
  if (transport.kind != TransportKind::kNone) j["transport"] = transport;
  if (!from.empty()) j["from"] = from;
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
        key != "paper" && key != "transport" && key != "from" && key != "engine") {
      throw UsageError("config: unknown section '" + key + "'");
    }
  }
  if (!j.contains("target")) throw UsageError("config: missing \"target\"");
  TrainConfig c;
  if (j.contains("from") && !j["from"].is_null()) {
    if (!j["from"].is_string() || j["from"].get<std::string>().empty()) {
      throw UsageError("config: \"from\" must be the path of a checkpoint (nmcmc train's output)");
    }
    c.from = j["from"].get<std::string>();
  }
  c.name = j.value("name", std::string("run"));
  c.target = j["target"];
  json model = j.value("model", json::object());
  if (!model.contains("dim")) model["dim"] = 2;  // replaced by the target's dimension in train()
  c.model = LearnedOptions::from_json(model);
  c.train = TrainOptions::from_json(j.value("train", json::object()));
  c.dtype = j.value("dtype", std::string("float32"));
  if (c.dtype != "float32" && c.dtype != "float64") throw UsageError("config: dtype must be float32 or float64");
  if (j.contains("transport") && !j["transport"].is_null()) {
    try {
      c.transport = j["transport"].get<TransportChoice>();
    } catch (const UsageError& e) {
      throw UsageError(std::string("config: ") + e.what());
    }
    check_transport_choice(c.transport, /*sampling=*/false, "config");  // Note [The transport's options]
    if (c.transport.kind != TransportKind::kNone) {  // recorded with the values it trains with
      const TransportOptions t = transport_options(c.transport, kTrainTransportRounds);
      c.transport.layers = t.layers;
      c.transport.hidden = t.hidden;
      c.transport.rounds = t.rounds;
    }
    if (c.transport.kind != TransportKind::kNone &&
        (c.train.precondition.sampler == SamplerKind::kRwm || c.train.precondition.sampler == SamplerKind::kLearned)) {
      throw UsageError("config: a flow transport (kind flow or auto) is fitted from gradients: "
                       "train.precondition_sampler must be nuts, hmc or mala");
    }
    if (c.transport.kind != TransportKind::kNone && c.train.precondition.warmup < 100) {
      throw UsageError("config: a flow transport (kind flow or auto) is fitted in the warm-up: "
                       "train.precondition_warmup must be at least 100");
    }
  }
  if (j.contains("engine") && !j["engine"].is_null()) {
    // Note [Native copies]: one engine for every copy the training and its model meet
    const Engine e = j["engine"].get<Engine>();
    c.model.engine = e;
    c.transport.engine = e;
    set_target_engine(c.target, e);
  }
  return c;
}

int64_t default_hidden(int64_t dim) { return std::clamp<int64_t>(4 * dim, 64, 256); }

json default_train_config() {
  return {{"model", {{"variant", "langevin"}, {"precondition", "auto"}, {"learn_precondition", true}, {"hidden", 0}}},
          {"train", {{"rho", 0.3}, {"batch", 64}, {"steps", 3000}, {"patience", 200}, {"min_gain", 0.01}, {"max_seconds", 90}, {"ess_goal", 10000}}},
          {"transport", {{"kind", "auto"}}}};
}

void seed_buffer_from(Trainer& trainer, const torch::Tensor& draws, const torch::TensorOptions& options) {
  const int64_t chains = draws.size(1);
  const int64_t want = std::min<int64_t>(draws.size(0), (trainer.options().batch + chains - 1) / chains + 1);
  trainer.seed_buffer(draws.narrow(0, draws.size(0) - want, want).reshape({-1, draws.size(2)}).flip(0).to(options));
}

ProgressFn precondition_progress(const TrainProgressFn& progress, int64_t warmup, int64_t draws) {
  if (!progress) return nullptr;
  auto planned = std::make_shared<int64_t>(warmup);
  return [progress, planned, draws](const Progress& p) {
    if (p.phase == "warmup" && p.total > 0) *planned = p.total;
    TrainProgress tp;
    tp.phase = "precondition";
    tp.stats.step = p.phase == "warmup" ? p.iteration : *planned + p.iteration;
    tp.stats.accept = p.accept;
    tp.stats.eps = p.step_size;
    tp.total = *planned + draws;
    tp.elapsed = p.elapsed;
    progress(tp);
  };
}

namespace {
/// What in_float64 builds, kept alive while it is used.
struct Float64Copy {
  std::shared_ptr<Target> inner;
  std::unique_ptr<TransformedTarget> pulled;
};

/// `model_target` in float64: itself, or a copy from its spec. A pulled-back target (a flow kept
/// by Note [Training from a previous model]) is rebuilt over its inner target, whose spec it has.
Target& in_float64(Target& model_target, Float64Copy& copy) {
  if (model_target.options().dtype() == torch::kFloat64) return model_target;
  copy.inner = make_target(model_target.spec(), model_target.options().dtype(torch::kFloat64));
  if (const auto* pulled = dynamic_cast<const TransformedTarget*>(&model_target)) {
    copy.pulled = pulled->over(*copy.inner);
    return *copy.pulled;
  }
  return *copy.inner;
}
}  // namespace

json warm_up_preconditioner(Target& model_target, LearnedSampler& sampler, Trainer& trainer, const TrainOptions& o,
                            const TrainProgressFn& progress, const std::function<bool()>& should_stop,
                            torch::Tensor* end_positions, const WarmStart* start) {
  // In float64 whatever the model's dtype (Note [Training budget]): in float32 the warm-up's step
  // size collapsed on correlated posteriors, and the metric with it. Its draws are the model's
  // first buffer, in the model's dtype.
  Float64Copy copy;
  Target& target = in_float64(model_target, copy);
  const Precondition kind = sampler->options().precondition;
  TORCH_CHECK(kind != Precondition::kNone, "warm_up_preconditioner: the model has precondition = none");
  auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition.sampler));
  RunOptions ro;
  ro.chains = o.precondition.chains;
  ro.warmup = start ? o.budget.from_warmup : o.precondition.warmup;
  // unset: 100 draws; 400 for lowrank (its factors' variances come from autocorrelated draws: on a
  // 1200-d target with 8 wide directions 400 doubled the ESS for 8 % more gradients).
  ro.draws = o.precondition.draws_for(kind == Precondition::kLowRank);
  ro.metric = o.precondition.metric_for(kind, target.dim());
  ro.target_accept = default_target_accept(o.precondition.sampler);
  ro.draws_in_memory_limit = 0;
  ro.should_stop = should_stop;
  if (start) {  // Note [Warm starts]: the metric is estimated again over the short warm-up's windows
    start->apply(*kernel, target.options(), /*dense=*/is_full_rank_metric(ro.metric));
    if (start->positions.defined()) ro.init_x = start->positions.to(target.options());
  }
  const ProgressFn adapter = precondition_progress(progress, ro.warmup, ro.draws);
  SampleResult r = run_sampler(target, *kernel, ro, seed_of(o.seed, SeedStream::kPreconditioner), adapter);
  json record = {{"sampler", o.precondition.sampler}, {"kind", kind},  {"chains", ro.chains}, {"metric", ro.metric}, {"dtype", "float64"},
                 {"warmup", ro.warmup},  {"draws", ro.draws},           {"step_size", r.step_size},
                 {"grads", (r.grads_warmup + r.grads_sampling) * ro.chains},
                 {"seconds", r.seconds_warmup + r.seconds_sampling}};
  if (start) record["warm_start"] = true;
  if (!r.complete) {
    record["interrupted"] = true;
    return record;
  }
  torch::Tensor draws = r.draws.reshape({-1, target.dim()});  // [S C, D] float64
  if (!torch::isfinite(draws).all().item<bool>() || !r.inv_mass.defined()) {
    throw DataError("preconditioner warm-up: the " + enum_name(o.precondition.sampler) +
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
    if (o.precondition.refit) {
      // The first stage's diagonal metric mixes slowly along the wide directions, so their fitted
      // variances are noisy. A second stage runs the sampler with the fit as a (dense) metric,
      // adapting only its step size, from where the first left the chains, and refits from its
      // draws, which are nearly independent.
      auto kernel2 = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition.sampler));
      torch::Tensor l = sampler->precondition_matrix().to(torch::kFloat64);
      kernel2->set_inv_mass(l.matmul(l.t()).to(target.options()));
      RunOptions ro2 = ro;
      ro2.warmup = std::max<int64_t>(100, ro.warmup / 4);
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
  if (o.precondition.eps_from_warmup) sampler->set_eps(r.step_size);
  seed_buffer_from(trainer, r.draws, model_target.options());
  if (end_positions) *end_positions = r.draws[r.draws.size(0) - 1].to(torch::kFloat64);  // [C, D]
  record["divergent"] = r.divergent.sum().item<int64_t>();
  {
    // Note [Choosing the transport]: how far the Gaussian the affine map fits is from the target,
    // from the last draws and their gradients.
    torch::Tensor x = r.draws.reshape({-1, target.dim()});
    const int64_t rows = TransportRules().fisher_rows;
    x = x.narrow(0, std::max<int64_t>(0, x.size(0) - rows), std::min<int64_t>(x.size(0), rows));
    const torch::Tensor x64 = x.to(torch::kFloat64);
    const FisherBeyondNoise f = fisher_beyond_noise(x64, target.energy_and_grad(x64.to(target.options())).grad);
    record.update(f.record());  // Note [The affine map's noise]
    record["grads"] = record["grads"].get<int64_t>() + x.size(0);
  }
  if (o.precondition.eps_from_warmup && o.precondition.beta_from_warmup) record["beta"] = trainer.warm_start_beta();
  return record;
}

json warm_up_transport(Target& model_target, const TransportChoice& tt, const TrainOptions& o, FlowTransport& flow,
                       torch::Tensor& latent_draws, const TrainProgressFn& progress,
                       const std::function<bool()>& should_stop, const torch::Tensor& start) {
  // In float64, as the affine warm-up (Note [Training budget]).
  Float64Copy copy;
  Target& target = in_float64(model_target, copy);
  auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(o.precondition.sampler));
  RunOptions ro;
  ro.chains = o.precondition.chains;
  ro.warmup = o.precondition.warmup;
  ro.draws = o.precondition.draws_for(/*lowrank=*/false);
  ro.metric = MetricAdapt::kDiag;
  ro.target_accept = default_target_accept(o.precondition.sampler);
  ro.should_stop = should_stop;
  TransportOptions t = transport_options(tt, kTrainTransportRounds);
  // The learned sampler trains in the transport's latent space: an identity there leaves it the raw
  // posterior (kidiq's momiq regression trained so: R-hat 1.15). Where the rounds do not
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
  // 496-10,000 per coordinate, and training failed or did not converge on five of 13 posteriors.
  // One 500-iteration run brings 16 chains there on all of them. Starting there always was tried:
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
                 {"sampler", o.precondition.sampler},
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

}  // namespace nmcmc
