// A density of your own, sampled with nmcmc: a 2-d ring (a "donut"), U(x) = (|x| - 3)^2 / (2 * 0.1^2).
// Build against an installed nmcmc: find_package(nmcmc) and link nmcmc::nmcmc.
#include <nmcmc/services/sample.hpp>

#include <iostream>

class Ring : public nmcmc::Target {
 public:
  explicit Ring(torch::TensorOptions options) : Target(options) {}
  std::string name() const override { return "ring"; }
  int64_t dim() const override { return 2; }
  nlohmann::json spec() const override { return {{"name", "ring"}}; }

 protected:
  // x: [C, 2] -> U: [C]. Written with torch ops, so autograd supplies the gradient.
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    torch::Tensor r = x.norm(2, 1);
    return (r - 3.0).pow(2) / (2 * 0.1 * 0.1);
  }
};

int main() {
  Ring ring(torch::kFloat64);
  nmcmc::MetropolisHastings kernel(nmcmc::make_baseline_proposal(nmcmc::ProposalOptions().set_sampler(nmcmc::SamplerKind::kHmc).set_leapfrog(20)));
  auto options = nmcmc::RunOptions().set_chains(16).set_warmup(500).set_draws(1000);
  nmcmc::SampleResult result = nmcmc::run_sampler(ring, kernel, options, /*seed=*/1);
  nlohmann::json summary = nmcmc::summarise(result, ring);
  std::cout << nmcmc::format_summary(summary);
  // Radius of the draws: should be 3 (+- 0.1).
  torch::Tensor radius = result.draws.norm(2, 2);
  std::cout << "mean radius " << radius.mean().item<double>() << " (expected 3.00)\n";
  return std::abs(radius.mean().item<double>() - 3.0) < 0.05 ? 0 : 1;
}
