// Training's parts beside its run (services/train_run.cpp): starting from a previous data set's
// model, and the rule that stops training once it no longer pays.
//
// Note [Training from a previous model]
// `nmcmc train --from previous.pt` (config "from") trains on a new data set of the model that
// previous.pt was trained on (the same parameters: dimension and names, UsageError otherwise). The
// networks, their step size and beta start where the previous training left them, and the new
// data move only what they must: the preconditioner's warm-up starts from the previous model's
// metric (L L^T), the warm-up's step size and chains (Note [Warm starts], kernels/warm_start.hpp)
// and runs train.from_warmup iterations (150) instead of precondition_warmup (500); its draws set
// the affine map m, L again and seed the buffer. Then the mixing check runs: where it passes with
// at least half of the previous model's min bulk-ESS (the same 64 chains x 200 draws), the
// previous networks fit and no training step is taken ("fits"). On posteriordb's nes1976 from
// nes1972's model the check gave 4,701 against 9,127 (52 %); 119 further steps (6.9 s, more than
// the warm-up and the check together) left the sampler little better per gradient (0.39 against
// 0.31 bulk-ESS per gradient over 4 x 1,000 draws), and 409 steps reached the quality of training
// from scratch no sooner than training from scratch (400 steps). Otherwise training goes on from
// the previous networks with a fresh optimiser and stops on a plateau of train.from_patience
// steps (50) rather than patience (200); where the mixing check at that plateau fails, training
// goes on under the usual patience. `--steps 0` re-adapts the affine map only; the check's
// verdict (with the warm-up's Fisher divergence) says whether the previous networks still fit.
// The model section of the config is the previous model's (its width, variant, preconditioner).
// A model trained in a flow transport's latent space keeps its flow as it is (no rounds, no fits):
// the flow is a bijection, so any flow leaves the draws exact, and the warm-up above runs in its
// latent space, where the affine map on top of the flow takes up what the new data move (their
// location and scales); the mixing check then says whether the old flow and networks still fit.
// `--transport` beside --from must agree with the previous model's (UsageError otherwise).
//
// Note [Training stops when it no longer pays]
// A user wants some number of effective draws (train.ess_goal; `nmcmc train --ess`; 10,000 in
// the defaults for your own posterior, Note [Training budget]; off where a config file's train
// section does not set it, and with --ess 0; BENCHMARKS "Training's cost rule"), and the training is worth its cost only while it shortens the way to them. Every
// train.probe_every steps (200) a probe runs the sampler as trained so far: 64 of
// the training's chains x 50 draws, as the mixing check runs (its own random stream). Its min
// bulk-ESS per gradient projects the all-in cost: the gradients spent so far (warm-up, training,
// probes and checks) plus ess_goal / (ESS per gradient). Training stops ("cost") when two probes
// in a row project no less than the best projection so far: more steps no longer pay for
// themselves. A probe whose chains do not mix (the mixing check's rules) projects no cost and
// never stops training. A probe costs 3,200 proposals, about an eighth of 200 default training
// steps (batch 64, about two gradients per row); its gradients and seconds count all-in.
#include <fmt/format.h>

#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/diagnostics/ess.hpp"
#include "nmcmc/flows/checkpoint.hpp"
#include "train_parts.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {
constexpr double kFitsEss = 0.5;  // Note [Training from a previous model]
}  // namespace

