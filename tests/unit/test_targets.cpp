// Targets: gradients against finite differences (float64), analytic against autograd,
// exact samplers against true moments, numerical guards, data loading.
#include <gtest/gtest.h>

#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {

struct GradCase {
  json spec;
  double spread;  // scale of the random test points
};

std::vector<GradCase> grad_cases() {
  return {
      {{{"name", "icg"}, {"dim", 10}}, 1.0},
      {{{"name", "scg"}}, 3.0},
      {{{"name", "rotated_icg"}, {"dim", 8}, {"seed", 3}}, 1.0},
      {{{"name", "spiked"}, {"dim", 7}, {"spikes", 2}, {"spike_sd", 4}}, 2.0},
      {{{"name", "funnel"}, {"dim", 20}, {"sigma", 3}}, 1.0},
      {{{"name", "funnel"}, {"dim", 100}, {"sigma", 1}}, 0.5},
      {{{"name", "moon"}}, 2.0},
      {{{"name", "logistic"}, {"dataset", "german"}}, 0.5},
      {{{"name", "logistic"}, {"dataset", "australian"}}, 0.5},
      {{{"name", "logistic"}, {"dataset", "heart"}}, 0.5},
      {{{"name", "gaussian"}, {"scales", {0.5, 2.0, 7.0}}}, 1.0},
  };
}
}  // namespace

TEST(Targets, GradientsMatchFiniteDifferences) {
  at::Generator gen = make_generator(11);
  for (const auto& c : grad_cases()) {
    auto t = make_target(c.spec, kF64);
    torch::Tensor x = torch::randn({5, t->dim()}, gen, kF64) * c.spread;
    auto eg = t->energy_and_grad(x);
    torch::Tensor fd = test_support::finite_difference_grad(*t, x);
    const double scale = 1.0 + eg.grad.abs().max().item<double>();
    EXPECT_LT((eg.grad - fd).abs().max().item<double>() / scale, 1e-6) << c.spec.dump();
    // Analytic gradients (where implemented) agree with autograd.
    auto ag = autograd_energy_and_grad([&](const torch::Tensor& y) { return t->energy(y); }, x, false);
    EXPECT_LT((eg.grad - ag.grad).abs().max().item<double>() / scale, 1e-10) << c.spec.dump();
    EXPECT_LT((eg.energy - ag.energy).abs().max().item<double>(), 1e-9) << c.spec.dump();
  }
}

TEST(Targets, FunnelNeckAndSaturatedLogisticGradients) {
  auto funnel = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 3}}, kF64);
  // Deep in the neck (x0 = 7: conditional sd exp(-3.5) ~ 0.03) and high in the base (x0 = -6).
  torch::Tensor x = torch::tensor({{7.0, 0.01, -0.02, 0.03, 0.0}, {-6.0, 15.0, -8.0, 3.0, 20.0}}, kF64);
  auto eg = funnel->energy_and_grad(x);
  torch::Tensor fd = test_support::finite_difference_grad(*funnel, x, 1e-7);
  EXPECT_LT(((eg.grad - fd).abs() / (1 + eg.grad.abs())).max().item<double>(), 1e-5);

  // Saturated logistic regression: |b| = 30 makes every sigmoid 0 or 1 to machine precision.
  auto logistic = make_target({{"name", "logistic"}, {"dataset", "australian"}}, kF64);
  at::Generator gen = make_generator(5);
  torch::Tensor b = torch::randn({3, logistic->dim()}, gen, kF64) * 30.0;
  auto lg = logistic->energy_and_grad(b);
  EXPECT_TRUE(torch::isfinite(lg.energy).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(lg.grad).all().item<bool>());
  torch::Tensor lfd = test_support::finite_difference_grad(*logistic, b, 1e-5);
  EXPECT_LT(((lg.grad - lfd).abs() / (1 + lg.grad.abs())).max().item<double>(), 1e-5);
  // In float32 too: stable log-sigmoid never produces NaN or inf.
  auto l32 = make_target({{"name", "logistic"}, {"dataset", "australian"}}, torch::kFloat32);
  auto lg32 = l32->energy_and_grad(b.to(torch::kFloat32) * 10);
  EXPECT_TRUE(torch::isfinite(lg32.energy).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(lg32.grad).all().item<bool>());
}

