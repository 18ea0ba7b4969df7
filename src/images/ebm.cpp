#include "nmcmc/images/ebm.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/model.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/checkpoint.hpp"

namespace nmcmc {

using json = nlohmann::json;

// ------------------------------------------------------------------ EnergyNet

EnergyNetImpl::EnergyNetImpl(int64_t channels, int64_t height, int64_t width, int64_t filters, uint64_t seed) {
  TORCH_CHECK(height >= 4 && width >= 4, "the energy network needs images of at least 4x4");
  namespace nn = torch::nn;
  const int64_t f = filters;
  // (in, out, kernel, stride, padding); the last kernel spans what the two strides leave.
  const int64_t h = height / 4, w = width / 4;
  std::vector<nn::Conv2dOptions> specs = {
      nn::Conv2dOptions(channels, f, 3).padding(1), nn::Conv2dOptions(f, f, 4).stride(2).padding(1),
      nn::Conv2dOptions(f, f, 3).padding(1),        nn::Conv2dOptions(f, f, 4).stride(2).padding(1),
      nn::Conv2dOptions(f, f, 3).padding(1),        nn::Conv2dOptions(f, 1, std::vector<int64_t>{h, w})};
  at::Generator gen = make_generator(seed);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto conv = register_module("conv" + std::to_string(i), nn::Conv2d(specs[i]));
    conv->to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    const double fan_in = static_cast<double>(conv->weight[0].numel());
    const double b = 1.0 / std::sqrt(fan_in);
    conv->weight.uniform_(-b, b, gen);
    conv->bias.uniform_(-b, b, gen);
    convs_.push_back(conv);
  }
}

torch::Tensor EnergyNetImpl::forward(const torch::Tensor& images) {
  torch::Tensor h = images;
  for (size_t i = 0; i + 1 < convs_.size(); ++i) h = torch::elu(convs_[i]->forward(h));
  return convs_.back()->forward(h).reshape({images.size(0), -1}).sum(1);
}

EbmTarget::EbmTarget(EnergyNet net, int64_t channels, int64_t height, int64_t width, torch::TensorOptions options,
                     double wall, double bound)
    : Target(options), net_(std::move(net)), c_(channels), h_(height), w_(width), wall_(wall), bound_(bound) {}

torch::Tensor EbmTarget::compute_energy(const torch::Tensor& x) const {
  torch::Tensor e = const_cast<EnergyNet&>(net_)->forward(x.reshape({x.size(0), c_, h_, w_}));
  if (wall_ > 0) e = e + wall_ * torch::relu(x.abs() - bound_).pow(2).sum(1);
  return e;
}

// ------------------------------------------------------------------ options

json EbmOptions::to_json() const {
  return {{"data", data},
          {"size", size},
          {"channels", channels},
          {"limit", limit},
          {"ebm_filters", ebm_filters},
          {"sampler", sampler},
          {"conv", {{"filters", conv.filters}, {"layers", conv.layers}, {"steps", conv.steps}, {"eps", conv.eps}}},
          {"iterations", iterations},
          {"buffer", buffer},
          {"sampler_batch", sampler_batch},
          {"sampler_steps", sampler_steps},
          {"neg_batch", neg_batch},
          {"mcmc_steps", mcmc_steps},
          {"lr", lr},
          {"sampler_lr", sampler_lr},
          {"adam_beta1", adam_beta1},
          {"adam_beta2", adam_beta2},
          {"lr_drops", lr_drops},
          {"lr_drop_factor", lr_drop_factor},
          {"accept_target", accept_target},
          {"accept_margin", accept_margin},
          {"beta", beta},
          {"beta_min", beta_min},
          {"beta_max", beta_max},
          {"rho", rho},
          {"rho_eps", rho_eps},
          {"energy_reg", energy_reg},
          {"clip", clip},
          {"wall", wall},
          {"longrun_steps", longrun_steps},
          {"seed", seed},
          {"checkpoint_every", checkpoint_every},
          {"log_every", log_every},
          {"dtype", dtype},
          {"device", device}};
}

