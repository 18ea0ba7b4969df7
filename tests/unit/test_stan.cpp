// Stan programs as targets (Note [Stan programs]): the build and its cache, the syntax translation,
// the density against a hand-written one, its gradient and second derivatives, constrain and
// unconstrain, failures, and one posterior against posteriordb's reference.
//
// One program (tests/data/stan/schools.stan) is compiled once per build tree (about a minute on
// 2 vCPUs) into build/stan-cache; every later test process loads it from there.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/kernels/factory.hpp"
#include "nmcmc/process/stan_build.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/stan.hpp"
#include "nmcmc/targets/targets.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kSource = NMCMC_SOURCE_DIR;
const std::string kProgram = kSource + "/tests/data/stan/schools.stan";
const std::string kData = kSource + "/posteriordb/data/eight_schools.json";

nmcmc::StanBuildOptions build_options() {
  nmcmc::StanBuildOptions o = nmcmc::stan_build_options_from_environment();
  o.cache_dir = NMCMC_TEST_STAN_CACHE;
  return o;
}

/// The schools target with the builder registered (the program is built once per build tree).
std::unique_ptr<nmcmc::StanTarget> schools(const std::string& data = kData) {
  const nmcmc::StanBuildOptions o = build_options();
  nmcmc::set_stan_builder([o](const std::string& program) { return nmcmc::build_stan_program(program, o); });
  json spec = {{"name", "stan"}, {"program", kProgram}, {"data", data}};
  std::unique_ptr<nmcmc::Target> t = nmcmc::make_target(spec, torch::TensorOptions().dtype(torch::kFloat64));
  return std::unique_ptr<nmcmc::StanTarget>(dynamic_cast<nmcmc::StanTarget*>(t.release()));
}

/// The same density written by hand on the unconstrained scale (x = theta_trans[8], mu, log tau),
/// constants dropped: what Stan's `~` statements with the log-Jacobian of tau = exp(x) make.
torch::Tensor hand_energy(const torch::Tensor& x) {
  const torch::Tensor y = torch::tensor({28., 8., -3., 7., -1., 1., 18., 12.}, torch::kFloat64);
  const torch::Tensor sigma = torch::tensor({15., 10., 16., 11., 9., 11., 10., 18.}, torch::kFloat64);
  const torch::Tensor tt = x.narrow(1, 0, 8), mu = x.select(1, 8), log_tau = x.select(1, 9);
  const torch::Tensor tau = log_tau.exp();
  const torch::Tensor theta = tt * tau.unsqueeze(1) + mu.unsqueeze(1);
  return 0.5 * (tt * tt).sum(1) + 0.5 * ((y - theta) / sigma).pow(2).sum(1) + 0.5 * (mu / 5).pow(2) +
         torch::log1p((tau / 5).pow(2)) - log_tau;
}

