#include "nmcmc/training/trainer.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/checkpoint.hpp"
#include "nmcmc/flows/checkpoint.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/io/draws.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/training/objective.hpp"

namespace nmcmc {

using json = nlohmann::json;

/// Version 2: per-sub-step weight tensors (w_in0, w_in1, ...).

namespace {
// The flat "train" object's keys (the JSON reads and writes these; TrainOptions' doc comment).
template <typename T>
void take(const json& j, const char* key, T& field) {
  if (j.contains(key)) j.at(key).get_to(field);
}
/// An optional field: null, or the value that once meant "unset" (0, or -1), leaves it unset.
template <typename T>
void take(const json& j, const char* key, std::optional<T>& field, T unset) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  const T x = v.is_null() ? unset : v.get<T>();
  field = x == unset ? std::nullopt : std::optional<T>(x);
}
/// An optional field without such a value: null leaves it unset.
template <typename T>
void take_or_null(const json& j, const char* key, std::optional<T>& field) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  field = v.is_null() ? std::nullopt : std::optional<T>(v.get<T>());
}
}  // namespace

void to_json(json& j, const TrainOptions& o) {
  const PreconditionWarmup& p = o.precondition;
  const TrainBudget& b = o.budget;
  j = json{{"accept_target", o.accept_target}, {"lr", o.lr}, {"min_lr", o.min_lr}, {"batch", o.batch},
           {"warmup_steps", o.warmup_steps}, {"beta", o.beta}, {"beta_min", o.beta_min}, {"beta_max", o.beta_max},
           {"rho", o.rho}, {"clip", o.clip}, {"amsgrad", o.amsgrad}, {"data", o.data}, {"buffer_size", o.buffer_size},
           {"buffer_init_scale", o.buffer_init_scale}, {"stop_grad", o.stop_grad}, {"seed", o.seed},
           {"checkpoint_every", o.checkpoint_every}, {"log_every", o.log_every}, {"shards", o.shards},
           {"precondition_sampler", p.sampler}, {"precondition_warmup", p.warmup}, {"precondition_draws", p.draws},
           {"precondition_chains", p.chains}, {"precondition_metric", p.metric}, {"precondition_refit", p.refit}, {"eps_from_warmup", p.eps_from_warmup},
           {"beta_from_warmup", p.beta_from_warmup},
           {"steps", b.steps}, {"patience", b.patience}, {"min_gain", b.min_gain}, {"max_seconds", b.max_seconds},
           {"from_warmup", b.from_warmup}, {"from_patience", b.from_patience}, {"ess_goal", b.ess_goal},
           {"probe_every", b.probe_every}};
}

void from_json(const json& j, TrainOptions& o) {
  PreconditionWarmup& p = o.precondition;
  TrainBudget& b = o.budget;
  take(j, "accept_target", o.accept_target);
  take(j, "lr", o.lr);
  take(j, "min_lr", o.min_lr);
  take(j, "batch", o.batch);
  take(j, "warmup_steps", o.warmup_steps, int64_t{-1});
  if (o.warmup_steps && *o.warmup_steps < 0) o.warmup_steps.reset();  // any negative: the default
  take(j, "beta", o.beta);
  take(j, "beta_min", o.beta_min);
  take(j, "beta_max", o.beta_max);
  take(j, "rho", o.rho);
  take(j, "clip", o.clip);
  take(j, "amsgrad", o.amsgrad);
  take(j, "data", o.data);
  take(j, "buffer_size", o.buffer_size, int64_t{0});
  take(j, "buffer_init_scale", o.buffer_init_scale);
  take(j, "stop_grad", o.stop_grad);
  take(j, "seed", o.seed);
  take(j, "checkpoint_every", o.checkpoint_every);
  take(j, "log_every", o.log_every);
  take(j, "shards", o.shards, int64_t{0});
  take(j, "precondition_sampler", p.sampler);
  take(j, "precondition_warmup", p.warmup);
  take(j, "precondition_draws", p.draws, int64_t{0});
  take(j, "precondition_chains", p.chains);
  take_or_null(j, "precondition_metric", p.metric);
  take(j, "precondition_refit", p.refit);
  take(j, "eps_from_warmup", p.eps_from_warmup);
  take(j, "beta_from_warmup", p.beta_from_warmup);
  take(j, "steps", b.steps);
  take(j, "patience", b.patience, int64_t{0});
  take(j, "min_gain", b.min_gain);
  take(j, "max_seconds", b.max_seconds, 0.0);
  take(j, "from_warmup", b.from_warmup);
  take(j, "from_patience", b.from_patience);
  take(j, "ess_goal", b.ess_goal, 0.0);
  take(j, "probe_every", b.probe_every);
}