json EbmOptions::profile(const std::string& name) {
  if (name.empty() || name == "paper") return json::object();
  if (name == "cpu") {
    // Sized for 2 vCPUs (see BENCHMARKS.md, #5): smaller networks (energy 32 filters; sampler 3
    // layers of 16 filters, N = 1), half the batches and MCMC steps, 1000 iterations, a buffer of
    // 1000 so that every buffer image is visited ~64 times, and an energy learning rate 10x the
    // paper's (1e-3; the sampler keeps 1e-4) so that the energy keeps up with the sampler's growing
    // steps in 1000 rather than 100000 iterations. The support wall (weight 1) keeps chains inside
    // the data's logit range: without it, runs at this budget filled the buffer with saturated
    // noise (measured; BENCHMARKS.md).
    return {{"ebm_filters", 32}, {"conv", {{"filters", 16}, {"layers", 3}, {"steps", 1}}},
            {"iterations", 1000}, {"buffer", 1000}, {"sampler_batch", 32}, {"neg_batch", 64}, {"mcmc_steps", 20},
            {"lr", 1e-3}, {"sampler_lr", 1e-4}, {"wall", 1.0}, {"longrun_steps", 2000}, {"checkpoint_every", 50}};
  }
  if (name == "smoke") {
    return {{"limit", 256}, {"ebm_filters", 8}, {"conv", {{"filters", 8}, {"layers", 2}, {"steps", 1}}},
            {"iterations", 6}, {"buffer", 128}, {"sampler_batch", 8}, {"sampler_steps", 2}, {"neg_batch", 8},
            {"mcmc_steps", 3}, {"longrun_steps", 10}, {"checkpoint_every", 3}, {"log_every", 1}};
  }
  throw UsageError("unknown EBM profile '" + name + "' (cpu, paper, smoke)");
}

