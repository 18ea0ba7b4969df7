// TorchScript densities: modules built here with torch::jit::Module::define (no Python needed),
// their energy and gradient against the formula, the attributes, every way a module can be
// unusable (one clear UsageError each), and densities that are NaN on part of the space.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <filesystem>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/torchscript.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "nmcmc_test_torchscript";
  fs::create_directories(dir);
  return (dir / name).string();
}

/// A module with `forward` given as TorchScript source; saved to a temporary file.
std::string save_module(const std::string& name, const std::string& forward_source,
                        const std::function<void(torch::jit::Module&)>& extra = nullptr) {
  torch::jit::Module m(name);
  if (extra) extra(m);
  m.define(forward_source);
  const std::string path = temp_path(name + ".pt");
  m.save(path);
  return path;
}

/// N(0, diag(1, 4, 0.25)) with a dim, names and reference moments.
std::string gaussian_module() {
  return save_module("gauss3",
                     "def forward(self, x):\n"
                     "    return 0.5 * ((x / self.scale) ** 2).sum(-1)\n",
                     [](torch::jit::Module& m) {
                       m.register_buffer("scale", torch::tensor({1.0, 2.0, 0.5}));
                       m.register_attribute("dim", c10::IntType::get(), int64_t{3});
                       m.register_attribute("names", c10::ListType::ofStrings(),
                                            c10::List<std::string>({"mu", "log_tau", "theta"}));
                       m.register_attribute("ref_mean", c10::TensorType::get(), torch::zeros({3}));
                       m.register_attribute("ref_sd", c10::TensorType::get(), torch::tensor({1.0, 2.0, 0.5}));
                     });
}