// Note [The warm-up's metric]
// A dense preconditioner's warm-up adapted the dense metric over Stan's windows. Beyond a few
// dozen dimensions those windows' dense estimates are noisy and NUTS with them takes long
// trajectories, or does not mix at all: on election88_full (90 parameters) NUTS dense ends 4 x
// 1,000 draws at R-hat 1.58 (min bulk-ESS 7) where fisher-lowrank reaches 1.02 (245), and on
// radon_all (391) NUTS dense takes 1,168 s all-in against fisher-lowrank's 530 s. fisher-lowrank
// (Note [Metrics from draws and gradients]) adapts from draws and gradients and leaves a dense
// equivalent, which the preconditioner takes as it took the dense estimate. Measured with
// `train`'s defaults otherwise (BENCHMARKS.md, "The preconditioner's warm-up metric"), it took
// fewer warm-up gradients on every posterior tried: 5 % on German credit (51), 10 % on irt_2pl
// (144), 13 % on radon_mn (175), 38 % on radon_all (391, where the dense warm-up left training
// 22.5 s of its budget, Note [A long warm-up shortens training]), with the same flow and model on
// the first two and passing samplers on the last two. Above 50 dimensions it is the default; below,
// where a dense estimate from 16 x 500 draws is sound and the small posteriors' figures were
// measured, dense stays. The lowrank form (above 500) keeps its diagonal first stage and refit.
MetricAdapt PreconditionWarmup::metric_for(Precondition kind, int64_t dim) const {
  if (metric) return *metric;
  if (kind != Precondition::kDense) return MetricAdapt::kDiag;
  return dim > kFisherWarmupMinDim ? MetricAdapt::kFisherLowRank : MetricAdapt::kDense;
}

json TrainOptions::to_json() const { return json(*this); }

TrainOptions TrainOptions::from_json(const json& j) {
  TrainOptions o = options_from_json<TrainOptions>(j, "train options");
  const PreconditionWarmup& p = o.precondition;
  const TrainBudget& b = o.budget;
  if (!(o.accept_target > 0 && o.accept_target < 1)) throw UsageError("train: accept_target must be in (0, 1)");
  if (!(o.lr > 0) || !(o.min_lr >= 0) || o.min_lr > o.lr) throw UsageError("train: need lr > 0 and 0 <= min_lr <= lr");
  if (o.batch < 1 || b.steps < 0) throw UsageError("train: batch must be positive and steps non-negative");
  if (!(o.beta_min > 0) || o.beta_max < o.beta_min || o.beta < o.beta_min || o.beta > o.beta_max) {
    throw UsageError("train: need 0 < beta_min <= beta <= beta_max");
  }
  if (o.data != "auto" && o.data != "exact" && o.data != "buffer") throw UsageError("train: data must be auto, exact or buffer");
  if (o.buffer_size && *o.buffer_size < o.batch) throw UsageError("train: buffer_size must be at least the batch");
  if (o.checkpoint_every < 1 || o.log_every < 1) throw UsageError("train: checkpoint_every and log_every must be positive");
  if (o.shards && *o.shards < 0) throw UsageError("train: shards must be non-negative (0: one per process)");
  if (p.sampler != SamplerKind::kNuts && p.sampler != SamplerKind::kHmc && p.sampler != SamplerKind::kMala) {
    throw UsageError("train: precondition_sampler must be nuts, hmc or mala");
  }
  if ((b.patience && *b.patience < 0) || !(b.min_gain >= 0) ||
      (b.max_seconds && (!(*b.max_seconds >= 0) || !std::isfinite(*b.max_seconds)))) {
    throw UsageError("train: need patience >= 0, min_gain >= 0 and a finite max_seconds >= 0");
  }
  if (p.warmup < 20 || (p.draws && *p.draws < 0) || p.chains < 1) {
    throw UsageError("train: need precondition_warmup >= 20, precondition_draws >= 0 (0: auto) and precondition_chains >= 1");
  }
  if (p.metric == MetricAdapt::kUnit) throw UsageError("train: precondition_metric must be diag, dense, fisher-diag or fisher-lowrank");
  if (b.from_warmup < 20 || b.from_patience < 0) throw UsageError("train: need from_warmup >= 20 and from_patience >= 0");
  if ((b.ess_goal && (!(*b.ess_goal >= 0) || !std::isfinite(*b.ess_goal))) || b.probe_every < 1) {
    throw UsageError("train: need a finite ess_goal >= 0 (0: off) and probe_every >= 1");
  }
  return o;
}