EbmOptions EbmOptions::from_json(const json& j_in, const std::string& profile_name) {
  EbmOptions o;
  json j = o.to_json();
  auto merge = [&j](const json& over, const std::string& where) {
    for (auto& [key, value] : over.items()) {
      if (!j.contains(key)) throw UsageError(where + ": option '" + key + "' is unknown");
      if (key == "conv") {
        if (!value.is_object()) throw UsageError(where + ": conv must be an object");
        for (auto& [k2, v2] : value.items()) {
          if (!j["conv"].contains(k2)) throw UsageError(where + ": option 'conv." + k2 + "' is unknown");
          j["conv"][k2] = v2;
        }
      } else {
        j[key] = value;
      }
    }
  };
  merge(profile(profile_name), "profile");
  merge(j_in, "ebm options");
  try {
    o.data = j.at("data");
    o.size = j.at("size");
    o.channels = j.at("channels");
    o.limit = j.at("limit");
    o.ebm_filters = j.at("ebm_filters");
    o.sampler = j.at("sampler");
    o.conv.filters = j.at("conv").at("filters");
    o.conv.layers = j.at("conv").at("layers");
    o.conv.steps = j.at("conv").at("steps");
    o.conv.eps = j.at("conv").at("eps");
    o.iterations = j.at("iterations");
    o.buffer = j.at("buffer");
    o.sampler_batch = j.at("sampler_batch");
    o.sampler_steps = j.at("sampler_steps");
    o.neg_batch = j.at("neg_batch");
    o.mcmc_steps = j.at("mcmc_steps");
    o.lr = j.at("lr");
    o.sampler_lr = j.at("sampler_lr");
    o.adam_beta1 = j.at("adam_beta1");
    o.adam_beta2 = j.at("adam_beta2");
    o.lr_drops = j.at("lr_drops").get<std::vector<double>>();
    o.lr_drop_factor = j.at("lr_drop_factor");
    o.accept_target = j.at("accept_target");
    o.accept_margin = j.at("accept_margin");
    o.beta = j.at("beta");
    o.beta_min = j.at("beta_min");
    o.beta_max = j.at("beta_max");
    o.rho = j.at("rho");
    o.rho_eps = j.at("rho_eps");
    o.energy_reg = j.at("energy_reg");
    o.clip = j.at("clip");
    o.wall = j.at("wall");
    o.longrun_steps = j.at("longrun_steps");
    o.seed = j.at("seed");
    o.checkpoint_every = j.at("checkpoint_every");
    o.log_every = j.at("log_every");
    o.dtype = j.at("dtype");
    o.device = j.at("device");
  } catch (const json::exception& e) {
    throw UsageError(std::string("ebm options: ") + e.what());
  }
  if (o.sampler != "learned" && o.sampler != "mala") throw UsageError("ebm: sampler must be learned or mala");
  if (o.dtype != "float32" && o.dtype != "float64") throw UsageError("ebm: dtype must be float32 or float64");
  try {
    torch::Device dev(o.device);
    (void)dev;
  } catch (const std::exception&) {
    throw UsageError("ebm: device must be cpu, cuda or cuda:N, got '" + o.device + "'");
  }
  if (o.iterations < 0 || o.buffer < 1 || o.sampler_batch < 1 || o.sampler_steps < 1 || o.neg_batch < 1 || o.mcmc_steps < 1) {
    throw UsageError("ebm: iterations must be >= 0 and buffer, batches and steps positive");
  }
  if (o.sampler_batch > o.buffer || o.neg_batch > o.buffer) throw UsageError("ebm: the batches cannot exceed the buffer");
  if (!(o.wall >= 0)) throw UsageError("ebm: wall must be non-negative");
  if (!(o.sampler_lr >= 0)) throw UsageError("ebm: sampler_lr must be non-negative");
  if (!(o.lr > 0) || !(o.accept_target > 0 && o.accept_target < 1)) throw UsageError("ebm: need lr > 0 and accept_target in (0, 1)");
  if (!(o.beta_min > 0) || o.beta < o.beta_min || o.beta > o.beta_max) throw UsageError("ebm: need 0 < beta_min <= beta <= beta_max");
  if (o.ebm_filters < 1 || o.checkpoint_every < 1 || o.log_every < 1 || o.limit < 0) {
    throw UsageError("ebm: ebm_filters, checkpoint_every and log_every must be positive");
  }
  if (o.conv.filters < 1 || o.conv.layers < 2 || o.conv.steps < 1 || !(o.conv.eps > 0)) {
    throw UsageError("ebm: conv needs filters >= 1, layers >= 2, steps >= 1, eps > 0");
  }
  return o;
}

// ------------------------------------------------------------------ trainer

namespace {
using Clock = std::chrono::steady_clock;
torch::Device checked_device(const EbmOptions& o) {
  torch::Device device(o.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw UsageError("ebm: device " + o.device + ": this LibTorch build or machine has no CUDA device");
  }
  return device;
}
torch::TensorOptions tensor_options(const EbmOptions& o) {
  return torch::TensorOptions().dtype(o.dtype == "float64" ? torch::kFloat64 : torch::kFloat32).device(checked_device(o));
}
void set_requires_grad(torch::nn::Module& m, bool on) {
  for (auto& p : m.parameters()) p.requires_grad_(on);
}
void set_lr(torch::optim::Adam& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamOptions&>(g.options()).lr(lr);
}
}  // namespace