PreviousModel load_previous_model(const std::string& path, const Target& target, const TrainOptions& options) {
  auto [previous, meta] = load_model(path);
  if (previous->options().dim != target.dim()) {
    throw UsageError(fmt::format("--from: '{}' was trained on a model with {} parameters; this target has {}", path,
                                 previous->options().dim, target.dim()));
  }
  const std::vector<std::string> labels = parameter_labels(target);
  if (meta.contains("names") && meta["names"].get<std::vector<std::string>>() != labels) {
    const auto names = meta["names"].get<std::vector<std::string>>();
    size_t i = 0;
    while (i < names.size() && names[i] == labels[i]) ++i;
    throw UsageError(fmt::format("--from: '{}' was trained on another model: its parameter {} is '{}', this target's '{}'",
                                 path, i + 1, names[i], labels[i]));
  }
  PreviousModel out{previous, meta, std::nullopt, FlowTransport(nullptr)};
  if (meta.contains("transport")) {  // the flow is kept as it is; the affine map on top of it moves
    auto ar = open_learned_checkpoint(path);
    out.flow = load_transport(ar, meta, path);
  }
  if (previous->preconditioned()) {
    // Note [Warm starts]: the previous map's metric L L^T, its warm-up's step size, its chains
    WarmStart w;
    const torch::Tensor l = previous->precondition_matrix().to(torch::kFloat64);
    w.inv_mass = l.matmul(l.t());
    const json pre = meta.value("preconditioner", json::object());
    w.step_size = pre.is_object() ? pre.value("step_size", 0.0) : 0.0;
    if (!(w.step_size > 0)) w.step_size = 0.1;
    torch::Tensor buffer = load_buffer(path);
    if (buffer.defined()) {
      w.positions = buffer.narrow(0, 0, std::min<int64_t>(buffer.size(0), options.precondition.chains)).to(torch::kFloat64);
    }
    w.sampler = enum_name(options.precondition.sampler);
    out.start = std::move(w);
  }
  return out;
}

bool previous_networks_fit(json& check, const json& previous_meta) {
  const json before = previous_meta.value("check", json());
  const double old_ess = before.is_object() ? before.value("min_ess_bulk", 0.0) : 0.0;
  const double ratio = old_ess > 0 ? check.value("min_ess_bulk", 0.0) / old_ess : 0.0;
  check["ess_of_previous"] = old_ess > 0 ? json(ratio) : json(nullptr);
  return check.value("passes", false) && ratio >= kFitsEss;
}

bool extension_gained(const json* previous, const json& now) {
  if (!previous) return true;
  const double ess0 = previous->value("min_ess_bulk", 0.0), ess1 = now.value("min_ess_bulk", 0.0);
  const double excess0 = previous->value("max_rhat", INFINITY) - 1, excess1 = now.value("max_rhat", INFINITY) - 1;
  const bool more_ess = ess1 >= (1 + kExtensionGain) * ess0 && ess1 > ess0;
  const bool less_rhat = std::isfinite(excess1) && (!std::isfinite(excess0) || excess1 <= (1 - kExtensionGain) * excess0);
  return more_ess || less_rhat;
}

bool CostWatch::stops(int64_t step, double spent, json probe) {
  spent_probes_ += probe.value("grads", 0.0);
  const double total = spent + spent_probes_;
  const double ess = probe.value("min_ess_bulk", 0.0), grads = probe.value("grads", 0.0);
  const double projected = probe.value("passes", false) && ess > 0 ? total + goal_ * grads / ess : INFINITY;
  probe["step"] = step;
  probe["spent_grads"] = total;
  probe["projected_grads"] = std::isfinite(projected) ? json(projected) : json(nullptr);
  log_.push_back(probe);
  if (!std::isfinite(projected)) return false;  // chains that do not mix: no projection, no stop
  if (projected < best_) {
    best_ = projected;
    not_falling_ = 0;
    return false;
  }
  return ++not_falling_ >= 2;
}

json slowest_parameter(const torch::Tensor& draws, const Target& target, const TransportedTarget* latent) {
  torch::Tensor x = draws.detach();
  if (latent) {
    const std::vector<int64_t> shape = x.sizes().vec();
    x = latent->to_ambient(x.reshape({-1, shape[2]})).reshape(shape);
  }
  const torch::Tensor rhat = stan_summary(x.to(torch::kFloat64)).rhat.nan_to_num(0.0);  // a constant has none
  const int64_t i = rhat.argmax().item<int64_t>();
  return {{"name", parameter_labels(target).at(static_cast<size_t>(i))}, {"rhat", rhat[i].item<double>()}};
}

}  // namespace nmcmc