namespace {
/// The model on the target's dtype and device (before its optimiser sees the parameters).
std::shared_ptr<ProposalModel> placed(std::shared_ptr<ProposalModel> model, const Target& target) {
  TORCH_CHECK(model, "Trainer needs a model");
  TORCH_CHECK(model->dim() == target.dim(), "model dimension ", model->dim(), " does not match the target's ",
              target.dim());
  model->module().to(target.options().device(), target.options().dtype().toScalarType());
  return model;
}
}  // namespace

Trainer::Trainer(Target& target, std::shared_ptr<ProposalModel> model, TrainOptions options,
                 std::shared_ptr<parallel::Communicator> comm)
    : target_(target), options_(std::move(options)),
      core_(placed(std::move(model), target),
            torch::optim::AdamOptions(options_.lr).betas({0.9, 0.999}).amsgrad(options_.amsgrad),
            BetaController(options_.beta, options_.beta_min, options_.beta_max, options_.rho, options_.accept_target),
            options_.clip),
      comm_(comm ? std::move(comm) : parallel::single_process()) {
  if (!options_.warmup_steps) options_.warmup_steps = std::min<int64_t>(200, options_.budget.steps / 50);
  use_buffer_ = options_.data == "buffer" || (options_.data == "auto" && !target.has_sampler());
  if (options_.data == "exact" && !target.has_sampler()) {
    throw UsageError("train: target '" + target.name() + "' has no exact sampler; use data = buffer");
  }
  const int world = comm_->world_size();
  if (options_.shards && *options_.shards < 0) throw UsageError("train: shards must be non-negative (0: one per process)");
  if (!options_.shards || *options_.shards == 0) options_.shards = world;  // 0, as in JSON: one per process
  const int64_t n_shards = *options_.shards;
  if (n_shards % world != 0) {
    throw UsageError(fmt::format("train: {} shards do not divide among {} processes: run on a number of processes "
                                 "that divides {} (each batch's shards keep their own random streams)",
                                 n_shards, world, n_shards));
  }
  if (options_.batch % n_shards != 0) {
    throw UsageError(fmt::format("train: batch {} does not split into {} equal shards", options_.batch, n_shards));
  }
  const int64_t size = options_.buffer_size.value_or(0) > 0 ? *options_.buffer_size : options_.batch;
  if (use_buffer_ && size % n_shards != 0) {
    throw UsageError(fmt::format("train: buffer_size {} does not split into {} equal shards", size, n_shards));
  }
  const int64_t per_rank = n_shards / world;
  for (int64_t k = 0; k < per_rank; ++k) {
    Shard sh;
    sh.index = comm_->rank() * per_rank + k;
    sh.gen = make_generator(stream_seed(options_.seed, sh.index), target.options().device());
    if (use_buffer_) sh.buffer = randn({size / n_shards, target.dim()}, sh.gen, target.options()) * options_.buffer_init_scale;
    shards_.push_back(std::move(sh));
  }
}