EbmTrainer::EbmTrainer(EbmOptions options, torch::Tensor data_uint8)
    : o_(std::move(options)), data_(std::move(data_uint8)), gen_(make_generator(o_.seed, checked_device(o_))),
      cpu_gen_(make_generator(o_.seed + 0x9e3779b9ULL)),
      log_eps_mala_(std::log(o_.conv.eps)) {
  if (data_.dim() != 4 || data_.size(0) < 1) throw DataError("image data must be a non-empty [N, C, H, W] set");
  const int64_t c = data_.size(1), h = data_.size(2), w = data_.size(3);
  if (h < 4 || w < 4) throw DataError("images must be at least 4x4");
  const auto opts = tensor_options(o_);
  EnergyNet net(c, h, w, o_.ebm_filters, o_.seed * 7919 + 11);
  net->to(opts.device(), opts.dtype().toScalarType());
  const double bound = std::log((1.0 - transform_.alpha) / transform_.alpha);
  target_ = std::make_unique<EbmTarget>(net, c, h, w, opts, o_.wall, bound);
  ebm_opt_ = std::make_unique<torch::optim::Adam>(
      net->parameters(), torch::optim::AdamOptions(o_.lr).betas({o_.adam_beta1, o_.adam_beta2}));
  if (o_.sampler == "learned") {
    ConvSamplerOptions so = o_.conv;
    so.channels = c;
    so.height = h;
    so.width = w;
    sampler_ = ConvSampler(so);
    sampler_->to(opts.device(), opts.dtype().toScalarType());
    sampler_trainer_ = std::make_unique<ProposalTrainer>(
        sampler_.ptr(),
        torch::optim::AdamOptions(o_.sampler_lr > 0 ? o_.sampler_lr : o_.lr).betas({o_.adam_beta1, o_.adam_beta2}),
        BetaController(o_.beta, o_.beta_min, o_.beta_max, o_.rho, o_.accept_target), o_.clip);
    proposal_ = std::make_shared<ModelProposal>(sampler_.ptr(), "learned-conv");
  } else {
    mala_ = std::make_shared<Mala>(std::exp(log_eps_mala_));
    proposal_ = mala_;
  }
  // The replay buffer starts at dequantised training images.
  torch::Tensor idx = torch::randint(data_.size(0), {o_.buffer}, cpu_gen_, torch::kInt64);
  buffer_ = transform_.to_logit(data_.index_select(0, idx), cpu_gen_, opts).reshape({o_.buffer, -1});
}

torch::Tensor EbmTrainer::data_batch(int64_t n) {
  torch::Tensor idx = torch::randint(data_.size(0), {n}, cpu_gen_, torch::kInt64);
  return transform_.to_logit(data_.index_select(0, idx), cpu_gen_, target_->options()).reshape({n, -1});
}

double EbmTrainer::learning_rate(int64_t iteration) const {
  double lr = o_.lr;
  for (double f : o_.lr_drops) {
    if (static_cast<double>(iteration) >= f * static_cast<double>(o_.iterations)) lr *= o_.lr_drop_factor;
  }
  return lr;
}

EbmStats EbmTrainer::sampler_phase(EbmStats s) {
  Target& target = *target_;
  const int64_t n = o_.sampler_batch;
  torch::Tensor idx = torch::randperm(o_.buffer, cpu_gen_, torch::kInt64).narrow(0, 0, n).to(buffer_.device());
  torch::Tensor x = buffer_.index_select(0, idx);
  const int64_t g0 = target.grad_evals();
  double accept = 0, entropy = 0, jump = 0;
  const double d = static_cast<double>(target.dim());
  for (int64_t k = 0; k < o_.sampler_steps; ++k) {
    EnergyGrad eg = target.energy_and_grad(x);
    if (sampler_trainer_) {
      ProposalStep r = sampler_trainer_->step(target, x, eg.energy, eg.grad, gen_, /*create_graph=*/true);
      torch::NoGradGuard no_grad;
      const ObjectiveTerms& t = r.terms;
      x = advance_rows(x, eg.energy, r, gen_);
      accept += t.accept;
      entropy += t.entropy.mean().item<double>();
      jump += (torch::exp(torch::clamp_max(t.log_a, 0.0)) * t.jump_sq).mean().item<double>();
    } else {
      torch::NoGradGuard no_grad;
      ChainState state{x, eg.energy.to(torch::kFloat64), eg.grad};
      ProposalResult r = mala_->propose(target, state, gen_);
      auto [next, info] = mh_accept(state, r, gen_);
      const double a = info.accept_prob.mean().item<double>();
      accept += a;
      entropy += d * log_eps_mala_;
      jump += (info.accept_prob * (r.proposed.x - x).to(torch::kFloat64).pow(2).sum(1)).mean().item<double>();
      x = next.x;
      log_eps_mala_ += o_.rho_eps * (a - o_.accept_target);
      mala_->set_step_size(std::exp(log_eps_mala_));
    }
  }
  buffer_.index_copy_(0, idx, x.detach());
  grads_training_ += target.grad_evals() - g0;
  const double k = static_cast<double>(o_.sampler_steps);
  s.accept = accept / k;
  s.entropy = entropy / k;
  s.jump = jump / k;
  return s;
}

