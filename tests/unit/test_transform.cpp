// The Transform seam (Note [Transform]): every affine form's closed forms against autograd through
// its own forward and inverse, the flow's pulled-back target against LibTorch's graph, the
// Jacobian rule, and a metric as the change of variables it stands for.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nmcmc/core/random.hpp"
#include "nmcmc/core/transform.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/integrator.hpp"
#include "nmcmc/kernels/metric.hpp"
#include "nmcmc/targets/targets.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;

namespace {
constexpr int64_t kD = 4;

/// A transform that has only its forward and inverse passes: every other operation is the
/// Transform default's autograd, the reference for the closed forms and the native passes.
class ByAutograd : public Transform {
 public:
  explicit ByAutograd(std::shared_ptr<const Transform> t) : t_(std::move(t)) {}
  int64_t dim() const override { return t_->dim(); }
  TransformPass forward(const torch::Tensor& y) const override { return t_->forward(y); }
  TransformPass inverse(const torch::Tensor& x) const override { return t_->inverse(x); }
  bool constant_log_det() const override { return t_->constant_log_det(); }

 private:
  std::shared_ptr<const Transform> t_;
};

/// Lower triangular with a positive diagonal.
torch::Tensor lower(at::Generator& gen) {
  return torch::tril(torch::randn({kD, kD}, gen, kF64) * 0.4, -1) + torch::diag_embed(torch::rand({kD}, gen, kF64) + 0.5);
}

/// Every affine form, named.
std::vector<std::pair<std::string, AffineTransform>> affine_forms() {
  at::Generator gen = make_generator(11);
  torch::Tensor m = torch::randn({kD}, gen, kF64);
  torch::Tensor scale = torch::rand({kD}, gen, kF64) + 0.3;
  torch::Tensor l0 = lower(gen), l2 = lower(gen);
  torch::Tensor q = std::get<0>(torch::linalg_qr(torch::randn({kD, 2}, gen, kF64)));
  torch::Tensor t = torch::tensor({0.7, -0.4}, kF64);
  auto ld = [](const torch::Tensor& l) { return l.diagonal().log().sum(); };
  return {{"identity", AffineTransform::identity(kD)},
          {"diagonal", AffineTransform::diagonal(m, scale, scale.log().sum())},
          {"dense", AffineTransform::dense(m, l0, torch::Tensor(), ld(l0))},
          {"dense L0 M", AffineTransform::dense(m, l0, l2, ld(l0) + ld(l2))},
          {"low rank", AffineTransform::low_rank(m, scale, q, t, scale.log().sum() + t.sum())}};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

/// Two transforms agree on every operation at the rows y (and at x = T(y)) for `target`.
void expect_same_operations(const Transform& a, const Transform& b, Target& target, const torch::Tensor& y,
                            const std::string& what) {
  TransformPass fa = a.forward(y), fb = b.forward(y);
  EXPECT_LT(max_diff(fa.out, fb.out), 1e-12) << what;
  EXPECT_LT(max_diff(fa.log_det, fb.log_det), 1e-12) << what;
  TransformPass ia = a.inverse(fa.out);
  EXPECT_LT(max_diff(ia.out, y), 1e-10) << what << ": inverse(forward(y)) = y";
  EXPECT_LT(max_diff(ia.log_det, -fa.log_det), 1e-10) << what;
  for (bool jacobian : {true, false}) {
    if (!jacobian && !a.constant_log_det()) continue;
    EXPECT_LT(max_diff(a.pulled_energy(target, y, jacobian), b.pulled_energy(target, y, jacobian)), 1e-10) << what;
    EnergyGrad ea = a.pulled_energy_and_grad(target, y, false, jacobian);
    EnergyGrad eb = b.pulled_energy_and_grad(target, y, false, jacobian);
    EXPECT_LT(max_diff(ea.energy, eb.energy), 1e-10) << what << " jacobian " << jacobian;
    EXPECT_LT(max_diff(ea.grad, eb.grad), 1e-10) << what << " jacobian " << jacobian;
  }
  EnergyGrad at_x = target.energy_and_grad(fa.out.detach());
  auto [ya, gya] = a.latent_pairs(fa.out.detach(), at_x.grad);
  auto [yb, gyb] = b.latent_pairs(fa.out.detach(), at_x.grad);
  EXPECT_LT(max_diff(ya, yb), 1e-10) << what;
  EXPECT_LT(max_diff(gya, gyb), 1e-10) << what;
  auto [xa, ga] = a.ambient_pairs(ya, gya);
  auto [xb, gb] = b.ambient_pairs(yb, gyb);
  EXPECT_LT(max_diff(xa, xb), 1e-10) << what;
  EXPECT_LT(max_diff(ga, gb), 1e-10) << what;
  EXPECT_LT(max_diff(ga, at_x.grad), 1e-9) << what << ": the pairs go back to the gradient they came from";
}
}  // namespace

TEST(Transform, AffineClosedFormsEqualAutogradThroughTheirPasses) {
  auto target = make_target({{"name", "funnel"}, {"dim", kD}, {"sigma", 1}}, kF64);
  torch::Tensor y = torch::randn({6, kD}, make_generator(3), kF64) * 0.5;
  for (const auto& [name, a] : affine_forms()) {
    auto shared = std::make_shared<AffineTransform>(a);
    expect_same_operations(*shared, ByAutograd(shared), *target, y, name);
    // log|det L| is the log-determinant of the matrix the map applies.
    EXPECT_NEAR(a.log_det().item<double>(), std::get<1>(torch::linalg_slogdet(a.matrix())).item<double>(), 1e-12) << name;
    EXPECT_LT(max_diff(a.from_latent(y), a.shift() + y.matmul(a.matrix().t())), 1e-12) << name;
  }
}

TEST(Transform, TheFlowsPulledBackTargetEqualsLibTorchsGraph) {
  auto target = make_target({{"name", "funnel"}, {"dim", kD}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(5);
  for (int64_t layers : {0, 3}) {
    FlowTransport flow(FlowOptions().set_dim(kD).set_layers(layers).set_hidden(16).set_mask_seed(9));
    flow->perturb(0.3, gen);
    flow->set_base(torch::randn({kD}, gen, kF64) * 0.5, torch::randn({kD}, gen, kF64) * 0.3);
    auto shared = std::make_shared<FlowTransform>(flow);
    ASSERT_TRUE(layers == 0 || flow->native()) << "the native pass is what is compared";
    torch::Tensor z = torch::randn({6, kD}, gen, kF64) * 0.5;
    expect_same_operations(*shared, ByAutograd(shared), *target, z, "flow with " + std::to_string(layers) + " layers");
  }
}

TEST(Transform, TheJacobianMayBeLeftOutOnlyWhereItIsConstant) {
  auto target = make_target({{"name", "gaussian"}, {"dim", kD}}, kF64);
  FlowTransport flow(FlowOptions().set_dim(kD).set_layers(2));
  EXPECT_THROW(TransformedTarget(*target, std::make_shared<FlowTransform>(flow), Jacobian::kOmit), c10::Error);
  EXPECT_THROW(TransformedTarget(*target, std::make_shared<AffineTransform>(AffineTransform::identity(kD + 1))),
               c10::Error);
  const AffineTransform a = affine_forms()[2].second;  // dense
  TransformedTarget with(*target, std::make_shared<AffineTransform>(a));
  TransformedTarget without(*target, std::make_shared<AffineTransform>(a), Jacobian::kOmit);
  torch::Tensor y = torch::randn({3, kD}, make_generator(6), kF64);
  // U_y = U(T(y)) - log|det L|; left out, the energies are the target's own at x = T(y).
  EXPECT_LT(max_diff(without.energy(y), target->energy(a.from_latent(y))), 1e-12);
  EXPECT_LT(max_diff(with.energy(y), without.energy(y) - a.log_det()), 1e-12);
  target->reset_counters();
  with.energy_and_grad(y);
  EXPECT_EQ(target->energy_evals(), 1) << "each view's evaluation is one evaluation of the target";
  EXPECT_EQ(target->grad_evals(), 1);
}

TEST(Transform, AMetricIsHmcWithTheUnitMetricOnItsTransform) {
  // Leapfrog with inverse mass matrix M^{-1} = L L^T from (x, p) is leapfrog with the unit metric
  // on U(L y) from (y, p_y) = (L^-1 x, L^T p): the same trajectory, x_t = L y_t.
  auto target = make_target({{"name", "funnel"}, {"dim", kD}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(8);
  torch::Tensor dense = torch::tensor({{1.0, 0.3, -0.2, 0.0}, {0.3, 0.8, 0.1, 0.2}, {-0.2, 0.1, 1.5, 0.0}, {0.0, 0.2, 0.0, 0.6}}, kF64);
  torch::Tensor basis = std::get<0>(torch::linalg_qr(torch::randn({kD, 2}, gen, kF64)));
  std::vector<std::pair<std::string, Metric>> metrics = {
      {"unit", Metric()},
      {"diag", Metric(torch::tensor({1.0, 0.5, 2.0, 0.7}, kF64))},
      {"dense", Metric(dense)},
      {"low rank", Metric::low_rank(torch::tensor({1.0, 0.5, 2.0, 0.7}, kF64), basis, torch::tensor({3.0, 0.2}, kF64))}};
  torch::Tensor x = torch::randn({5, kD}, gen, kF64) * 0.5;
  const torch::Tensor eps = torch::full({1, 1}, 0.05, kF64);
  for (const auto& [name, metric] : metrics) {
    const AffineTransform a = metric_transform(metric, kD);
    const torch::Tensor inv_mass = metric.kind() == MetricKind::kUnit   ? torch::eye(kD, kF64)
                                   : metric.kind() == MetricKind::kDiag ? torch::diag_embed(metric.inv_mass())
                                                                        : metric.inv_mass();
    EXPECT_LT(max_diff(a.matrix().matmul(a.matrix().t()), inv_mass), 1e-12)
        << name << ": L L^T is the inverse mass matrix";
    torch::Tensor p = metric.momentum(torch::randn({5, kD}, gen, kF64));
    EnergyGrad ex = target->energy_and_grad(x);
    PhasePoint end_x = leapfrog(*target, metric, {x, p, ex.grad, ex.energy}, eps, 20);
    TransformedTarget latent(*target, std::make_shared<AffineTransform>(a), Jacobian::kOmit);
    torch::Tensor y = a.to_latent(x);
    EnergyGrad ey = latent.energy_and_grad(y);
    PhasePoint end_y = leapfrog(latent, Metric(), {y, a.latent_grad(p), ey.grad, ey.energy}, eps, 20);
    EXPECT_GT(max_diff(end_x.x, x), 0.05) << name << ": the trajectory moved";
    EXPECT_LT(max_diff(a.from_latent(end_y.x), end_x.x), 1e-10) << name;
    EXPECT_LT(max_diff(end_y.p, a.latent_grad(end_x.p)), 1e-10) << name;
    EXPECT_LT(max_diff(hamiltonian(Metric(), end_y), hamiltonian(metric, end_x)), 1e-10) << name;
  }
}

TEST(Transform, TheFlowsBaseIsAnAffineTransform) {
  auto target = make_target({{"name", "funnel"}, {"dim", kD}, {"sigma", 1}}, kF64);
  at::Generator gen = make_generator(12);
  FlowTransport flow(FlowOptions().set_dim(kD).set_layers(0));
  flow->set_base_cholesky(torch::randn({kD}, gen, kF64), lower(gen));
  torch::Tensor z = torch::randn({6, kD}, gen, kF64);
  // Without coupling layers the flow is its base map: the same operations, whichever computes them.
  expect_same_operations(FlowTransform(flow), flow->base(), *target, z, "a flow without layers and its base");
  flow->set_base(torch::randn({kD}, gen, kF64), torch::randn({kD}, gen, kF64) * 0.3);
  expect_same_operations(FlowTransform(flow), flow->base(), *target, z, "the same with a diagonal base");
}