double Trainer::learning_rate(int64_t t) const {
  const double pi = std::acos(-1.0);
  const int64_t warmup = *options_.warmup_steps;  // resolved in the constructor
  if (t < warmup) return options_.lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const double span = std::max<int64_t>(1, options_.budget.steps - warmup);
  const double progress = std::min(1.0, static_cast<double>(t - warmup) / span);
  return options_.min_lr + 0.5 * (options_.lr - options_.min_lr) * (1.0 + std::cos(pi * progress));
}

EnergyGrad Trainer::batch_state(const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  if (core_.model().needs_grad()) return target_.energy_and_grad(x);
  return {target_.energy(x), torch::Tensor()};
}

double Trainer::warm_start_beta() {
  TORCH_CHECK(step_ == 0, "warm_start_beta: only before the first step");
  torch::NoGradGuard no_grad;
  const int64_t g0 = target_.grad_evals();
  ProposalModel& model = core_.model();
  torch::Tensor log_eps = model.log_eps();
  const double le = log_eps.item<double>(), h = 0.1;
  // The slope on every shard's first batch, averaged over all shards of all ranks.
  double slope_sum = 0;
  for (Shard& sh : shards_) {
    torch::Tensor x = next_batch(sh);
    auto [u_x, grad_x] = batch_state(x);
    auto mean_log_a = [&](double value) {
      log_eps.fill_(value);
      at::Generator g = make_generator(options_.seed + 0xbe7a, target_.options().device());  // common random numbers
      ObjectiveTerms t = entropy_objective(target_, model, x, u_x, grad_x, 0.0, g, false);
      torch::Tensor finite = torch::isfinite(t.log_a);
      torch::Tensor la = torch::where(finite, torch::clamp_max(t.log_a, 0.0), torch::full_like(t.log_a, -50.0));
      return la.mean().item<double>();
    };
    slope_sum += (mean_log_a(le + h) - mean_log_a(le - h)) / (2 * h);
  }
  log_eps.fill_(le);
  const double slope = parallel::all_reduce_doubles(*comm_, {slope_sum})[0] / static_cast<double>(shards());
  const double beta = std::clamp(-slope / static_cast<double>(model.dim()), options_.beta_min, options_.beta_max);
  core_.beta().set_value(beta);
  grads_ += (target_.grad_evals() - g0) / static_cast<int64_t>(shards_.size());
  return beta;
}

void Trainer::seed_buffer(const torch::Tensor& x) {
  TORCH_CHECK(step_ == 0, "seed_buffer: only before the first step");
  if (!use_buffer_) return;
  const int64_t block = shards_.front().buffer.size(0), dim = shards_.front().buffer.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == dim && x.size(0) > 0, "seed_buffer: expected [n, ", dim, "], got ",
              x.sizes());
  torch::NoGradGuard no_grad;
  // The whole buffer's rows cycle through x; each shard takes its block.
  for (Shard& sh : shards_) {
    torch::Tensor rows = torch::arange(sh.index * block, (sh.index + 1) * block, torch::kInt64).remainder(x.size(0));
    sh.buffer = x.to(torch::kCPU).index_select(0, rows).to(target_.options());
  }
}

torch::Tensor Trainer::chains() const {
  if (!use_buffer_) return torch::Tensor();
  std::vector<torch::Tensor> parts;
  for (const Shard& sh : shards_) parts.push_back(sh.buffer);
  return torch::cat(parts).detach();
}

torch::Tensor Trainer::next_batch(Shard& sh) {
  torch::NoGradGuard no_grad;
  const int64_t batch = options_.batch / shards();
  if (!use_buffer_) return target_.sample(batch, sh.gen);
  const int64_t size = sh.buffer.size(0);
  if (size == batch) {
    sh.batch_index = torch::Tensor();
    return sh.buffer;
  }
  sh.batch_index = torch::randperm(size, sh.gen, torch::TensorOptions().dtype(torch::kInt64).device(sh.buffer.device()))
                       .narrow(0, 0, batch);
  return sh.buffer.index_select(0, sh.batch_index);
}