EbmStats EbmTrainer::iterate() {
  const auto t0 = Clock::now();
  const double lr = learning_rate(it_);
  set_lr(*ebm_opt_, lr);
  if (sampler_trainer_) sampler_trainer_->set_learning_rate(lr * (o_.sampler_lr > 0 ? o_.sampler_lr / o_.lr : 1.0));
  EbmStats s;
  // Sampler phase: the energy's parameters are constants here.
  set_requires_grad(*target_->net(), false);
  s = sampler_phase(s);
  if (s.accept > o_.accept_target - o_.accept_margin) {
    // Negatives: neg_batch buffer rows take mcmc_steps MH steps.
    torch::Tensor idx = torch::randperm(o_.buffer, cpu_gen_, torch::kInt64).narrow(0, 0, o_.neg_batch).to(buffer_.device());
    MetropolisHastings kernel(proposal_);
    if (sampler_) sampler_->eval();
    const int64_t g0 = target_->grad_evals();
    ChainState state = kernel.init(*target_, buffer_.index_select(0, idx));
    double acc = 0;
    for (int64_t k = 0; k < o_.mcmc_steps; ++k) {
      auto [next, info] = kernel.step(*target_, state, gen_);
      acc += info.accept_prob.mean().item<double>();
      state = next;
    }
    grads_sampling_ += target_->grad_evals() - g0;
    s.mcmc_accept = acc / static_cast<double>(o_.mcmc_steps);
    torch::Tensor neg = state.x.detach();
    buffer_.index_copy_(0, idx, neg);
    // Maximum-likelihood update of the energy.
    set_requires_grad(*target_->net(), true);
    torch::Tensor pos = data_batch(o_.neg_batch);
    const auto shape = std::vector<int64_t>{-1, data_.size(1), data_.size(2), data_.size(3)};
    ebm_opt_->zero_grad();
    torch::Tensor e_pos = target_->net()->forward(pos.reshape(shape));
    torch::Tensor e_neg = target_->net()->forward(neg.reshape(shape));
    torch::Tensor loss = e_pos.mean() - e_neg.mean();
    if (o_.energy_reg > 0) loss = loss + o_.energy_reg * (e_pos.pow(2).mean() + e_neg.pow(2).mean());
    const double loss_value = loss.item<double>();
    if (std::isfinite(loss_value)) {
      loss.backward();
      const double norm = torch::nn::utils::clip_grad_norm_(target_->net()->parameters(), o_.clip);
      if (std::isfinite(norm)) {
        ebm_opt_->step();
        ++updates_;
      }
    }
    ebm_opt_->zero_grad();
    s.energy_diff = (e_pos.mean() - e_neg.mean()).item<double>();
  }
  ++it_;
  s.iteration = it_;
  s.eps = sampler_ ? sampler_->eps().item<double>() : std::exp(log_eps_mala_);
  s.beta = sampler_trainer_ ? sampler_trainer_->beta().value() : NAN;
  s.lr = lr;
  s.updates = updates_;
  s.grads_sampling = grads_sampling_;
  s.grads_training = grads_training_;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  if (it_ % o_.log_every == 0 || it_ == 1 || it_ == o_.iterations) log_.push_back(s);
  return s;
}