TEST(Targets, FunnelOverflowGuard) {
  auto f = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 3}}, torch::kFloat32);
  torch::Tensor x = torch::tensor({{500.0f, 0.0f, 0.0f, 0.0f}, {500.0f, 1.0f, 1.0f, 1.0f}, {-500.0f, 1.0f, 2.0f, 3.0f}});
  auto eg = f->energy_and_grad(x);
  EXPECT_FALSE(torch::isnan(eg.energy).any().item<bool>());
  EXPECT_FALSE(torch::isnan(eg.grad).any().item<bool>());
  // Where it matters the density is untouched: at x0 = 3 the float32 energy matches float64.
  auto f64 = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 3}}, kF64);
  torch::Tensor y = torch::tensor({{3.0, 0.1, -0.2, 0.05}}, kF64);
  EXPECT_NEAR(f->energy(y.to(torch::kFloat32)).item<double>(), f64->energy(y).item<double>(), 1e-5);
}

// Note [The funnel's rows]: a contiguous CPU batch without autograd takes the row loop (the funnel,
// the axis-aligned Gaussians), any other batch the tensor formula; both must give the same U and
// dU (float32: to its rounding).
TEST(Targets, RowLoopsMatchTheTensorFormula) {
  at::Generator gen = make_generator(21);
  const std::vector<json> specs = {{{"name", "funnel"}, {"dim", 30}, {"sigma", 2}},
                                   {{"name", "icg"}, {"dim", 30}},
                                   {{"name", "gaussian"}, {"scales", std::vector<double>(30, 0.7)}}};
  for (const json& spec : specs) {
    for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
      auto f = make_target(spec, dtype);
      torch::Tensor x = (torch::randn({30, 9}, gen, kF64) * 2.0).to(dtype).t();  // [9, 30], not contiguous
      if (spec["name"] == "funnel") x.select(1, 0)[0] = 85.0;  // beyond the exp cap: dU/dx0 without exp's derivative
      ASSERT_FALSE(x.is_contiguous());
      auto by_tensors = f->energy_and_grad(x);
      auto by_rows = f->energy_and_grad(x.contiguous());
      const double tol = dtype == torch::kFloat64 ? 1e-13 : 1e-6;
      auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
        return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs() / (1.0 + b.to(torch::kFloat64).abs())).max().item<double>();
      };
      EXPECT_EQ(by_rows.energy.scalar_type(), dtype);
      EXPECT_EQ(by_rows.grad.scalar_type(), dtype);
      EXPECT_LT(rel(by_rows.energy, by_tensors.energy), tol) << spec.dump() << dtype;
      EXPECT_LT(rel(by_rows.grad, by_tensors.grad), tol) << spec.dump() << dtype;
    }
  }
}

TEST(Targets, ExactSamplersMatchTrueMoments) {
  at::Generator gen = make_generator(7);
  for (json spec : {json{{"name", "icg"}}, json{{"name", "scg"}}, json{{"name", "rotated_icg"}},
                    json{{"name", "spiked"}, {"dim", 40}, {"spikes", 3}, {"spike_sd", 10}},
                    json{{"name", "funnel"}, {"dim", 20}, {"sigma", 1}}, json{{"name", "moon"}}}) {
    auto t = make_target(spec, kF64);
    const int64_t n = 400000;
    torch::Tensor x = t->sample(n, gen);
    auto m = t->reference_moments();
    ASSERT_TRUE(m.has_value());
    // Standard errors: sd/sqrt(n) for the mean, ~ sd*sqrt(kurtosis-ish/n) for the sd; 6 sigma.
    torch::Tensor se = m->sd / std::sqrt(static_cast<double>(n));
    EXPECT_LT(((x.mean(0) - m->mean).abs() / se).max().item<double>(), 6.0) << spec.dump();
    EXPECT_LT(((x.std(0) / m->sd) - 1).abs().max().item<double>(), 0.03) << spec.dump();
  }
}