TrainStats Trainer::record_step(double loss, double accept, double entropy, double lr,
                                std::chrono::steady_clock::time_point t0) {
  ++step_;
  TrainStats s;
  s.step = step_;
  s.loss = loss;
  s.accept = accept;
  s.beta = core_.beta().value();
  s.entropy = entropy;
  s.eps = core_.model().eps().item<double>();
  s.lr = lr;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.grads = grads_;
  s.skipped = skipped_;
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  if (step_ % options_.log_every == 0 || step_ == 1 || step_ == options_.budget.steps) log_.push_back(s);
  return s;
}

TrainStats Trainer::step(bool stop) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t g0 = target_.grad_evals();
  const double lr = learning_rate(step_);
  core_.set_learning_rate(lr);
  std::vector<ShardInput> inputs;
  for (Shard& sh : shards_) {
    torch::Tensor x = next_batch(sh);
    auto [u_x, grad_x] = batch_state(x);
    inputs.push_back({x, u_x, grad_x, &sh.gen});
  }
  TrainingStep r = core_.step(target_, inputs, /*create_graph=*/!options_.stop_grad, *comm_, stop);
  if (r.skipped) ++skipped_;
  bad_rows_ += r.rows_bad;
  stop_agreed_ = r.stop;
  torch::NoGradGuard no_grad;
  if (use_buffer_) {
    for (size_t k = 0; k < shards_.size(); ++k) {
      Shard& sh = shards_[k];
      torch::Tensor moved = advance_rows(inputs[k].x, inputs[k].u_x, r.shards[k], sh.gen);
      if (sh.batch_index.defined()) sh.buffer.index_copy_(0, sh.batch_index, moved);
      else sh.buffer = moved;
    }
  }
  // Gradient evaluations per batch row: every row costs the same, so this rank's count stands for all.
  grads_ += (target_.grad_evals() - g0) / static_cast<int64_t>(shards_.size());
  return record_step(r.loss, r.accept, r.entropy, lr, t0);
}

namespace {
json stats_to_json(const TrainStats& s) {
  return {s.step, s.loss, s.accept, s.beta, s.entropy, s.eps, s.lr, s.seconds, s.grads, s.skipped, s.elapsed};
}
TrainStats stats_from_json(const json& j) {
  TrainStats s;
  s.step = j.at(0);
  s.loss = j.at(1).is_number() ? j.at(1).get<double>() : NAN;
  s.accept = j.at(2);
  s.beta = j.at(3);
  s.entropy = j.at(4).is_number() ? j.at(4).get<double>() : NAN;
  s.eps = j.at(5);
  s.lr = j.at(6);
  s.seconds = j.at(7);
  s.grads = j.at(8);
  s.skipped = j.size() > 9 ? j.at(9).get<int64_t>() : 0;
  s.elapsed = j.size() > 10 ? j.at(10).get<double>() : 0.0;
  return s;
}

}  // namespace

void Trainer::save(const std::string& path, const json& extra,
                   const std::function<void(torch::serialize::OutputArchive&)>& more) const {
  // Every rank's random streams [shards, state bytes] and buffer blocks, in shard order.
  std::vector<torch::Tensor> states;
  for (const Shard& sh : shards_) states.push_back(sh.gen.get_state().unsqueeze(0));
  torch::Tensor rng = comm_->all_gather_rows(torch::cat(states));  // [S, L] uint8
  torch::Tensor buffer;
  if (use_buffer_) {
    std::vector<torch::Tensor> blocks;
    for (const Shard& sh : shards_) blocks.push_back(sh.buffer.to(torch::kCPU));
    buffer = comm_->all_gather_rows(torch::cat(blocks));
  }
  if (!comm_->is_root()) return;
  torch::serialize::OutputArchive ar;
  core_.save(ar, "model", "optimizer");
  ar.write("rng", rng[0].clone());
  if (shards() > 1) ar.write("rng_shards", rng);
  if (use_buffer_) ar.write("buffer", buffer);
  if (more) more(ar);
  json meta = extra;
  meta["format"] = "nmcmc-checkpoint";
  meta["version"] = kLearnedCheckpointVersion;
  meta["target"] = target_.spec();
  meta["model"] = core_.model().options_json();
  meta["train"] = options_.to_json();
  meta["dtype"] = target_.options().dtype() == caffe2::TypeMeta::Make<double>() ? "float64" : "float32";
  meta["step"] = step_;
  meta["beta"] = core_.beta().value();
  meta["grads"] = grads_;
  meta["skipped"] = skipped_;
  meta["bad_rows"] = bad_rows_;
  meta["elapsed"] = elapsed_;
  meta["shards"] = shards();
  meta["world_size"] = comm_->world_size();
  json rows = json::array();
  for (const auto& s : log_) rows.push_back(stats_to_json(s));
  meta["log"] = rows;
  write_checkpoint(path, ar, meta);
}

