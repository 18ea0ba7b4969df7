// Train nmcmc's learned sampler on a density of your own and sample it, in C++.
//
// The density: a "neck" model, a small hierarchical posterior with a funnel-like coupling,
//   tau ~ N(0, 1),   theta_i | tau ~ N(0, exp(tau / 2)^2),  i = 1..4,
// written in its centred form (the form that is hard for HMC and NUTS). Its exact moments are
// known: tau has mean 0 and sd 1; theta_i has mean 0 and variance E[exp(tau)] = exp(1/2).
//
// 1. Register the target by name, so the training service (and anything that takes a spec)
//    can build it: nmcmc::register_target.
// 2. Train with nmcmc::train (the service behind `nmcmc train`): a checkpoint is written and
//    training resumes from it if run again.
// 3. Sample the trained proposal with the one MH kernel and check the moments.
#include <nmcmc/nmcmc.hpp>

#include <cmath>
#include <iostream>

namespace {

class Neck : public nmcmc::Target {
 public:
  Neck(int64_t groups, torch::TensorOptions options) : Target(options), groups_(groups) {}
  std::string name() const override { return "neck"; }
  int64_t dim() const override { return groups_ + 1; }
  nlohmann::json spec() const override { return {{"name", "neck"}, {"groups", groups_}}; }

 protected:
  // x = (tau, theta_1..theta_G): [C, G + 1] -> U [C]. Torch ops, so autograd gives dU (and the
  // double backward training needs).
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    torch::Tensor tau = x.select(1, 0), theta = x.narrow(1, 1, groups_);
    // -log N(tau; 0, 1) - sum_i log N(theta_i; 0, exp(tau/2)^2), constants dropped.
    return 0.5 * tau.pow(2) + 0.5 * torch::exp(-tau) * theta.pow(2).sum(1) + 0.5 * static_cast<double>(groups_) * tau;
  }

 private:
  int64_t groups_;
};

}  // namespace

int main() {
  // 1. The registry: a name, a description, the options a spec may carry, and a factory.
  nmcmc::register_target({"neck", "tau ~ N(0,1), theta_i ~ N(0, exp(tau))", {{"groups", "number of theta_i (4)"}}},
                         [](const nlohmann::json& spec, torch::TensorOptions options) -> std::unique_ptr<nmcmc::Target> {
                           const int64_t groups = spec.value("groups", int64_t{4});
                           if (groups < 1) throw nmcmc::UsageError("neck: groups must be at least 1");
                           return std::make_unique<Neck>(groups, options);
                         });

  // 2. A training config, as configs/*.json hold them, naming the registered target.
  nlohmann::json cfg = {
      {"name", "neck"},
      {"target", {{"name", "neck"}, {"groups", 4}}},
      {"model", {{"hidden", 64}, {"steps", 1}, {"eps", 0.2}}},
      {"train", {{"steps", 600}, {"batch", 256}, {"lr", 1e-3}, {"checkpoint_every", 200}, {"seed", 3}}}};
  nmcmc::TrainConfig config = nmcmc::parse_train_config(cfg);
  nmcmc::TrainResult trained = nmcmc::train(config, torch::kCPU, "neck_model.pt", "neck_training_log.csv", /*resume=*/true);
  std::cout << "trained " << trained.steps << " steps (" << trained.grads << " target gradients per batch row), final accept "
            << trained.log.back().accept << ", step size " << trained.log.back().eps << "\n";

  // 3. Sample: the trained proposal inside the one Metropolis-Hastings kernel.
  nmcmc::LearnedRun run = nmcmc::load_learned_run("neck_model.pt", std::nullopt, torch::kFloat32, false);
  auto target = nmcmc::make_target(run.target_spec, run.options);
  nmcmc::MetropolisHastings kernel(run.proposal);
  auto options = nmcmc::RunOptions().set_chains(32).set_warmup(200).set_draws(2000).set_init("zero");
  nmcmc::SampleResult result = nmcmc::run_sampler(*target, kernel, options, /*seed=*/1);
  nlohmann::json summary = nmcmc::summarise(result, *target);
  std::cout << nmcmc::format_summary(summary);

  // The exact sds: tau 1; theta_i: Var = E[exp(tau)] = exp(1/2).
  const double exact_sd_theta = std::exp(0.25);
  bool ok = summary["max_rhat"].get<double>() < 1.05;
  for (const auto& p : summary["parameters"]) {
    const bool is_tau = p["name"] == "x.1";
    const double sd = p["sd"].get<double>(), expected = is_tau ? 1.0 : exact_sd_theta;
    const double mean_z = std::abs(p["mean"].get<double>()) / p["mcse_mean"].get<double>();
    std::cout << p["name"].get<std::string>() << ": mean " << p["mean"].get<double>() << " (exact 0, " << mean_z
              << " MCSE away), sd " << sd << " (exact " << expected << ")\n";
    ok = ok && mean_z < 4.0 && std::abs(sd / expected - 1.0) < 0.15;
  }
  std::cout << (ok ? "moments agree with the exact ones\n" : "MOMENTS DISAGREE\n");
  return ok ? 0 : 1;
}
