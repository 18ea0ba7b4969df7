// The EBM loop of Note [EBM training loop].
#include "nmcmc/images/ebm_trainer.hpp"

#include <chrono>
#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"

namespace nmcmc {

using json = nlohmann::json;

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

namespace {
const EbmOptions& checked_split(const EbmOptions& o, int world) {
  for (auto [name, value] : {std::pair<const char*, int64_t>{"buffer", o.buffer}, {"sampler_batch", o.sampler_batch},
                             {"neg_batch", o.neg_batch}}) {
    if (value % world != 0) {
      throw UsageError("ebm: " + std::string(name) + " " + std::to_string(value) + " does not split evenly over " +
                       std::to_string(world) + " processes");
    }
  }
  return o;
}
}  // namespace

EbmTrainer::EbmTrainer(EbmOptions options, torch::Tensor data_uint8, std::shared_ptr<parallel::Communicator> comm)
    : o_(std::move(options)), comm_(comm ? std::move(comm) : parallel::single_process()), data_(std::move(data_uint8)),
      gen_(make_generator(stream_seed(checked_split(o_, comm_->world_size()).seed, comm_->rank()), checked_device(o_))),
      cpu_gen_(make_generator(stream_seed(o_.seed + 0x9e3779b9ULL, comm_->rank()))),
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
    ConvSamplerOptions so;
    so.filters = o_.conv.filters;
    so.layers = o_.conv.layers;
    so.steps = o_.conv.steps;
    so.eps = o_.conv.eps;
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
  // The replay buffer (this rank's rows) starts at dequantised training images.
  const int64_t rows = o_.buffer / comm_->world_size();
  torch::Tensor idx = torch::randint(data_.size(0), {rows}, cpu_gen_, torch::kInt64);
  buffer_ = transform_.to_logit(data_.index_select(0, idx), cpu_gen_, opts).reshape({rows, -1});
  // Every rank starts from rank 0's networks.
  if (comm_->world_size() > 1) {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) comm_->broadcast(p, 0);
    for (auto& b : net->buffers()) comm_->broadcast(b, 0);
    if (sampler_trainer_) sampler_trainer_->broadcast_from_root(*comm_);
  }
}

std::vector<double> EbmTrainer::mean_over_ranks(std::vector<double> values) {
  if (comm_->world_size() == 1) return values;
  values = parallel::all_reduce_doubles(*comm_, std::move(values));
  for (double& v : values) v /= static_cast<double>(comm_->world_size());
  return values;
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
  const int world = comm_->world_size();
  const int64_t n = o_.sampler_batch / world;
  torch::Tensor idx = torch::randperm(buffer_.size(0), cpu_gen_, torch::kInt64).narrow(0, 0, n).to(buffer_.device());
  torch::Tensor x = buffer_.index_select(0, idx);
  const int64_t g0 = target.grad_evals();
  double accept = 0, entropy = 0, jump = 0;
  const double d = static_cast<double>(target.dim());
  for (int64_t k = 0; k < o_.sampler_steps; ++k) {
    EnergyGrad eg = target.energy_and_grad(x);
    if (sampler_trainer_) {
      // This process's rows of the batch (the others' on the other ranks): the gradient of the
      // whole batch's objective and its accept rate and entropy.
      TrainingStep r = sampler_trainer_->step(target, {{x, eg.energy, eg.grad, &gen_}}, /*create_graph=*/true, *comm_);
      torch::NoGradGuard no_grad;
      const ObjectiveTerms& t = r.shards.front();
      x = advance_rows(x, eg.energy, t, gen_);
      accept += r.accept;
      entropy += r.entropy;
      jump += (torch::exp(torch::clamp_max(t.log_a, 0.0)) * t.jump_sq).mean().item<double>();  // averaged over ranks below
    } else {
      torch::NoGradGuard no_grad;
      ChainState state{x, eg.energy.to(torch::kFloat64), eg.grad};
      ProposalResult r = mala_->propose(target, state, gen_);
      auto [next, info] = mh_accept(state, r, gen_);
      const double a = mean_over_ranks({info.accept_prob.mean().item<double>()})[0];
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
  s.jump = mean_over_ranks({jump})[0] / k;
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
    const int64_t neg_rows = o_.neg_batch / comm_->world_size();
    torch::Tensor idx = torch::randperm(buffer_.size(0), cpu_gen_, torch::kInt64).narrow(0, 0, neg_rows).to(buffer_.device());
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
    s.mcmc_accept = mean_over_ranks({acc})[0] / static_cast<double>(o_.mcmc_steps);
    torch::Tensor neg = state.x.detach();
    buffer_.index_copy_(0, idx, neg);
    // Maximum-likelihood update of the energy.
    set_requires_grad(*target_->net(), true);
    torch::Tensor pos = data_batch(neg_rows);
    const auto shape = std::vector<int64_t>{-1, data_.size(1), data_.size(2), data_.size(3)};
    ebm_opt_->zero_grad();
    torch::Tensor e_pos = target_->net()->forward(pos.reshape(shape));
    torch::Tensor e_neg = target_->net()->forward(neg.reshape(shape));
    torch::Tensor loss = e_pos.mean() - e_neg.mean();
    if (o_.energy_reg > 0) loss = loss + o_.energy_reg * (e_pos.pow(2).mean() + e_neg.pow(2).mean());
    const double loss_value = loss.item<double>();
    if (comm_->world_size() > 1) {
      // Equal rows per rank: the whole batch's gradient is the mean of the ranks' (all or none step).
      const bool all_finite = mean_over_ranks({std::isfinite(loss_value) ? 0.0 : 1.0})[0] == 0;
      if (all_finite) {
        loss.backward();
        std::vector<torch::Tensor> grads;
        for (auto& p : target_->net()->parameters()) {
          if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
          grads.push_back(p.grad());
        }
        comm_->all_reduce_sum(grads);
        for (auto& g : grads) g.div_(static_cast<double>(comm_->world_size()));
        const double norm = torch::nn::utils::clip_grad_norm_(target_->net()->parameters(), o_.clip);
        if (std::isfinite(norm)) {
          ebm_opt_->step();
          ++updates_;
        }
      }
    } else if (std::isfinite(loss_value)) {
      loss.backward();
      const double norm = torch::nn::utils::clip_grad_norm_(target_->net()->parameters(), o_.clip);
      if (std::isfinite(norm)) {
        ebm_opt_->step();
        ++updates_;
      }
    }
    ebm_opt_->zero_grad();
    s.energy_diff = mean_over_ranks({(e_pos.mean() - e_neg.mean()).item<double>()})[0];
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

}  // namespace nmcmc