void expect_usage_error(const json& spec, const std::string& fragment) {
  try {
    make_target(spec, kF64);
    ADD_FAILURE() << "no error for " << spec.dump();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(TorchScript, EnergyGradientAndAttributes) {
  auto t = make_target({{"name", "torchscript"}, {"module", gaussian_module()}}, kF64);
  EXPECT_EQ(t->dim(), 3);
  EXPECT_EQ(t->parameter_names(), (std::vector<std::string>{"mu", "log_tau", "theta"}));
  EXPECT_EQ(parameter_labels(*t), t->parameter_names());
  ASSERT_TRUE(t->reference_moments().has_value());
  EXPECT_TRUE(torch::allclose(t->reference_moments()->sd, torch::tensor({1.0, 2.0, 0.5}, kF64)));
  EXPECT_EQ(t->spec()["output"], "energy");
  EXPECT_TRUE(fs::path(t->spec()["module"].get<std::string>()).is_absolute());

  at::Generator gen = make_generator(3);
  torch::Tensor x = torch::randn({5, 3}, gen, kF64);
  torch::Tensor scale = torch::tensor({1.0, 2.0, 0.5}, kF64);
  EnergyGrad eg = t->energy_and_grad(x);
  EXPECT_TRUE(torch::allclose(eg.energy, 0.5 * (x / scale).pow(2).sum(-1)));
  EXPECT_TRUE(torch::allclose(eg.grad, x / scale.pow(2)));

  // Training differentiates the gradient again (the entropy objective's double backward).
  torch::Tensor w = torch::ones({5, 3}, kF64).requires_grad_(true);
  EnergyGrad g2 = t->energy_and_grad(x * w, /*create_graph=*/true);
  torch::Tensor dw = torch::autograd::grad({g2.grad.sum()}, {w})[0];
  EXPECT_TRUE(torch::allclose(dw, x / scale.pow(2)));

  // The spec recreates the target; the dtype follows the options (module converted).
  auto t32 = make_target(t->spec(), torch::TensorOptions().dtype(torch::kFloat32));
  EXPECT_EQ(t32->energy(x.to(torch::kFloat32)).scalar_type(), torch::kFloat32);
}

TEST(TorchScript, LogProbOutputAndDimFromTheSpec) {
  const std::string path = save_module("logp", "def forward(self, x):\n    return -0.5 * (x * x).sum(-1)\n");
  expect_usage_error({{"name", "torchscript"}, {"module", path}}, "has no 'dim' attribute");
  auto t = make_target({{"name", "torchscript"}, {"module", path}, {"dim", 4}, {"output", "log_prob"}}, kF64);
  torch::Tensor x = torch::ones({2, 4}, kF64);
  EXPECT_TRUE(torch::allclose(t->energy(x), torch::full({2}, 2.0, kF64)));
  EXPECT_EQ(parameter_labels(*t), (std::vector<std::string>{"x.1", "x.2", "x.3", "x.4"}));
  expect_usage_error({{"name", "torchscript"}, {"module", gaussian_module()}, {"dim", 4}}, "has dim 3 but the spec says 4");
  expect_usage_error({{"name", "torchscript"}, {"module", path}, {"dim", 0}}, "'dim' must be a positive integer");
  expect_usage_error({{"name", "torchscript"}, {"module", path}, {"dim", 2}, {"output", "logp"}}, "'output' must be");
}

TEST(TorchScript, EveryUnusableModuleGetsOneClearMessage) {
  const json base = {{"name", "torchscript"}, {"dim", 2}};
  auto with = [&](const std::string& path) {
    json s = base;
    s["module"] = path;
    return s;
  };
  expect_usage_error(with(temp_path("absent.pt")), "does not exist");
  {
    const std::string junk = temp_path("junk.pt");
    std::ofstream(junk) << "not a zip archive";
    expect_usage_error(with(junk), "is not a TorchScript module");
  }
  expect_usage_error({{"name", "torchscript"}}, "give the module file");
  expect_usage_error(with(save_module("scalar", "def forward(self, x):\n    return (x * x).sum()\n")),
                     "returned shape [] (sum over the features only");
  expect_usage_error(with(save_module("column", "def forward(self, x):\n    return (x * x).sum(-1, keepdim=True)\n")),
                     "(use .squeeze(-1))");
  expect_usage_error(with(save_module("detached", "def forward(self, x):\n    return (x.detach() ** 2).sum(-1)\n")),
                     "does not depend on x differentiably");
  expect_usage_error(with(save_module("raises", "def forward(self, x):\n    assert bool((x > 100.0).all()), 'my model is broken'\n"
                                                "    return x.sum(-1)\n")),
                     "forward failed on a [3, 2] Double batch");
  expect_usage_error(with(save_module("shapes", "def forward(self, x):\n    return (x @ torch.ones(5)).sum(-1)\n")),
                     "forward failed");
  expect_usage_error(with(save_module("float32", "def forward(self, x):\n    return (x * x).sum(-1).float()\n")),
                     "forward returned Float for a Double input");
  expect_usage_error(with(save_module("tuple", "def forward(self, x):\n    return (x.sum(-1), x)\n")),
                     "must return a Tensor");
  // Rows that depend on each other: each sampler takes row i's energy as U(x_i).
  expect_usage_error(with(save_module("batchmean", "def forward(self, x):\n    return 0.5 * (x * x).sum(1) + x.mean()\n")),
                     "the energy of a row depends on the other rows of the batch");
  expect_usage_error(with(save_module("batchsize", "def forward(self, x):\n    return 0.5 * (x * x).sum(1) * x.shape[0]\n")),
                     "the energy of a row depends on the other rows");
  expect_usage_error(with(save_module("badnames", "def forward(self, x):\n    return (x * x).sum(-1)\n",
                                      [](torch::jit::Module& m) {
                                        m.register_attribute("names", c10::ListType::ofStrings(),
                                                             c10::List<std::string>({"a,b", "c"}));
                                      })),
                     "'names' must be a List[str]");
  expect_usage_error(with(save_module("halfref", "def forward(self, x):\n    return (x * x).sum(-1)\n",
                                      [](torch::jit::Module& m) {
                                        m.register_attribute("ref_mean", c10::TensorType::get(), torch::zeros({2}));
                                      })),
                     "give both 'ref_mean' and 'ref_sd'");
}

TEST(TorchScript, ModulesFromMemory) {
  torch::jit::Module m("mem");
  m.register_attribute("dim", c10::IntType::get(), int64_t{2});
  m.define("def forward(self, x):\n    return 0.5 * (x * x).sum(-1)\n");
  std::ostringstream bytes;
  m.save(bytes);
  const std::string key = register_torchscript_module(bytes.str());
  EXPECT_EQ(key.rfind("memory:", 0), 0u);
  auto t = make_target({{"name", "torchscript"}, {"module", key}}, kF64);
  EXPECT_EQ(t->dim(), 2);
  expect_usage_error({{"name", "torchscript"}, {"module", "memory:999999"}}, "in this process");
  EXPECT_THROW(register_torchscript_module("garbage"), UsageError);
}

// A log-normal x0 (U = log x0 + log(x0)^2 / 2, NaN for x0 <= 0) times N(0, 1): NaN on half of the
// starting box and on every proposal that crosses zero. Every sampler must reject those (counted
// as divergences), keep NaN out of the chains and sample the right law: log x0 ~ N(0, 1).
// 4 chains x 4000 (MALA), 2000 (HMC), 1000 (NUTS) draws: bulk-ESS of log x0 about 470, 1300, 400;
// the bounds (|mean| < 0.2, |sd - 1| < 0.2) are at least 4 Monte-Carlo standard errors, so the
// false-fail rate is below 1e-4 per check; a kernel that
// let NaN energies through would put x0 <= 0 into the chains and fail the first check.
TEST(TorchScript, NanOnPartOfTheSpaceIsRejectedAndCountedAsDivergence) {
  const std::string path = save_module(
      "halfnan", "def forward(self, x):\n"
                 "    l = torch.log(x[:, 0])\n"
                 "    return l + 0.5 * l * l + 0.5 * (x[:, 1:] ** 2).sum(-1)\n");
  auto t = make_target({{"name", "torchscript"}, {"module", path}, {"dim", 2}}, kF64);
  for (const std::string sampler : {"mala", "hmc", "nuts"}) {
    auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(parse_enum<SamplerKind>(sampler)));
    RunOptions o;
    o.set_chains(4).set_warmup(300).set_draws(sampler == "mala" ? 4000 : sampler == "hmc" ? 2000 : 1000);
    SampleResult r = run_sampler(*t, *kernel, o, 11);
    EXPECT_TRUE(torch::isfinite(r.draws).all().item<bool>()) << sampler;
    EXPECT_TRUE(torch::isfinite(r.lp).all().item<bool>()) << sampler;
    torch::Tensor x0 = r.draws.select(2, 0);
    ASSERT_TRUE((x0 > 0).all().item<bool>()) << sampler;
    EXPECT_GT(r.divergent.sum().item<int64_t>(), 0) << sampler;
    torch::Tensor l = x0.log();
    EXPECT_LT(std::abs(l.mean().item<double>()), 0.2) << sampler;
    EXPECT_LT(std::abs(l.std().item<double>() - 1.0), 0.2) << sampler;
  }
}

// Note [A density may fail]: a density that raises where x0 <= 0 (as a Cholesky factorisation
// raises where a kernel matrix is not positive definite) is sampled as the one above that is NaN
// there: the failing rows are rejected (divergences), the moments are right, and the summary's
// count and message say so. Before, the first such point ended the run ("internal error").
TEST(TorchScript, RaisingOnPartOfTheSpaceIsRejectedLikeNan) {
  const std::string path = save_module(
      "halfraise", "def forward(self, x):\n"
                   "    assert bool((x[:, 0] > 0).all()), 'x0 must be positive'\n"
                   "    l = torch.log(x[:, 0])\n"
                   "    return l + 0.5 * l * l + 0.5 * (x[:, 1:] ** 2).sum(-1)\n");
  for (const std::string sampler : {"mala", "hmc", "nuts"}) {
    auto t = make_target({{"name", "torchscript"}, {"module", path}, {"dim", 2}}, kF64);
    auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(parse_enum<SamplerKind>(sampler)));
    RunOptions o;
    o.set_chains(4).set_warmup(300).set_draws(sampler == "mala" ? 4000 : sampler == "hmc" ? 2000 : 1000);
    SampleResult r = run_sampler(*t, *kernel, o, 11);
    EXPECT_TRUE(torch::isfinite(r.draws).all().item<bool>()) << sampler;
    torch::Tensor x0 = r.draws.select(2, 0);
    ASSERT_TRUE((x0 > 0).all().item<bool>()) << sampler;
    EXPECT_GT(r.divergent.sum().item<int64_t>(), 0) << sampler;
    EXPECT_GT(t->density_failures(), 0) << sampler;
    EXPECT_NE(t->first_density_failure().find("x0 must be positive"), std::string::npos) << t->first_density_failure();
    torch::Tensor l = x0.log();
    EXPECT_LT(std::abs(l.mean().item<double>()), 0.2) << sampler;
    EXPECT_LT(std::abs(l.std().item<double>() - 1.0), 0.2) << sampler;
  }
  // Row by row: in a batch with one failing row the others keep their values.
  auto t = make_target({{"name", "torchscript"}, {"module", path}, {"dim", 2}}, kF64);
  torch::Tensor x = torch::tensor({{1.5, 0.3}, {-1.0, 0.0}, {0.5, -0.2}}, kF64);
  EnergyGrad eg = t->energy_and_grad(x);
  EXPECT_TRUE(std::isnan(eg.energy[1].item<double>()));
  EXPECT_TRUE(torch::isnan(eg.grad[1]).all().item<bool>());
  EnergyGrad good = t->energy_and_grad(x.index_select(0, torch::tensor({0, 2})));
  EXPECT_TRUE(torch::allclose(eg.energy.index_select(0, torch::tensor({0, 2})), good.energy));
  EXPECT_TRUE(torch::allclose(eg.grad.index_select(0, torch::tensor({0, 2})), good.grad));
  EXPECT_EQ(t->energy_evals(), 2);  // a batch counts once, row by row or not
  // A density that raises everywhere cannot be sampled: the message says what it raised.
  const std::string nowhere = save_module("nowhere", "def forward(self, x):\n"
                                                      "    assert bool((x > 1e300).all()), 'no support'\n"
                                                      "    return x.sum(-1)\n");
  try {  // refused when loaded: it raised at every probe point
    make_target({{"name", "torchscript"}, {"module", nowhere}, {"dim", 2}}, kF64);
    ADD_FAILURE() << "a module that raises everywhere must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no support"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at zero and at 20 random points"), std::string::npos) << e.what();
  }
}

TEST(TorchScript, StartingPointsOutsideTheSupport) {
  // Finite only for x0 > 1: uniform(-2, 2) starts are drawn again (Stan's rule) and succeed;
  // a given starting point outside the support is refused, never replaced.
  const std::string path = save_module(
      "narrow", "def forward(self, x):\n    return torch.log(x[:, 0] - 1.0) * 0.0 + 0.5 * (x * x).sum(-1)\n");
  auto t = make_target({{"name", "torchscript"}, {"module", path}, {"dim", 2}}, kF64);
  at::Generator gen = make_generator(5);
  torch::Tensor x0 = finite_starting_points(*t, initial_positions(*t, "uniform", 8, gen), "uniform", gen);
  EXPECT_TRUE((x0.select(1, 0) > 1.0).all().item<bool>());
  EXPECT_THROW(finite_starting_points(*t, torch::zeros({2, 2}, kF64), "", gen), UsageError);
  auto kernel = make_baseline_kernel(ProposalOptions().set_sampler(SamplerKind::kMala));
  RunOptions o;
  o.set_chains(2).set_warmup(5).set_draws(5).set_init_x(torch::zeros({1, 2}, kF64));
  EXPECT_THROW(run_sampler(*t, *kernel, o, 1), UsageError);
}