json Trainer::load(const std::string& path) {
  auto ar = open_learned_checkpoint(path);
  json meta = read_learned_meta(ar, path);
  if (density_of(meta["target"]) != density_of(target_.spec())) {
    throw DataError("checkpoint '" + path + "' was trained on target " + meta["target"].dump() + ", not " +
                    target_.spec().dump());
  }
  // Options added after a checkpoint was written are absent from it and take their defaults.
  json stored = core_.model().options_json();
  if (meta["model"].is_object()) stored.update(meta["model"]);
  if (stored != core_.model().options_json()) {
    throw DataError("checkpoint '" + path + "' holds a different model: " + meta["model"].dump());
  }
  const int64_t stored_shards = meta.value("shards", int64_t{1});
  if (stored_shards != shards()) {
    throw UsageError(fmt::format("checkpoint '{}' was trained with {} shard(s) per batch (written by {} process(es)); "
                                 "this run has {}: resume it on a number of processes that divides {} "
                                 "(its shards keep their own random streams and buffer rows)",
                                 path, stored_shards, meta.value("world_size", 1), shards(), stored_shards));
  }
  try {
    core_.load(ar, "model", "optimizer");
    torch::Tensor rng;
    if (shards() > 1) {
      ar.read("rng_shards", rng);
    } else {
      ar.read("rng", rng);
      rng = rng.unsqueeze(0);
    }
    if (rng.size(0) != shards()) throw DataError("checkpoint '" + path + "' has the wrong number of random streams");
    for (Shard& sh : shards_) sh.gen.set_state(rng[sh.index].clone());
    if (use_buffer_) {
      torch::Tensor b;
      ar.read("buffer", b);
      const int64_t block = shards_.front().buffer.size(0);
      if (b.dim() != 2 || b.size(0) != block * shards() || b.size(1) != shards_.front().buffer.size(1)) {
        throw DataError("checkpoint '" + path + "' has a buffer of the wrong shape");
      }
      for (Shard& sh : shards_) sh.buffer = b.narrow(0, sh.index * block, block).to(target_.options());
    }
  } catch (const c10::Error& e) {
    throw DataError("checkpoint '" + path + "' is incomplete or corrupt: " + e.what_without_backtrace());
  }
  step_ = meta.at("step");
  core_.beta().set_value(meta.at("beta"));
  grads_ = meta.at("grads");
  skipped_ = meta.value("skipped", 0);
  bad_rows_ = meta.value("bad_rows", int64_t{0});
  elapsed_ = meta.value("elapsed", 0.0);
  log_.clear();
  for (const auto& row : meta.at("log")) log_.push_back(stats_from_json(row));
  return meta;
}

void write_training_log(const std::string& path, const std::vector<TrainStats>& rows) {
  write_atomically(path, [&](std::ostream& os) {
    os << "step,loss,accept,beta,entropy,eps,lr,seconds,grads,skipped,elapsed\n";
    for (const auto& s : rows) {
      os << fmt::format("{},{:.8g},{:.6g},{:.6g},{:.8g},{:.8g},{:.6g},{:.6g},{},{},{:.3f}\n", s.step, s.loss, s.accept,
                        s.beta, s.entropy, s.eps, s.lr, s.seconds, s.grads, s.skipped, s.elapsed);
    }
  });
}

}  // namespace nmcmc