// ------------------------------------------------------------------ checkpoints

namespace {
constexpr int kEbmCheckpointVersion = 1;

json stats_to_json(const EbmStats& s) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  return {s.iteration, num(s.accept), num(s.mcmc_accept), num(s.entropy), num(s.jump), num(s.energy_diff), num(s.eps),
          num(s.beta), s.lr, s.updates, s.grads_sampling, s.grads_training, s.seconds, s.elapsed};
}
EbmStats stats_from_json(const json& j) {
  auto num = [](const json& v) { return v.is_number() ? v.get<double>() : NAN; };
  EbmStats s;
  s.iteration = j.at(0);
  s.accept = num(j.at(1));
  s.mcmc_accept = num(j.at(2));
  s.entropy = num(j.at(3));
  s.jump = num(j.at(4));
  s.energy_diff = num(j.at(5));
  s.eps = num(j.at(6));
  s.beta = num(j.at(7));
  s.lr = j.at(8);
  s.updates = j.at(9);
  s.grads_sampling = j.at(10);
  s.grads_training = j.at(11);
  s.seconds = j.at(12);
  s.elapsed = j.at(13);
  return s;
}

torch::serialize::InputArchive open_ebm_archive(const std::string& path, json& meta,
                                                const torch::Device& device = torch::kCPU) {
  // Tensors land where the trainer's live (Module::load would otherwise move parameters).
  auto ar = open_checkpoint(path, "EBM checkpoint", device);
  meta = read_checkpoint_meta(ar, path, "EBM checkpoint", "nmcmc-ebm-checkpoint");
  if (meta.value("version", 0) != kEbmCheckpointVersion) {
    throw DataError("EBM checkpoint '" + path + "' has an unsupported format version");
  }
  return ar;
}
}  // namespace

void EbmTrainer::save(const std::string& path) const {
  torch::serialize::OutputArchive ar, ebm_ar, ebm_opt_ar;
  target_->net()->save(ebm_ar);
  ebm_opt_->save(ebm_opt_ar);
  ar.write("ebm", ebm_ar);
  ar.write("ebm_optimizer", ebm_opt_ar);
  if (sampler_trainer_) sampler_trainer_->save(ar, "sampler", "sampler_optimizer");
  ar.write("buffer", buffer_.to(torch::kCPU));
  ar.write("rng", gen_.get_state());
  ar.write("rng_cpu", cpu_gen_.get_state());
  json meta;
  meta["format"] = "nmcmc-ebm-checkpoint";
  meta["version"] = kEbmCheckpointVersion;
  meta["options"] = o_.to_json();
  meta["shape"] = {data_.size(1), data_.size(2), data_.size(3)};
  meta["iteration"] = it_;
  meta["updates"] = updates_;
  meta["beta"] = sampler_trainer_ ? sampler_trainer_->beta().value() : o_.beta;
  meta["log_eps_mala"] = log_eps_mala_;
  meta["grads_sampling"] = grads_sampling_;
  meta["grads_training"] = grads_training_;
  meta["elapsed"] = elapsed_;
  json rows = json::array();
  for (const auto& s : log_) rows.push_back(stats_to_json(s));
  meta["log"] = rows;
  ar.write("meta", c10::IValue(meta.dump()));
  write_atomically(path, [&](std::ostream& os) { ar.save_to(os); });
}