TEST(Targets, PaperGeometry) {
  auto scg = dynamic_cast<GaussianTarget*>(make_target({{"name", "scg"}}, kF64).release());
  torch::Tensor cov = scg->covariance();
  EXPECT_NEAR(cov[0][0].item<double>(), 50.05, 1e-10);
  EXPECT_NEAR(cov[0][1].item<double>(), -49.95, 1e-10);
  EXPECT_NEAR(cov[1][1].item<double>(), 50.05, 1e-10);
  delete scg;
  auto icg = make_target({{"name", "icg"}}, kF64);
  EXPECT_EQ(icg->dim(), 50);
  auto m = icg->reference_moments();
  EXPECT_NEAR(m->sd[0].item<double>(), 0.1, 1e-12);
  EXPECT_NEAR(m->sd[49].item<double>(), 10.0, 1e-10);
  auto f1 = make_target({{"name", "funnel"}, {"dim", 100}, {"sigma", 1}}, kF64);
  EXPECT_NEAR(f1->reference_moments()->sd[1].item<double>(), std::exp(0.25), 1e-12);
  auto r1 = make_target({{"name", "rotated_icg"}, {"seed", 4}}, kF64);
  auto r2 = make_target({{"name", "rotated_icg"}, {"seed", 4}}, kF64);
  torch::Tensor x = torch::ones({1, 100}, kF64);
  EXPECT_EQ(r1->energy(x).item<double>(), r2->energy(x).item<double>());  // same seed, same target
  EXPECT_EQ(r1->spec()["dim"], 100);
  EXPECT_EQ(r1->spec()["eigenvalues"], "precision");
  EXPECT_EQ(make_target({{"name", "rotated_icg"}}, kF64)->spec()["seed"], 10);
  // The default is NeuTra's / the authors' target: numpy's RandomState(seed=10) draws the sorted float32
  // Gamma(0.5, 1) precision eigenvalues, then randn(d, d) for the QR rotation; covariance =
  // (q * g**-1) @ q.T. Reference numbers computed with numpy 1.24:
  //   rng = np.random.RandomState(seed=10); g = np.sort(rng.gamma(0.5, 1., d)).astype(np.float32)
  //   q, _ = np.linalg.qr(rng.randn(d, d)); cov = (q * g**-1).dot(q.T)
  struct NumpyRef {
    int64_t d;
    double g0, cov00, cov01, cov_last;
  };
  for (const NumpyRef& ref : {NumpyRef{5, 0.028598474338650703, 2.10277198893649, 1.0960382984319734, -3.4129768261536566},
                              NumpyRef{100, 1.558880649099592e-05, 997.7356148768239, 126.77928635798784,
                                       -226.12023132871659}}) {
    auto t = make_target({{"name", "rotated_icg"}, {"dim", ref.d}}, kF64);
    torch::Tensor c = dynamic_cast<GaussianTarget&>(*t).covariance();
    const double tol = 1e-9 * c.abs().max().item<double>();
    EXPECT_NEAR(c[0][0].item<double>(), ref.cov00, tol) << ref.d;
    EXPECT_NEAR(c[0][1].item<double>(), ref.cov01, tol) << ref.d;
    EXPECT_NEAR(c[ref.d - 1][ref.d - 2].item<double>(), ref.cov_last, tol) << ref.d;
    torch::Tensor ev = torch::linalg_eigvalsh(c, "L");
    EXPECT_NEAR(ev.max().item<double>(), 1.0 / ref.g0, 1e-6 / ref.g0) << ref.d;
  }
  // NeuTra's definition: the Gamma(0.5, 1) draws are the precision's eigenvalues; the "covariance" variant
  // has the same draws and rotation as the covariance's, so the two covariances are each other's inverse.
  auto prec = make_target({{"name", "rotated_icg"}, {"dim", 12}, {"seed", 4}}, kF64);
  auto covv = make_target({{"name", "rotated_icg"}, {"dim", 12}, {"seed", 4}, {"eigenvalues", "covariance"}}, kF64);
  torch::Tensor cp = dynamic_cast<GaussianTarget&>(*prec).covariance();
  torch::Tensor cc = dynamic_cast<GaussianTarget&>(*covv).covariance();
  EXPECT_LT((torch::matmul(cp, cc) - torch::eye(12, kF64)).abs().max().item<double>(), 1e-6);
  torch::Tensor ev = torch::linalg_eigvalsh(cp, "L");
  EXPECT_GT(ev.max().item<double>() / ev.min().item<double>(), 10.0);  // ill-conditioned
  EXPECT_THROW(make_target({{"name", "rotated_icg"}, {"eigenvalues", "both"}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "rotated_icg"}, {"eigenvalues", 1}}, kF64), UsageError);
}