torch::Tensor points(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({n, 10}, torch::kFloat64) * 1.5;
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST(StanSyntax, CurrentArraysBecome221DeclarationsLineForLine) {
  const std::string in =
      "data {\n  int<lower=0> N;\n  array[N] real y;\n  array[N, 2] int<lower=0, upper=1> z;\n"
      "  array[N] vector<lower=0>[3] v;\n  array[N] array[2] real w;\n}\n"
      "functions {\n  array[] real f(array[] real a, data array[,] int b) { return a; }\n}\n"
      "model {\n  array[N] real m = y; // array[N] real in a comment stays\n  y ~ normal_lupdf(0, 1);\n"
      "  profile(\"lik\") { target += poisson_lupmf(z[1] | 3); }\n  int k = N %/% 2;\n}\n";
  const std::string out = nmcmc::translate_stan_syntax(in, "t.stan");
  EXPECT_NE(out.find("  real y[N];\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  int<lower=0, upper=1> z[N, 2];\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  vector<lower=0>[3] v[N];\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  real w[N, 2];\n"), std::string::npos) << out;
  EXPECT_NE(out.find("real[] f(real[] a, data int[,] b)"), std::string::npos) << out;
  EXPECT_NE(out.find("  real m[N] = y; // array[N] real in a comment stays\n"), std::string::npos) << out;
  EXPECT_NE(out.find("normal_lpdf(0, 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("poisson_lpmf(z[1] | 3)"), std::string::npos) << out;
  EXPECT_EQ(out.find("profile"), std::string::npos) << out;
  EXPECT_NE(out.find("int k = N / 2;"), std::string::npos) << out;
  EXPECT_EQ(std::count(in.begin(), in.end(), '\n'), std::count(out.begin(), out.end(), '\n'));
  // A program in 2.21's own syntax passes unchanged.
  const std::string old = "data { int N; real y[N]; }\nparameters { real mu; }\nmodel { y ~ normal(mu, 1); }\n";
  EXPECT_EQ(nmcmc::translate_stan_syntax(old, "o.stan"), old);
}

TEST(StanSyntax, WhatStan221CannotExpressIsRefusedWithItsLine) {
  try {
    nmcmc::translate_stan_syntax("parameters {\n  real x;\n  complex z;\n}\n", "c.stan");
    FAIL() << "complex accepted";
  } catch (const nmcmc::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("c.stan line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nmcmc::translate_stan_syntax("model {\n  jacobian += 1;\n}\n", "j.stan"), nmcmc::DataError);
}

TEST(Stan, NamesAndDimensionsAreStans) {
  auto t = schools();
  ASSERT_EQ(t->dim(), 10);
  const auto unc = t->parameter_names();
  ASSERT_EQ(unc.size(), 10u);
  EXPECT_EQ(unc[0], "theta_trans.1");
  EXPECT_EQ(unc[8], "mu");
  EXPECT_EQ(unc[9], "tau");
  const auto all = t->constrained_names(true, true);
  ASSERT_EQ(all.size(), 26u);  // 10 parameters, theta[8], y_rep[8]
  EXPECT_EQ(all[10], "theta.1");
  EXPECT_EQ(all[25], "y_rep.8");
  EXPECT_EQ(t->constrained_names(false, false).size(), 10u);
  EXPECT_EQ(t->model_name(), "schools");
}

TEST(Stan, EnergyIsTheHandWrittenDensityUpToAConstant) {
  auto t = schools();
  const torch::Tensor x = points(16, 1);
  const torch::Tensor u = t->energy(x), h = hand_energy(x);
  const torch::Tensor offset = u - h;  // Stan drops the same constants at every point
  EXPECT_LT((offset - offset[0]).abs().max().item<double>(), 1e-10) << offset;
  // lp with constants kept and without the Jacobian differs by exactly the Jacobian term.
  const torch::Tensor with_j = t->log_density(x, true, false), without_j = t->log_density(x, false, false);
  EXPECT_LT((with_j - without_j - x.select(1, 9)).abs().max().item<double>(), 1e-10);
}

TEST(Stan, GradientAgreesWithFiniteDifferences) {
  auto t = schools();
  const torch::Tensor x = points(6, 2);
  const nmcmc::EnergyGrad eg = t->energy_and_grad(x);
  const double h = 1e-6;
  for (int64_t k = 0; k < 10; ++k) {
    torch::Tensor e = torch::zeros_like(x);
    e.select(1, k).fill_(h);
    const torch::Tensor fd = (t->energy(x + e) - t->energy(x - e)) / (2 * h);
    EXPECT_LT((fd - eg.grad.select(1, k)).abs().max().item<double>(), 1e-5 * (1 + fd.abs().max().item<double>()))
        << "coordinate " << k;
  }
  // And the hand-written density's autograd gradient, exactly.
  torch::Tensor xr = x.clone().requires_grad_(true);
  const torch::Tensor g = torch::autograd::grad({hand_energy(xr).sum()}, {xr})[0];
  EXPECT_LT((g - eg.grad).abs().max().item<double>(), 1e-10);
}

TEST(Stan, SecondDerivativesForTrainingMatchTheExactHessian) {
  // Note [Native second derivatives]: training's double backward through grad U.
  auto t = schools();
  const torch::Tensor x0 = points(5, 3);
  torch::manual_seed(4);
  const torch::Tensor v = torch::randn({5, 10}, torch::kFloat64);
  torch::Tensor x = x0.clone().requires_grad_(true);
  const nmcmc::EnergyGrad eg = t->energy_and_grad(x, /*create_graph=*/true);
  const torch::Tensor hv = torch::autograd::grad({(eg.grad * v).sum()}, {x})[0];
  torch::Tensor xr = x0.clone().requires_grad_(true);
  const torch::Tensor g = torch::autograd::grad({hand_energy(xr).sum()}, {xr}, {}, true, true)[0];
  const torch::Tensor exact = torch::autograd::grad({(g * v).sum()}, {xr})[0];
  EXPECT_LT((hv - exact).abs().max().item<double>(), 1e-5 * (1 + exact.abs().max().item<double>()));
}

TEST(Stan, RowsSplitOverThreadsGiveTheSameBits) {
  // Note [Stan rows in threads]: a 512-row batch saves far more by a split than the split adds.
  schools();  // registers the builder
  const auto with_threads = [](int threads) {
    json spec = {{"name", "stan"}, {"program", kProgram}, {"data", kData}, {"threads", threads}};
    auto t = nmcmc::make_target(spec, torch::TensorOptions().dtype(torch::kFloat64));
    return std::unique_ptr<nmcmc::StanTarget>(dynamic_cast<nmcmc::StanTarget*>(t.release()));
  };
  auto one = with_threads(1), two = with_threads(2);
  const torch::Tensor x = points(512, 8);
  for (int call = 0; call < 5; ++call) {  // the first calls measure the rows' cost
    const nmcmc::EnergyGrad a = one->energy_and_grad(x), b = two->energy_and_grad(x);
    EXPECT_TRUE(torch::equal(a.energy, b.energy));
    EXPECT_TRUE(torch::equal(a.grad, b.grad));
  }
  EXPECT_EQ(one->split_calls(), 0);
  EXPECT_GT(two->split_calls(), 0);  // the rows did run in two threads
  // Two rows of eight schools (about 10 us each) save less than a split adds: never split (the
  // 64th call would, to measure the split again).
  auto cheap = with_threads(2);
  const torch::Tensor y = points(2, 9);
  for (int call = 0; call < 60; ++call) cheap->energy_and_grad(y);
  EXPECT_EQ(cheap->split_calls(), 0);
}

TEST(Stan, ConstrainAndUnconstrainAreInverse) {
  auto t = schools();
  const torch::Tensor x = points(8, 5);
  const torch::Tensor c = t->constrain(x, true, false, 1);  // [8, 18]: parameters and theta
  ASSERT_EQ(c.size(1), 18);
  EXPECT_LT((c.select(1, 9) - x.select(1, 9).exp()).abs().max().item<double>(), 1e-12);  // tau = exp(x)
  const torch::Tensor theta = x.narrow(1, 0, 8) * x.select(1, 9).exp().unsqueeze(1) + x.select(1, 8).unsqueeze(1);
  EXPECT_LT((c.narrow(1, 10, 8) - theta).abs().max().item<double>(), 1e-12);
  EXPECT_LT((t->unconstrain(c.narrow(1, 0, 10)) - x).abs().max().item<double>(), 1e-12);
  // A value outside the support is refused.
  torch::Tensor bad = c.narrow(1, 0, 10).clone();
  bad.select(1, 9).fill_(-1.0);
  EXPECT_THROW(t->unconstrain(bad), nmcmc::DataError);
}

TEST(Stan, GeneratedQuantitiesAreSeededByTheDrawNotTheCall) {
  auto t = schools();
  const torch::Tensor x = points(6, 6);
  const torch::Tensor whole = t->constrain(x, true, true, 11);
  const torch::Tensor part = t->constrain(x.narrow(0, 3, 3), true, true, 11, /*first_row=*/3);
  EXPECT_TRUE(torch::equal(whole.narrow(0, 3, 3), part));
  const torch::Tensor other = t->constrain(x, true, true, 12);
  EXPECT_FALSE(torch::equal(whole.narrow(1, 18, 8), other.narrow(1, 18, 8)));  // y_rep: new numbers
  EXPECT_TRUE(torch::equal(whole.narrow(1, 0, 18), other.narrow(1, 0, 18)));   // the rest: the same
}

TEST(Stan, DomainErrorsAreRejectionsCountedAsFailures) {
  // sigma[1] = 0: normal(theta, sigma) raises a domain error at every point.
  const std::string data = temp_file("schools_zero.json",
                                     R"({"J": 8, "y": [28, 8, -3, 7, -1, 1, 18, 12], "sigma": [0, 10, 16, 11, 9, 11, 10, 18]})");
  auto t = schools(data);
  const nmcmc::EnergyGrad eg = t->energy_and_grad(points(3, 7));
  EXPECT_TRUE(torch::isnan(eg.energy).all().item<bool>());
  EXPECT_TRUE(torch::isnan(eg.grad).all().item<bool>());
  EXPECT_EQ(t->density_failures(), 3);
  EXPECT_NE(t->first_density_failure().find("Scale parameter"), std::string::npos) << t->first_density_failure();
}

TEST(Stan, DataErrorsNameTheVariable) {
  const auto expect_data_error = [](const std::string& text, const std::string& says) {
    try {
      schools(temp_file("schools_bad.json", text));
      FAIL() << "accepted " << text;
    } catch (const nmcmc::DataError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_data_error(R"({"J": 8, "sigma": [15, 10, 16, 11, 9, 11, 10, 18]})", "variable name=y");
  expect_data_error(R"({"J": 8, "y": [1, 2], "sigma": [15, 10, 16, 11, 9, 11, 10, 18]})", "dims declared=(8)");
  expect_data_error(R"({"J": 8.5, "y": [28, 8, -3, 7, -1, 1, 18, 12], "sigma": [15, 10, 16, 11, 9, 11, 10, 18]})",
                    "int variable contained non-int values");
  expect_data_error(R"({"J": 8, "y": [[1], [2, 3]], "sigma": []})", "ragged");
  expect_data_error("{not json", "not valid JSON");
}

TEST(Stan, AProgramThatDoesNotCompileSaysWhereAndIsNotCached) {
  const nmcmc::StanBuildOptions o = build_options();
  try {
    nmcmc::build_stan_program(kSource + "/tests/data/stan/bad.stan", o);
    FAIL() << "bad.stan compiled";
  } catch (const nmcmc::DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.stan"), std::string::npos) << m;
    EXPECT_NE(m.find("line 6"), std::string::npos) << m;
    EXPECT_NE(m.find("PARSER EXPECTED"), std::string::npos) << m;
  }
  for (const auto& entry : fs::directory_iterator(o.cache_dir)) {
    if (entry.path().filename().string().rfind("bad-", 0) == 0) EXPECT_FALSE(fs::exists(entry.path() / "bad.so"));
  }
}

TEST(Stan, WithoutStanInstalledOneMessageNamesThePackages) {
  nmcmc::StanBuildOptions o = build_options();
  o.r_libraries = {::testing::TempDir() + "no_r_packages_here"};
  try {
    nmcmc::build_stan_program(kProgram, o);
    FAIL() << "built without Stan";
  } catch (const nmcmc::ExitError& e) {
    EXPECT_EQ(e.code, nmcmc::kExitUnavailable);
    EXPECT_NE(std::string(e.what()).find("apt-get install r-cran-rstan r-cran-stanheaders"), std::string::npos) << e.what();
  }
}

TEST(Stan, ABuiltProgramIsReusedFromTheCache) {
  const nmcmc::StanBuildOptions o = build_options();
  const std::string first = nmcmc::build_stan_program(kProgram, o);
  const auto stamp = fs::last_write_time(first);
  EXPECT_EQ(nmcmc::build_stan_program(kProgram, o), first);
  EXPECT_EQ(fs::last_write_time(first), stamp);
  EXPECT_EQ(fs::path(first).filename(), "schools.so");
}

TEST(Stan, BuildFlagsOptimiseAndGiveTLSDescriptorsOnlyToGcc) {
  // Note [Stan's build flags]: -O3 for every compiler; the TLS dialect is GCC's option on x86-64.
  for (const char* cxx : {"g++", "/usr/bin/g++-12", "clang++", "/usr/bin/clang++-14"}) {
    EXPECT_EQ(nmcmc::default_stan_flags(cxx).rfind("-O3", 0), 0u) << cxx;
  }
  EXPECT_EQ(nmcmc::default_stan_flags("clang++").find("tls"), std::string::npos);
  EXPECT_EQ(nmcmc::default_stan_flags("/usr/bin/clang++-14").find("tls"), std::string::npos);
#if defined(__x86_64__)
  EXPECT_NE(nmcmc::default_stan_flags("/usr/bin/g++-12").find("-mtls-dialect=gnu2"), std::string::npos);
#endif
}

TEST(Stan, ACheckpointsTargetIsTheProgramWhicheverBuildRunsIt) {
  // A model trained on a Stan program is compared on what defines the density (density_of): the
  // program, its data and seed, not the library one build made of it nor the threads.
  const json trained = {{"name", "stan"}, {"program", "/p/m.stan"}, {"data", "/p/d.json"},
                        {"library", "/cache/m-1/m.so"}, {"threads", 0}};
  json rebuilt = trained;
  rebuilt["library"] = "/other-cache/m-2/m.so";
  rebuilt["threads"] = 1;
  EXPECT_EQ(nmcmc::density_of(trained), nmcmc::density_of(rebuilt));
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"program", "/p/n.stan"}, {"data", "/p/e.json"}, {"seed", 3}}) {
    json other = trained;
    other[key] = value;
    EXPECT_NE(nmcmc::density_of(trained), nmcmc::density_of(other)) << key;
  }
  // A spec that names only a library has nothing else to say what it is.
  const json bare = {{"name", "stan"}, {"library", "/cache/m-1/m.so"}};
  json bare_other = bare;
  bare_other["library"] = "/cache/m-2/m.so";
  EXPECT_NE(nmcmc::density_of(bare), nmcmc::density_of(bare_other));
  // A TorchScript module is its content: its location is left out; other targets are unchanged.
  EXPECT_EQ(nmcmc::density_of({{"name", "torchscript"}, {"module", "/a.pt"}, {"dim", 3}}),
            json({{"name", "torchscript"}, {"dim", 3}}));
  const json funnel = {{"name", "funnel"}, {"dim", 4}};
  EXPECT_EQ(nmcmc::density_of(funnel), funnel);
}

namespace {

/// The moment checks against posteriordb's reference (Stan, 10 x 10,000 thinned draws) on the
/// unconstrained scale: x [N, 10] (mu and theta_trans as drawn, log tau), with each coordinate's
/// bulk ESS. Each mean within 4.5 standard errors (ours by sd / sqrt(ESS), the reference's by its sd
/// over sqrt(its 10,000 draws)) and each sd within 4.5 of its standard error sd / sqrt(2 ESS): a
/// correct sampler fails one of the 20 checks with probability about 1.4e-4 (normal approximation).
/// Returns the checks that fail.
std::vector<std::string> reference_failures(const torch::Tensor& x, const std::vector<double>& ess) {
  std::ifstream in(kSource + "/posteriordb/reference/eight_schools-eight_schools_noncentered.json");
  const json ref = json::parse(in);
  std::vector<std::string> failed;
  for (int64_t k = 0; k < 10; ++k) {
    const double m = x.select(1, k).mean().item<double>(), s = x.select(1, k).std().item<double>();
    const double ref_m = ref["mean"][k].get<double>(), ref_s = ref["sd"][k].get<double>();
    const double ref_ess = 10000.0;  // thinned Stan draws: near independent
    const double se_m = std::sqrt(s * s / ess[k] + ref_s * ref_s / ref_ess);
    const double se_s = std::sqrt(s * s / (2 * ess[k]) + ref_s * ref_s / (2 * ref_ess));
    const std::string name = ref["names"][k].get<std::string>();
    if (std::abs(m - ref_m) > 4.5 * se_m) failed.push_back(fmt::format("{}: mean {} vs {}", name, m, ref_m));
    if (std::abs(s - ref_s) > 4.5 * se_s) failed.push_back(fmt::format("{}: sd {} vs {}", name, s, ref_s));
  }
  return failed;
}

/// A broken Stan target for the power check: the log density without the Jacobian of tau = exp(x).
class WithoutJacobian : public nmcmc::Target {
 public:
  explicit WithoutJacobian(nmcmc::StanTarget& stan) : Target(stan.options()), stan_(stan) {}
  std::string name() const override { return "stan without its Jacobian"; }
  int64_t dim() const override { return stan_.dim(); }
  json spec() const override { return stan_.spec(); }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override { return compute_energy_and_grad(x, false).energy; }
  nmcmc::EnergyGrad compute_energy_and_grad(const torch::Tensor& x, bool) const override {
    torch::Tensor lp, grad;
    std::string failure;
    stan_.evaluate(x, &lp, &grad, /*jacobian=*/false, /*propto=*/true, &failure);
    return {-lp, -grad};
  }

 private:
  nmcmc::StanTarget& stan_;
};

}  // namespace

// NUTS with warm-up through the whole sampling service (the --stan path: build, constrained
// outputs), against posteriordb's reference (reference_failures: false-fail rate about 1.4e-4).
TEST(Stan, NutsOnAStanProgramMatchesPosteriordbsReference) {
  const nmcmc::StanBuildOptions o = build_options();
  nmcmc::set_stan_builder([o](const std::string& program) { return nmcmc::build_stan_program(program, o); });
  nmcmc::SampleRequest request;
  request.target = {{"name", "stan"}, {"program", kProgram}, {"data", kData}};
  request.options.chains = 4;
  request.options.warmup = 1000;
  request.options.draws = 1000;
  request.options.seed = 3;
  request.options.target_accept = 0.95;  // as posteriordb's reference: the funnel of tau
  nmcmc::SampleOutcome out = nmcmc::sample(request);
  const nmcmc::SampleResult& r = out.result;
  ASSERT_EQ(r.names.size(), 26u);
  EXPECT_EQ(r.names[9], "tau");
  EXPECT_EQ(out.config["dtype"], "float64");
  ASSERT_LT(out.summary["max_rhat"].get<double>(), 1.01) << out.summary.dump();
  torch::Tensor x = r.draws.narrow(2, 0, 10).reshape({-1, 10}).clone();  // [S*C, 10], constrained
  x.select(1, 9).log_();
  std::vector<double> ess;
  for (int64_t k = 0; k < 10; ++k) ess.push_back(out.summary["parameters"][k]["ess_bulk"].get<double>());
  const auto failed = reference_failures(x, ess);
  EXPECT_TRUE(failed.empty()) << failed.front();
}

// Power: the same checks catch the density without its Jacobian (tau's posterior moves to 0).
TEST(Stan, ReferenceChecksCatchAMissingJacobian) {
  auto stan = schools();
  WithoutJacobian broken(*stan);
  std::unique_ptr<nmcmc::Kernel> nuts = nmcmc::make_baseline_kernel(nmcmc::ProposalOptions().set_sampler(nmcmc::SamplerKind::kNuts));
  nmcmc::RunOptions run;
  run.set_chains(4).set_warmup(1000).set_draws(1000).set_metric(nmcmc::MetricAdapt::kDiag).set_target_accept(0.95);
  const nmcmc::SampleResult r = nmcmc::run_sampler(broken, *nuts, run, 3);
  const torch::Tensor x = r.draws.reshape({-1, 10});
  // Its ESS, generously: the checks' standard errors only grow with a smaller one.
  EXPECT_FALSE(reference_failures(x, std::vector<double>(10, 4000.0)).empty());
}