void EbmTrainer::load(const std::string& path) {
  json meta;
  auto ar = open_ebm_archive(path, meta, buffer_.device());
  json mine = o_.to_json(), theirs = meta.at("options");
  // Everything but the run length and bookkeeping must match.
  for (const char* k : {"iterations", "checkpoint_every", "log_every", "longrun_steps", "device"}) {
    mine.erase(k);
    theirs.erase(k);
  }
  if (mine != theirs) throw DataError("EBM checkpoint '" + path + "' was written with different options: " + meta.at("options").dump());
  if (meta.at("shape") != json{data_.size(1), data_.size(2), data_.size(3)}) {
    throw DataError("EBM checkpoint '" + path + "' is for images of shape " + meta.at("shape").dump());
  }
  try {
    torch::serialize::InputArchive ebm_ar, ebm_opt_ar;
    ar.read("ebm", ebm_ar);
    target_->net()->load(ebm_ar);
    ar.read("ebm_optimizer", ebm_opt_ar);
    ebm_opt_->load(ebm_opt_ar);
    if (sampler_trainer_) sampler_trainer_->load(ar, "sampler", "sampler_optimizer");
    torch::Tensor b, state;
    ar.read("buffer", b);
    if (b.sizes() != buffer_.sizes()) throw DataError("EBM checkpoint '" + path + "' has a buffer of the wrong shape");
    buffer_ = b.to(buffer_.options());
    ar.read("rng", state);
    gen_.set_state(state.to(torch::kCPU));
    ar.read("rng_cpu", state);
    cpu_gen_.set_state(state.to(torch::kCPU));
  } catch (const c10::Error& e) {
    throw DataError("EBM checkpoint '" + path + "' is incomplete or corrupt: " + e.what_without_backtrace());
  }
  it_ = meta.at("iteration");
  updates_ = meta.at("updates");
  if (sampler_trainer_) sampler_trainer_->beta().set_value(meta.at("beta"));
  log_eps_mala_ = meta.at("log_eps_mala");
  if (mala_) mala_->set_step_size(std::exp(log_eps_mala_));
  grads_sampling_ = meta.at("grads_sampling");
  grads_training_ = meta.at("grads_training");
  elapsed_ = meta.at("elapsed");
  log_.clear();
  for (const auto& row : meta.at("log")) log_.push_back(stats_from_json(row));
}

json read_ebm_checkpoint_meta(const std::string& path) {
  json meta;
  open_ebm_archive(path, meta);
  return meta;
}

static const char* kEbmLogHeader =
    "iteration,accept,mcmc_accept,entropy,jump,energy_diff,eps,beta,lr,updates,grads_sampling,grads_training,seconds,elapsed";

void write_ebm_log(const std::string& path, const std::vector<EbmStats>& rows) {
  write_atomically(path, [&](std::ostream& os) {
    os << kEbmLogHeader << "\n";
    for (const auto& s : rows) {
      os << s.iteration << ',' << s.accept << ',' << s.mcmc_accept << ',' << s.entropy << ',' << s.jump << ','
         << s.energy_diff << ',' << s.eps << ',' << s.beta << ',' << s.lr << ',' << s.updates << ','
         << s.grads_sampling << ',' << s.grads_training << ',' << s.seconds << ',' << s.elapsed << "\n";
    }
  });
}

std::vector<EbmStats> read_ebm_log(const std::string& path) {
  std::string text = read_file(path);
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kEbmLogHeader) throw DataError("'" + path + "' is not an nmcmc EBM log");
  std::vector<EbmStats> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> v;
    std::istringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) {
      try {
        v.push_back(std::stod(cell));
      } catch (const std::exception&) {
        v.push_back(NAN);  // "nan" / "-nan"
      }
    }
    if (v.size() != 14) throw DataError("'" + path + "': malformed row '" + line + "'");
    EbmStats s;
    s.iteration = static_cast<int64_t>(v[0]);
    s.accept = v[1];
    s.mcmc_accept = v[2];
    s.entropy = v[3];
    s.jump = v[4];
    s.energy_diff = v[5];
    s.eps = v[6];
    s.beta = v[7];
    s.lr = v[8];
    s.updates = static_cast<int64_t>(v[9]);
    s.grads_sampling = static_cast<int64_t>(v[10]);
    s.grads_training = static_cast<int64_t>(v[11]);
    s.seconds = v[12];
    s.elapsed = v[13];
    rows.push_back(s);
  }
  return rows;
}

}  // namespace nmcmc