TEST(Targets, CountsEvaluations) {
  auto t = make_target({{"name", "moon"}}, kF64);
  torch::Tensor x = torch::zeros({7, 2}, kF64);
  t->energy(x);
  t->energy_and_grad(x);
  t->energy_and_grad(x);
  EXPECT_EQ(t->energy_evals(), 3);
  EXPECT_EQ(t->grad_evals(), 2);
}

TEST(Targets, RegistryRejectsBadSpecs) {
  EXPECT_THROW(make_target({{"name", "nope"}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "funnel"}, {"dim", 1}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "funnel"}, {"sigma", -1}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "funnel"}, {"colour", 3}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "logistic"}, {"dataset", "mnist"}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "logistic"}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "gaussian"}, {"scales", {1.0, -2.0}}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "spiked"}, {"dim", 4}, {"spikes", 4}}, kF64), UsageError);
  EXPECT_THROW(make_target({{"name", "spiked"}, {"spike_sd", 0}}, kF64), UsageError);
  EXPECT_THROW(make_target(json::array(), kF64), UsageError);
}

namespace {
/// A user's target for the registry tests: U(x) = |x - shift|^2 / 2.
class Shifted : public Target {
 public:
  Shifted(int64_t d, double shift, torch::TensorOptions o) : Target(o), d_(d), shift_(shift) {}
  std::string name() const override { return "shifted_test"; }
  int64_t dim() const override { return d_; }
  json spec() const override { return {{"name", "shifted_test"}, {"dim", d_}, {"shift", shift_}}; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override { return 0.5 * (x - shift_).pow(2).sum(1); }

 private:
  int64_t d_;
  double shift_;
};
}  // namespace

TEST(Targets, RegistryIsOpenToUserTargets) {
  register_target({"shifted_test", "N(shift, I)", {{"dim", "dimension (3)"}, {"shift", "mean of every coordinate (0)"}}},
                  [](const json& spec, torch::TensorOptions o) -> std::unique_ptr<Target> {
                    return std::make_unique<Shifted>(spec.value("dim", int64_t{3}), spec.value("shift", 0.0), o);
                  });
  auto t = make_target({{"name", "shifted_test"}, {"shift", 2.0}}, kF64);
  EXPECT_EQ(t->dim(), 3);
  EXPECT_EQ(t->spec(), (json{{"name", "shifted_test"}, {"dim", 3}, {"shift", 2.0}}));
  EXPECT_NEAR(t->energy(torch::full({1, 3}, 2.0, kF64)).item<double>(), 0.0, 1e-15);
  // Listed after the built-ins; its options are checked like theirs; the name cannot be taken twice.
  auto cat = target_catalogue();
  ASSERT_FALSE(cat.empty());
  EXPECT_EQ(cat.front().name, "icg");
  EXPECT_TRUE(std::any_of(cat.begin(), cat.end(), [](const TargetInfo& i) { return i.name == "shifted_test"; }));
  EXPECT_THROW(make_target({{"name", "shifted_test"}, {"scale", 1}}, kF64), UsageError);
  EXPECT_THROW(register_target({"shifted_test", "again", {}}, [](const json&, torch::TensorOptions) { return std::unique_ptr<Target>(); }),
               UsageError);
  EXPECT_THROW(register_target({"funnel", "a built-in name", {}}, [](const json&, torch::TensorOptions) { return std::unique_ptr<Target>(); }),
               UsageError);
  EXPECT_THROW(register_target({"", "no name", {}}, [](const json&, torch::TensorOptions) { return std::unique_ptr<Target>(); }),
               UsageError);
}

TEST(Targets, GivenValuesAreNeverReplacedByDefaults) {
  // A value the user gives is validated, never silently replaced (bring-your-own-density issue).
  for (const json& bad : {json{{"name", "funnel"}, {"dim", 0}}, json{{"name", "funnel"}, {"sigma", -1.0}},
                          json{{"name", "funnel"}, {"sigma", NAN}}, json{{"name", "funnel"}, {"sigma", INFINITY}},
                          json{{"name", "funnel"}, {"sigma", nullptr}}, json{{"name", "icg"}, {"dim", 2.5}},
                          json{{"name", "funnel"}, {"sigma", "three"}}}) {
    EXPECT_THROW(make_target(bad, kF64), UsageError) << bad.dump();
  }
}

namespace {
std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST(Targets, LogisticDatasetsAndUserFiles) {
  auto german = make_target({{"name", "logistic"}, {"dataset", "german"}}, kF64);
  EXPECT_EQ(german->dim(), 25);
  EXPECT_EQ(make_target({{"name", "logistic"}, {"dataset", "australian"}}, kF64)->dim(), 15);
  EXPECT_EQ(make_target({{"name", "logistic"}, {"dataset", "heart"}}, kF64)->dim(), 14);

  // A comma-separated user file with the label in the first column.
  std::string path = write_temp("user.csv", "# a comment\n0,1.5,2\n1,0.5,3\n0,2.5,1\n1,1.0,0.5\n");
  auto user = make_target({{"name", "logistic"}, {"file", path}, {"label_column", 0}}, kF64);
  EXPECT_EQ(user->dim(), 3);
  // By hand: the energy at b = 0 is N log 2.
  EXPECT_NEAR(user->energy(torch::zeros({1, 3}, kF64)).item<double>(), 4 * std::log(2.0), 1e-12);

  EXPECT_THROW(load_labelled_table(write_temp("ragged.txt", "1 2 3\n4 5\n"), -1), DataError);
  EXPECT_THROW(load_labelled_table(write_temp("text.txt", "1 2 1\n4 x 2\n"), -1), DataError);
  EXPECT_THROW(load_labelled_table(write_temp("nan.txt", "1 2 1\n4 nan 2\n"), -1), DataError);
  EXPECT_THROW(load_labelled_table(write_temp("labels.txt", "1 2 1\n4 5 2\n4 6 3\n"), -1), DataError);
  EXPECT_THROW(load_labelled_table(write_temp("one.txt", "1 2 1\n"), -1), DataError);
  EXPECT_THROW(load_labelled_table(::testing::TempDir() + "missing.txt", -1), DataError);
  EXPECT_THROW(make_target({{"name", "logistic"}, {"file", write_temp("const.txt", "1 2 1\n1 5 2\n")}}, kF64),
               DataError);
}

TEST(Targets, SpikedHasItsWideDirections) {
  // Covariance I + (s^2 - 1) V V^T: eigenvalues s^2 (k times) and 1; the same seed, the same target.
  auto t = make_target({{"name", "spiked"}, {"dim", 30}, {"spikes", 3}, {"spike_sd", 5}, {"seed", 2}}, kF64);
  auto* g = dynamic_cast<GaussianTarget*>(t.get());
  ASSERT_NE(g, nullptr);
  torch::Tensor w = std::get<0>(torch::linalg_eigh(g->covariance()));  // ascending
  EXPECT_LT((w.narrow(0, 0, 27) - 1.0).abs().max().item<double>(), 1e-10);
  EXPECT_LT((w.narrow(0, 27, 3) - 25.0).abs().max().item<double>(), 1e-9);
  auto again = make_target({{"name", "spiked"}, {"dim", 30}, {"spikes", 3}, {"spike_sd", 5}, {"seed", 2}}, kF64);
  auto other = make_target({{"name", "spiked"}, {"dim", 30}, {"spikes", 3}, {"spike_sd", 5}, {"seed", 3}}, kF64);
  torch::Tensor x = torch::linspace(-2, 2, 30, kF64).unsqueeze(0);
  EXPECT_EQ(t->energy(x).item<double>(), again->energy(x).item<double>());
  EXPECT_GT(std::abs(t->energy(x).item<double>() - other->energy(x).item<double>()), 1e-6);
  EXPECT_EQ(t->spec(), (json{{"name", "spiked"}, {"dim", 30}, {"spikes", 3}, {"spike_sd", 5.0}, {"seed", 2}}));
}
