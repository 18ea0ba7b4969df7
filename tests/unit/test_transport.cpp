// The flow transport (Note [Flow transport]): invertibility, the log-determinant against the
// autograd Jacobian, the pulled-back target's gradient, the Fisher fit, and a transported run.
#include <gtest/gtest.h>

#include <limits>
#include <map>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/adaptation.hpp"
#include "nmcmc/kernels/nuts.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/services/transport.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;

namespace {

FlowTransport perturbed_flow(int64_t d, int64_t layers, double scale, uint64_t seed) {
  FlowTransport flow(FlowOptions().set_dim(d).set_layers(layers).set_hidden(16).set_mask_seed(seed));
  at::Generator gen = make_generator(seed + 1);
  flow->perturb(scale, gen);
  flow->set_base(torch::randn({d}, gen, kF64) * 0.5, torch::randn({d}, gen, kF64) * 0.3);
  return flow;
}
}  // namespace

TEST(Transport, StartsAsTheIdentity) {
  FlowTransport flow(FlowOptions().set_dim(5).set_layers(4));
  torch::Tensor z = torch::randn({7, 5}, make_generator(1), kF64);
  TransportPass f = flow->forward(z);
  EXPECT_TRUE(torch::equal(f.out, z));
  EXPECT_EQ(f.log_det.abs().max().item<double>(), 0.0);
}

TEST(Transport, InverseUndoesForwardAndLogDetsAgree) {
  FlowTransport flow = perturbed_flow(6, 6, 0.3, 3);
  torch::Tensor z = torch::randn({50, 6}, make_generator(2), kF64);
  TransportPass f = flow->forward(z);
  EXPECT_GT((f.out - z).abs().max().item<double>(), 0.1);  // not the identity
  TransportPass b = flow->inverse(f.out);
  EXPECT_LT((b.out - z).abs().max().item<double>(), 1e-10);
  EXPECT_LT((b.log_det + f.log_det).abs().max().item<double>(), 1e-10);
  EXPECT_GT(f.log_det.std().item<double>(), 0.05);  // the log-det varies with z
}

TEST(Transport, LogDetEqualsTheAutogradJacobian) {
  const int64_t d = 4;
  FlowTransport flow = perturbed_flow(d, 4, 0.3, 5);
  torch::Tensor z = torch::randn({5, d}, make_generator(4), kF64);
  TransportPass f = flow->forward(z);
  for (int64_t i = 0; i < z.size(0); ++i) {
    torch::Tensor zi = z[i].unsqueeze(0).clone().requires_grad_(true);
    torch::Tensor xi = flow->forward(zi).out.squeeze(0);
    torch::Tensor jac = torch::zeros({d, d}, kF64);
    for (int64_t r = 0; r < d; ++r) jac[r] = torch::autograd::grad({xi[r]}, {zi}, {}, true)[0].squeeze(0);
    const double expected = std::get<1>(torch::linalg_slogdet(jac)).item<double>();
    EXPECT_NEAR(f.log_det[i].item<double>(), expected, 1e-10);
  }
}

TEST(Transport, PulledBackGradientAndAmbientPairs) {
  // with coupling layers, and without (the affine map alone: `--transport-layers 0`, whose
  // log-determinant does not depend on z)
  for (int64_t layers : {4, 0}) {
    SCOPED_TRACE("layers " + std::to_string(layers));
    auto target = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 1.0}}, kF64);
    TransportedTarget latent(*target, perturbed_flow(4, layers, 0.3, 7));
    torch::Tensor z = torch::randn({6, 4}, make_generator(8), kF64) * 0.7;
    EnergyGrad eg = latent.energy_and_grad(z);
    torch::Tensor fd = test_support::finite_difference_grad(latent, z);
    EXPECT_LT((eg.grad - fd).abs().max().item<double>(), 1e-5);
    // U_z = U(T(z)) - log|det|
    torch::Tensor x = latent.to_ambient(z);
    EXPECT_LT((eg.energy - (target->energy(x) - latent.log_det(z))).abs().max().item<double>(), 1e-10);
    // dU at x from the latent gradient, without a target evaluation
    auto [xa, ga] = latent.ambient_pairs(z, eg.grad);
    EXPECT_LT((xa - x).abs().max().item<double>(), 1e-12);
    EXPECT_LT((ga - target->energy_and_grad(x).grad).abs().max().item<double>(), 1e-8);
    // to_latent inverts to_ambient
    EXPECT_LT((latent.to_latent(x) - z).abs().max().item<double>(), 1e-10);
  }
}

TEST(Transport, LatentPairsAreThePulledBackTargetsGradients) {
  // latent_pairs(x, dU(x)) = (z, grad U_z(z)) as the latent target computes them, and
  // ambient_pairs undoes it; a row with a non-finite gradient is dropped.
  for (int64_t layers : {4, 0}) {
    SCOPED_TRACE("layers " + std::to_string(layers));
    auto target = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 1.0}}, kF64);
    TransportedTarget latent(*target, perturbed_flow(4, layers, 0.3, 17));
    torch::Tensor z = torch::randn({6, 4}, make_generator(18), kF64) * 0.7;
    const EnergyGrad eg = latent.energy_and_grad(z);
    torch::Tensor x = latent.to_ambient(z);
    torch::Tensor g = target->energy_and_grad(x).grad;
    g[2][1] = std::numeric_limits<double>::quiet_NaN();
    auto [zl, gl] = latent.latent_pairs(x, g);
    ASSERT_EQ(zl.size(0), 5);
    const torch::Tensor keep = torch::tensor({0, 1, 3, 4, 5}, torch::kLong);
    EXPECT_LT((zl - z.index({keep})).abs().max().item<double>(), 1e-10);
    EXPECT_LT((gl - eg.grad.index({keep})).abs().max().item<double>(), 1e-8);
    auto [xa, ga] = latent.ambient_pairs(zl, gl);
    EXPECT_LT((ga - g.index({keep})).abs().max().item<double>(), 1e-8);
  }
}

TEST(Transport, ALinearResidualInTheLatentSpaceIsMeasured) {
  // Note [A linear residual in the latent space]: through the identity, scg's points (a
  // correlation of 0.998) are far from N(0, I) and an affine map estimated from them fixes that
  // (the ratio far above TransportRules().linear_residual_ratio); a funnel's neck is not linear, and an affine map
  // fits its exact draws hardly better than N(0, I) does: under the threshold.
  auto scg = make_target({{"name", "scg"}}, kF64);
  at::Generator gen = make_generator(21);
  TransportedTarget through_identity(*scg, FlowTransport(FlowOptions().set_dim(2).set_layers(2)));
  torch::Tensor x = scg->sample(2000, gen);
  LatentResidual lin = latent_residual(through_identity, x, scg->energy_and_grad(x).grad, 3);
  std::cout << "  scg: " << lin.flow_loss << " -> " << lin.affine_loss << "\n";
  EXPECT_GT(lin.ratio(), 100.0);
  auto funnel = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 3.0}}, kF64);
  TransportedTarget funnel_latent(*funnel, FlowTransport(FlowOptions().set_dim(5).set_layers(2)));
  torch::Tensor xf = funnel->sample(2000, gen);
  // the funnel's scale first (its base from the same points), as a fitted flow's base has it
  FlowTransport base(FlowOptions().set_dim(5).set_layers(0));
  FitOptions fo;
  fo.steps = 0;
  fit_transport(*base, xf, funnel->energy_and_grad(xf).grad, fo);
  TransportedTarget scaled(*funnel, base);
  LatentResidual non = latent_residual(scaled, xf, funnel->energy_and_grad(xf).grad, 3);
  std::cout << "  funnel through its affine base: " << non.flow_loss << " -> " << non.affine_loss << "\n";
  EXPECT_GT(non.flow_loss, 0.05);  // far from N(0, I) ...
  EXPECT_LT(non.ratio(), TransportRules().linear_residual_ratio);  // ... and not by a linear map
}

TEST(Transport, PulledBackGradientWithAGraphForTraining) {
  // Note [Learned proposal in a flow's latent space]: training differentiates through grad U_z,
  // so with create_graph it must be the same gradient, itself differentiable: its Hessian-vector
  // product against central differences of the gradient. With the flow's parameters frozen, as
  // training freezes them, and with no coupling layers too (the affine map the transport's trials
  // can keep): there log|det| does not depend on z, and asking for its gradient threw, which
  // training counted as a failed density at every proposal ("training learned nothing").
  auto target = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 1.0}}, kF64);
  for (int64_t layers : {4, 0}) {
    SCOPED_TRACE("layers " + std::to_string(layers));
    FlowTransport flow = perturbed_flow(4, layers, 0.3, 7);
    for (auto& p : flow->parameters()) p.requires_grad_(false);
    TransportedTarget latent(*target, flow);
    at::Generator gen = make_generator(9);
    torch::Tensor z0 = torch::randn({6, 4}, gen, kF64) * 0.7;
    torch::Tensor v = torch::randn({6, 4}, gen, kF64);
    EnergyGrad plain = latent.energy_and_grad(z0);
    torch::Tensor z = z0.clone().requires_grad_(true);
    EnergyGrad eg = latent.energy_and_grad(z, /*create_graph=*/true);
    ASSERT_TRUE(eg.grad.requires_grad());
    ASSERT_TRUE(eg.energy.requires_grad());
    EXPECT_LT((eg.grad.detach() - plain.grad).abs().max().item<double>(), 1e-12);
    EXPECT_LT((eg.energy.detach() - plain.energy).abs().max().item<double>(), 1e-12);
    torch::Tensor hv = torch::autograd::grad({(eg.grad * v).sum()}, {z}, {}, /*retain_graph=*/true)[0];
    const double h = 1e-5;
    torch::Tensor fd = (latent.energy_and_grad(z0 + h * v).grad - latent.energy_and_grad(z0 - h * v).grad) / (2 * h);
    EXPECT_LT((hv - fd).abs().max().item<double>(), 1e-5);
    EXPECT_GT(hv.abs().max().item<double>(), 0.1);  // not trivially zero
    // The energy's graph gives the gradient back.
    torch::Tensor ge = torch::autograd::grad({eg.energy.sum()}, {z})[0];
    EXPECT_LT((ge - plain.grad).abs().max().item<double>(), 1e-10);
  }
}

// The affine map alone (no coupling layers: the transport's first round, `--transport-layers 0`,
// the affine candidate of Note [The flow or its affine base]) pulls gradients back as g L without
// a graph: the same values as training's graph path, with a dense L (not symmetric: g L^T would
// fail) and with the diagonal base used above kMaxDenseBase dimensions (g exp(-s) would fail).
TEST(Transport, AffineMapAloneNeedsNoGraph) {
  for (int64_t d : {int64_t{5}, kMaxDenseBase + 1}) {
    SCOPED_TRACE("dimension " + std::to_string(d));
    auto target = make_target({{"name", "funnel"}, {"dim", d}, {"sigma", 1.0}}, kF64);
    FlowTransport flow = perturbed_flow(d, 0, 0.3, 11);
    ASSERT_EQ(flow->dense_base(), d <= kMaxDenseBase);
    at::Generator gen = make_generator(13);
    torch::Tensor l;
    if (flow->dense_base()) {  // a lower-triangular L with a positive diagonal, far from symmetric
      l = torch::tril(torch::randn({d, d}, gen, kF64), -1) + torch::diag(torch::rand({d}, gen, kF64) + 0.5);
      flow->set_base_cholesky(torch::randn({d}, gen, kF64) * 0.5, l);
    } else {  // L = diag(exp(s)), s away from 0
      const torch::Tensor log_scale = torch::rand({d}, gen, kF64) + 0.3;
      flow->set_base(torch::randn({d}, gen, kF64) * 0.5, log_scale);
      l = torch::diag(log_scale.exp());
    }
    TransportedTarget latent(*target, flow);
    torch::Tensor z0 = torch::randn({6, d}, make_generator(12), kF64) * 0.5;
    EnergyGrad fast = latent.energy_and_grad(z0);
    EnergyGrad graph = latent.energy_and_grad(z0.clone().requires_grad_(true), /*create_graph=*/true);
    // equal to rounding (relative to the largest gradient and energy)
    const double g_scale = 1.0 + graph.grad.abs().max().item<double>(), u_scale = 1.0 + graph.energy.abs().max().item<double>();
    EXPECT_LT((fast.grad - graph.grad.detach()).abs().max().item<double>(), 1e-13 * g_scale);
    EXPECT_LT((fast.energy - graph.energy.detach()).abs().max().item<double>(), 1e-13 * u_scale);
    EXPECT_GT((fast.grad - target->energy_and_grad(latent.to_ambient(z0)).grad).abs().max().item<double>(), 0.01);
    // The broken variants this test tells apart: the pull-back g L^T (a transpose forgotten) and,
    // for the diagonal base, g L^{-1} (g exp(-s): the inverse map's scale).
    const torch::Tensor g = target->energy_and_grad(latent.to_ambient(z0)).grad;
    EXPECT_LT((graph.grad.detach() - torch::matmul(g, l)).abs().max().item<double>(), 1e-12 * g_scale);
    if (flow->dense_base()) {
      EXPECT_GT((graph.grad.detach() - torch::matmul(g, l.t())).abs().max().item<double>(), 0.01);
    } else {
      EXPECT_GT((graph.grad.detach() - torch::matmul(g, torch::inverse(l))).abs().max().item<double>(), 0.01);
    }
  }
}

// Note [The flow's native pass]: sampling evaluates the pulled-back target through the flow's
// weights copied into plain loops; its energy and gradient must equal LibTorch's graph (here
// written out: autograd of T(z) . g - log|det| with g = dU(T(z))) with coupling layers and a dense,
// non-symmetric L, in odd and even dimensions and with wide conditioners; the copy must follow a
// change of the flow's parameters (an optimiser's step, a setter) and a failed row must stay NaN.
TEST(Transport, NativePassEqualsTheGraph) {
  for (auto [d, hidden] : {std::pair<int64_t, int64_t>{5, 16}, {2, 8}, {12, 40}}) {
    SCOPED_TRACE("dimension " + std::to_string(d));
    auto target = make_target({{"name", "funnel"}, {"dim", d}, {"sigma", 1.0}}, kF64);
    FlowTransport flow(FlowOptions().set_dim(d).set_layers(6).set_hidden(hidden).set_mask_seed(d));
    at::Generator gen = make_generator(20 + d);
    flow->perturb(0.3, gen);
    torch::Tensor l = torch::tril(torch::randn({d, d}, gen, kF64), -1) * 0.5 + torch::diag(torch::rand({d}, gen, kF64) + 0.5);
    flow->set_base_cholesky(torch::randn({d}, gen, kF64) * 0.5, l);
    ASSERT_TRUE(flow->native() != nullptr);
    TransportedTarget latent(*target, flow);
    auto reference = [&](const torch::Tensor& z0) {
      torch::Tensor z = z0.clone().requires_grad_(true);
      TransportPass f = flow->forward(z);
      EnergyGrad eg = target->energy_and_grad(f.out.detach());
      torch::Tensor gz = torch::autograd::grad({(f.out * eg.grad).sum() - f.log_det.sum()}, {z})[0];
      return EnergyGrad{(eg.energy - f.log_det).detach(), gz};
    };
    // relative to the values' size (the funnel's gradients reach 1e3 here)
    auto off = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a - b).abs().max() / (1.0 + b.abs().max())).item<double>();
    };
    torch::Tensor z0 = torch::randn({7, d}, gen, kF64) * 0.6;
    EnergyGrad fast = latent.energy_and_grad(z0), ref = reference(z0);
    EXPECT_LT(off(fast.grad, ref.grad), 1e-13);
    EXPECT_LT(off(fast.energy, ref.energy), 1e-13);
    EXPECT_LT(off(latent.energy(z0), ref.energy), 1e-13);
    EXPECT_GT((fast.grad - target->energy_and_grad(z0).grad).abs().max().item<double>(), 0.01);
    // an Adam step changes every parameter: the copy follows
    torch::optim::Adam adam(flow->parameters(), torch::optim::AdamOptions(0.05));
    adam.zero_grad();
    fisher_loss(*flow, torch::randn({16, d}, gen, kF64), torch::randn({16, d}, gen, kF64)).backward();
    adam.step();
    EnergyGrad after = latent.energy_and_grad(z0), ref_after = reference(z0);
    EXPECT_GT((after.grad - fast.grad).abs().max().item<double>(), 1e-3);
    EXPECT_LT(off(after.grad, ref_after.grad), 1e-13);
    EXPECT_LT(off(after.energy, ref_after.energy), 1e-13);
    flow->set_base(torch::zeros({d}, kF64), torch::ones({d}, kF64) * 0.2);
    EXPECT_LT(off(latent.energy_and_grad(z0).grad, reference(z0).grad), 1e-13);
    // a row whose energy fails: NaN in that row only
    torch::Tensor zbad = z0.clone();
    zbad[2][0] = std::numeric_limits<double>::quiet_NaN();
    EnergyGrad withbad = latent.energy_and_grad(zbad);
    EXPECT_TRUE(torch::isnan(withbad.grad[2]).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(withbad.grad.index({torch::tensor({0, 1, 3, 4, 5, 6})})).all().item<bool>());
  }
  // float32 parameters (the fit's working copy): no native pass
  FlowTransport f32(FlowOptions().set_dim(3).set_layers(2));
  f32->to(torch::kFloat32);
  EXPECT_TRUE(f32->native() == nullptr);
  // Note [Native copies]: engine libtorch never takes it
  FlowTransport lt(FlowOptions().set_dim(3).set_layers(2).set_engine(Engine::kLibTorch));
  EXPECT_TRUE(lt->native() == nullptr);
  lt->set_engine(Engine::kNative);
  EXPECT_TRUE(lt->native() != nullptr);
}

TEST(Transport, OwnFisherGradientEqualsAutograd) {
  // Note [The fit's own gradient]: the hand-written loss and gradient against LibTorch's double
  // back-propagation, every parameter, in float64: a dense base (D = 5, odd halves; 0, 1 and 4
  // layers) and a diagonal one (D > kMaxDenseBase), one row clipped at kMaxPointLoss.
  struct Case {
    int64_t d, layers, rows;
  };
  for (const Case& cs : {Case{5, 4, 12}, Case{5, 1, 7}, Case{4, 0, 9}, Case{kMaxDenseBase + 1, 2, 5}}) {
    SCOPED_TRACE("d " + std::to_string(cs.d) + ", layers " + std::to_string(cs.layers));
    FlowTransport flow = perturbed_flow(cs.d, cs.layers, 0.3, 7);
    at::Generator gen = make_generator(8);
    if (flow->dense_base()) {
      torch::NoGradGuard no_grad;
      flow->named_parameters()["lower"].copy_(0.3 * torch::randn({cs.d, cs.d}, gen, kF64));
    }
    torch::Tensor x = torch::randn({cs.rows, cs.d}, gen, kF64), g = torch::randn({cs.rows, cs.d}, gen, kF64) * 2.0;
    g[0] = g[0] * 1e4;  // this row's term exceeds kMaxPointLoss: clipped, no gradient
    for (auto& p : flow->parameters()) p.mutable_grad() = torch::Tensor();
    torch::Tensor ref_terms;
    {
      torch::Tensor loss = fisher_loss(*flow, x, g);
      loss.backward();
    }
    std::map<std::string, torch::Tensor> ref;
    for (const auto& item : flow->named_parameters()) {
      ref[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
      item.value().mutable_grad() = torch::Tensor();
    }
    torch::Tensor terms = flow->fisher_terms(x, g, /*accumulate_grad=*/true);
    EXPECT_NEAR(terms[0].item<double>(), kMaxPointLoss, 0.0);
    EXPECT_NEAR(terms.mean().item<double>(), fisher_loss(*flow, x, g).item<double>(), 1e-10);
    double worst = 0, largest = 0;
    for (const auto& item : flow->named_parameters()) {
      torch::Tensor mine = item.value().grad();
      ASSERT_TRUE(mine.defined()) << item.key();
      const double scale = 1.0 + ref[item.key()].abs().max().item<double>();
      const double off = (mine - ref[item.key()]).abs().max().item<double>() / scale;
      EXPECT_LT(off, 1e-10) << item.key();
      worst = std::max(worst, off);
      largest = std::max(largest, ref[item.key()].abs().max().item<double>());
    }
    EXPECT_GT(largest, 1e-3);  // the comparison is not between zeros
    // accumulation: a second call adds the same gradient again
    torch::Tensor before = flow->parameters()[0].grad().clone();
    flow->fisher_terms(x, g, /*accumulate_grad=*/true);
    EXPECT_LT((flow->parameters()[0].grad() - 2.0 * before).abs().max().item<double>(), 1e-12);
  }
}

TEST(Transport, FisherFitWhitensAFunnel) {
  // A 6-d funnel (sigma 1.5): no affine map whitens it; the fitted flow must bring the pulled-back
  // draws close to N(0, I) (the loss falls by more than 10x; the latent draws' sd near 1).
  auto target = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(11);
  torch::Tensor x = target->sample(4000, gen);
  torch::Tensor g = target->energy_and_grad(x).grad;
  FlowTransport flow(FlowOptions().set_dim(6).set_layers(6).set_mask_seed(1));
  FitOptions fo;
  fo.steps = 1500;
  FitReport r = fit_transport(*flow, x, g, fo);
  std::cout << "  fit: " << to_json_value(r).dump() << "\n";
  TransportedTarget latent(*target, flow);
  // The affine base alone: the loss after init_base, before any step.
  FlowTransport affine(FlowOptions().set_dim(6).set_layers(0));
  FitOptions fa = fo;
  fa.steps = 0;
  FitReport ra = fit_transport(*affine, x, g, fa);
  EXPECT_LT(r.loss_end, ra.loss_start / 10) << "affine " << ra.loss_start << " flow " << r.loss_end;
  torch::Tensor z = latent.to_latent(target->sample(4000, gen));
  torch::Tensor sd = z.std(0);
  std::cout << "  latent sd " << sd << "\n";
  EXPECT_LT((sd - 1).abs().max().item<double>(), 0.2);
  EXPECT_LT(z.mean(0).abs().max().item<double>(), 0.2);
}

TEST(Transport, AFitStopsWhenItsChecksNoLongerGain) {
  // Note [Flow transport]: a held-out check counts as a gain only when it lowers the best loss by
  // FitOptions::min_gain; smaller drops keep their parameters but count towards the patience. With
  // min_gain 1 no check can gain, so the fit stops after exactly `patience` checks, keeping the
  // best parameters it saw; with min_gain 0 the same fit (every drop a gain) runs on.
  auto target = make_target({{"name", "funnel"}, {"dim", 6}, {"sigma", 1.5}}, kF64);
  at::Generator gen = make_generator(12);
  torch::Tensor x = target->sample(1000, gen);
  torch::Tensor g = target->energy_and_grad(x).grad;
  auto fit = [&](double min_gain) {
    FlowTransport flow(FlowOptions().set_dim(6).set_layers(4).set_mask_seed(1));
    FitOptions fo;
    fo.steps = 400;
    fo.tolerance = 0.0;
    fo.patience = 3;
    fo.min_gain = min_gain;
    return fit_transport(*flow, x, g, fo);
  };
  const FitReport never = fit(1.0), every = fit(0.0);
  EXPECT_EQ(never.stopped, "patience");
  EXPECT_EQ(never.steps, 3 * FitOptions().check_every);
  EXPECT_LT(never.loss_end, never.loss_start);  // the funnel's first steps gain: their parameters are kept
  EXPECT_GT(every.steps, never.steps);
  EXPECT_LE(every.loss_end, never.loss_end);
  EXPECT_EQ(default_flow_hidden(3), 32);
  EXPECT_EQ(default_flow_hidden(20), 40);
  EXPECT_EQ(default_flow_hidden(3075), 64);
}

TEST(Transport, DenseBaseFromTheFisherEstimateWhitensACorrelatedGaussian) {
  // scg (variances 100 and 0.1 rotated by pi/4: correlation 0.998): the base alone (no coupling
  // layers, no Adam step) must remove the correlation from points that are not even its draws - a
  // wide box around it - because the gradients carry its shape; the latent variances within the
  // low-rank estimate's cutoff [1/2, 2] (Note [Metrics from draws and gradients]). A diagonal base
  // from the same points leaves the correlation (both marginal variances are ~50).
  auto target = make_target({{"name", "scg"}}, kF64);
  at::Generator gen = make_generator(12);
  torch::Tensor x = torch::rand({400, 2}, gen, kF64) * 40 - 20;
  torch::Tensor g = target->energy_and_grad(x).grad;
  FlowTransport flow(FlowOptions().set_dim(2).set_layers(0));
  ASSERT_TRUE(flow->dense_base());
  FitOptions fo;
  fo.steps = 0;
  fit_transport(*flow, x, g, fo);
  torch::Tensor draws = target->sample(20000, gen);
  auto correlation_and_variances = [&](FlowTransport f) {
    TransportedTarget latent(*target, f);
    torch::Tensor cov = torch::cov(latent.to_latent(draws).t());
    const double rho = cov[0][1].item<double>() / std::sqrt(cov[0][0].item<double>() * cov[1][1].item<double>());
    return std::make_pair(rho, cov.diagonal());
  };
  auto [rho, var] = correlation_and_variances(flow);
  std::cout << "  dense base: latent correlation " << rho << ", variances " << var << "\n";
  EXPECT_LT(std::abs(rho), 0.1);
  EXPECT_GT(var.min().item<double>(), 0.5);
  EXPECT_LT(var.max().item<double>(), 2.0);
  FlowTransport diag(FlowOptions().set_dim(2).set_layers(0));
  diag->set_base(x.mean(0), 0.5 * fisher_diagonal(x.var(0, false), g.var(0, false)).log());
  const double rho_diag = correlation_and_variances(diag).first;
  std::cout << "  diagonal base: latent correlation " << rho_diag << "\n";
  EXPECT_GT(std::abs(rho_diag), 0.9);
}

TEST(Transport, FitRejectsTooFewPoints) {
  FlowTransport flow(FlowOptions().set_dim(3).set_layers(2));
  torch::Tensor x = torch::randn({5, 3}, kF64);
  EXPECT_THROW(fit_transport(*flow, x, x, FitOptions()), DataError);
}

TEST(Transport, RunWithTransportOnAFunnel) {
  // End to end: NUTS on a 10-d funnel (sigma 1.5) through the fitted flow. The draws (in x) must
  // have the known moments of x0 (mean 0, sd 1.5) within 5 MCSE-like tolerances and the run must
  // count every round's gradients as warm-up.
  auto target = make_target({{"name", "funnel"}, {"dim", 10}, {"sigma", 1.5}}, kF64);
  Nuts nuts{NutsOptions()};
  RunOptions ro;
  ro.set_chains(4).set_warmup(500).set_draws(500).set_metric(MetricAdapt::kDiag);  // 500: room for the trials
  TransportOptions t;
  t.layers = 4;
  t.rounds = 3;
  TransportRun tr = run_with_transport(*target, nuts, ro, t, 5);
  const SampleResult& r = tr.result;
  ASSERT_TRUE(r.complete);
  ASSERT_EQ(r.draws.sizes(), (std::vector<int64_t>{500, 4, 10}));
  EXPECT_EQ(tr.report["rounds"].size(), 3u);
  EXPECT_GT(r.grads_warmup, 400);  // every round counted
  torch::Tensor x0 = r.draws.select(2, 0).reshape({-1});
  std::cout << "  x0 mean " << x0.mean().item<double>() << " sd " << x0.std().item<double>() << " step "
            << r.step_size << " report " << tr.report.dump() << "\n";
  // every coordinate's mean and sd within 5 of their MCSEs (x0 ~ N(0, 1.5^2); x_i ~ N(0, e^{x0}))
  ASSERT_TRUE(target->reference_moments().has_value());
  EXPECT_EQ(test_support::moments_within(r.draws, target->reference_moments()->mean, target->reference_moments()->sd), "");
  // Note [The flow or its affine base]: both candidates were tried; the affine map is kept when
  // its draws cost at most 0.75 of the flow's gradients, and on a funnel (no affine map fits both
  // its neck and its mouth) the flow is. Each trial's jump score is recorded, and on a funnel the
  // flow's draws move farther per gradient.
  const nlohmann::json& choice = tr.report["choice"];
  ASSERT_TRUE(choice.contains("flow") && choice.contains("affine")) << choice.dump();
  const double flow_cost = choice["flow"]["cost"], affine_cost = choice["affine"]["cost"];
  EXPECT_EQ(choice["chosen"], affine_cost <= 0.75 * flow_cost ? "affine" : "flow");
  EXPECT_EQ(choice["chosen"], "flow") << choice.dump();
  EXPECT_GT(choice["flow"]["score"].get<double>(), choice["affine"]["score"].get<double>()) << choice.dump();
  EXPECT_GT(choice["affine"]["score"].get<double>(), 0) << choice.dump();
  // Note [The final metric through the flow]: the diagonal metric stays unless the last fit
  // reached its tolerance (the latent space Gaussian to it).
  const double last_loss = tr.report["rounds"].back()["fit"]["loss_end"];
  EXPECT_EQ(choice.contains("final_metric"), last_loss <= FitOptions().tolerance) << tr.report.dump();
  // lp is -U(x) at the mapped draws
  torch::Tensor last = r.draws[499];
  EXPECT_LT((r.lp[499] + target->energy(last)).abs().max().item<double>(), 1e-6);
}

// Note [Choosing the transport], sampling: `--transport auto` on a Gaussian (rotated and
// ill-conditioned: an affine map whitens it) measures a small divergence from its warm-up and
// samples as a run without a transport: the same draws bit for bit, the same gradients. On a
// funnel it measures a large one and runs the flow: the same draws as `--transport flow`, its
// warm-up's gradients plus the first warm-up's. (A flow run that kept the first warm-up's step
// size or metric in its kernel, or a first warm-up that drew from the generator, fails these.)
TEST(Transport, AutoSamplesAsWithoutATransportOnAGaussian) {
  auto target = make_target({{"name", "rotated_icg"}, {"dim", 4}, {"seed", 3}}, kF64);
  RunOptions ro;
  ro.set_chains(4).set_warmup(300).set_draws(100).set_metric(MetricAdapt::kDiag);
  Nuts plain_nuts{NutsOptions()};
  const SampleResult plain = run_sampler(*target, plain_nuts, ro, 13);
  Nuts nuts{NutsOptions()};
  TransportOptions t;
  t.kind = TransportKind::kAuto;
  TransportRun tr = run_with_transport(*target, nuts, ro, t, 13);
  std::cout << "  report " << tr.report.dump() << "\n";
  ASSERT_TRUE(tr.result.complete);
  EXPECT_EQ(tr.report["kind"], "auto");
  EXPECT_EQ(tr.report["auto"]["chose"], "none");
  EXPECT_LT(tr.report["auto"]["fisher_per_dim"].get<double>(), TransportRules().flow_fisher_per_dim);
  EXPECT_EQ(tr.report["auto"]["decided_after"], 100);  // a quarter of the warm-up, at least 100
  EXPECT_EQ(tr.report["auto"]["rows"], 4 * 50);       // the second half of those
  EXPECT_FALSE(tr.flow);
  EXPECT_FALSE(tr.report.contains("rounds"));
  EXPECT_TRUE(torch::equal(tr.result.draws, plain.draws));
  EXPECT_EQ(tr.result.grads_warmup, plain.grads_warmup);
  EXPECT_EQ(tr.result.grads_sampling, plain.grads_sampling);
  EXPECT_EQ(tr.result.step_size, plain.step_size);
}

namespace {
/// The small transported runs of the tests below: a 5-d funnel (sigma 1.5), 2 chains, 300 warm-up
/// + 50 draws, two coupling layers, NUTS with a fresh kernel.
const RunOptions kSmallRun = RunOptions().set_chains(2).set_warmup(300).set_draws(50).set_metric(MetricAdapt::kDiag);
TransportRun small_funnel_run(Target& target, TransportKind kind, int64_t rounds, bool global_moves, uint64_t seed) {
  TransportOptions t;
  t.kind = kind;
  t.layers = 2;
  t.rounds = rounds;
  t.global_moves = global_moves;
  Nuts nuts{NutsOptions()};
  return run_with_transport(target, nuts, kSmallRun, t, seed);
}
}  // namespace

TEST(Transport, AutoRunsTheFlowOnAFunnel) {
  auto target = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.5}}, kF64);
  const RunOptions& ro = kSmallRun;
  const TransportRun flow = small_funnel_run(*target, TransportKind::kFlow, 2, false, 21);
  // The run without a transport, ended after the first quarter of its warm-up.
  Nuts plain_nuts{NutsOptions()};
  RunOptions quarter = ro;
  quarter.warmup_observer = [](int64_t i, const ChainState&) { return i + 1 < 100; };
  const SampleResult plain = run_sampler(*target, plain_nuts, quarter, 21);
  ASSERT_FALSE(plain.draws.defined());
  EXPECT_GT(plain.grads_warmup, 100);
  const TransportRun tr = small_funnel_run(*target, TransportKind::kAuto, 2, false, 21);
  std::cout << "  auto " << tr.report["auto"].dump() << "\n";
  ASSERT_TRUE(tr.result.complete);
  EXPECT_EQ(tr.report["kind"], "auto");
  EXPECT_EQ(tr.report["auto"]["chose"], "flow");
  EXPECT_GT(tr.report["auto"]["fisher_per_dim"].get<double>(), TransportRules().flow_fisher_per_dim);
  EXPECT_TRUE(tr.flow);
  EXPECT_EQ(tr.report["rounds"].size(), 2u);
  EXPECT_TRUE(torch::equal(tr.result.draws, flow.result.draws));
  // all-in: the first warm-up (as the plain run's) is counted with the flow's
  EXPECT_EQ(tr.report["auto"]["first_warmup"]["iterations"], 100);
  EXPECT_EQ(tr.report["auto"]["first_warmup"]["grads_per_chain"].get<int64_t>(), plain.grads_warmup);
  EXPECT_EQ(tr.result.grads_warmup, flow.result.grads_warmup + plain.grads_warmup);
  EXPECT_EQ(tr.result.grads_sampling, flow.result.grads_sampling);
}

// Note [Transport warm-up]: global moves start once the fits are done. The fitting rounds of a run
// with them are those of the same run without (the same step sizes, gradients and fits: with
// global moves in the rounds, as before, every round differs); after the fits they act.
TEST(Transport, GlobalMovesWaitForTheFits) {
  auto target = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.5}}, kF64);
  const TransportRun plain = small_funnel_run(*target, TransportKind::kFlow, 3, false, 17);
  const TransportRun global = small_funnel_run(*target, TransportKind::kFlow, 3, true, 17);
  ASSERT_EQ(global.report["rounds"].size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    const json& a = plain.report["rounds"][r];
    const json& b = global.report["rounds"][r];
    EXPECT_EQ(a["grads_per_chain"], b["grads_per_chain"]) << r;
    EXPECT_EQ(a["step_size"], b["step_size"]) << r;
    EXPECT_EQ(a["fit"]["loss_end"], b["fit"]["loss_end"]) << r;
  }
  EXPECT_GT(global.report["global_accept"].get<double>(), 0.0);
  EXPECT_FALSE(torch::equal(plain.result.draws, global.result.draws));
}

TEST(Transport, AutoRefusesAWarmUpTheFlowCouldNotUse) {
  // Checked before the first step: a flow chosen after a whole warm-up must be able to run.
  auto target = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.5}}, kF64);
  Nuts nuts{NutsOptions()};
  TransportOptions t;
  t.kind = TransportKind::kAuto;
  const int64_t before = target->grad_evals();
  EXPECT_THROW(run_with_transport(*target, nuts, RunOptions().set_warmup(99), t, 1), UsageError);
  t.rounds = 6;
  EXPECT_THROW(run_with_transport(*target, nuts, RunOptions().set_warmup(100), t, 1), UsageError);  // too short for 6
  EXPECT_EQ(target->grad_evals(), before);
}

TEST(Transport, AGaussianLatentSpaceGetsTheLowRankFisherMetric) {
  // Note [The final metric through the flow]: on a rotated, ill-conditioned Gaussian the flow's
  // last fit reaches its tolerance, and the final warm-up adapts the low-rank Fisher metric
  // (asked: diag), whichever map the trials kept. The draws keep the target's variances.
  auto target = make_target({{"name", "rotated_icg"}, {"dim", 4}, {"seed", 3}}, kF64);
  Nuts nuts{NutsOptions()};
  RunOptions ro;
  ro.set_chains(4).set_warmup(500).set_draws(300).set_metric(MetricAdapt::kDiag);
  TransportOptions t;
  t.layers = 2;
  t.rounds = 3;
  TransportRun tr = run_with_transport(*target, nuts, ro, t, 9);
  ASSERT_TRUE(tr.result.complete);
  const nlohmann::json& choice = tr.report["choice"];
  const double last_loss = tr.report["rounds"].back()["fit"]["loss_end"];
  std::cout << "  last fit's loss " << last_loss << ", choice " << choice.dump() << "\n";
  EXPECT_LE(last_loss, FitOptions().tolerance);
  ASSERT_TRUE(choice.contains("final_metric")) << choice.dump();
  EXPECT_EQ(choice["final_metric"].get<std::string>().rfind("fisher-lowrank", 0), 0u) << choice.dump();
  ASSERT_TRUE(target->reference_moments().has_value());
  EXPECT_EQ(test_support::moments_within(tr.result.draws, target->reference_moments()->mean, target->reference_moments()->sd), "");
}

TEST(Transport, ResetLayersLeavesTheAffineBase) {
  // reset_layers() sets the coupling layers back to the identity: T is then its base map alone,
  // as a flow without coupling layers with the same base computes it.
  FlowTransport flow = perturbed_flow(5, 4, 0.3, 11);
  FlowTransport base(FlowOptions().set_dim(5).set_layers(0));
  base->set_base(flow->named_parameters()["shift"], flow->named_parameters()["log_scale"]);
  torch::Tensor z = torch::randn({6, 5}, make_generator(12), kF64);
  ASSERT_GT((flow->forward(z).out - base->forward(z).out).abs().max().item<double>(), 1e-3);  // perturbed
  flow->reset_layers();
  const TransportPass a = flow->forward(z), b = base->forward(z);
  EXPECT_LT((a.out - b.out).abs().max().item<double>(), 1e-12);
  EXPECT_LT((a.log_det - b.log_det).abs().max().item<double>(), 1e-12);
}

namespace {
/// NUTS through a 2-layer flow (4 rounds) on the strongly correlated 2-d Gaussian (sds 10 and
/// 0.32 rotated by pi/4) from chains started 8 x 10^5 out: the next two tests' run (at 2 x 10^4
/// out the second round's fit ended at 66 on an AMD EPYC, at 0.87 on a Xeon: the premise of
/// both tests depended on the CPU; this far out the first two fits end at the clip, 10^4).
TransportRun scg_from_far_out(int64_t arrival_round, double transient_loss = TransportRules().transient_loss) {
  auto target = make_target({{"name", "scg"}}, kF64);
  Nuts nuts{NutsOptions()};
  RunOptions ro;
  ro.set_chains(4).set_warmup(600).set_draws(400).set_metric(MetricAdapt::kDiag);
  ro.init_x = 2000.0 * torch::tensor({{400.0, -380.0}, {-390.0, 410.0}, {395.0, -400.0}, {-405.0, 385.0}}, kF64);
  TransportOptions t;
  t.layers = 2;
  t.rounds = 4;
  t.arrival_round = arrival_round;
  t.rules.transient_loss = transient_loss;
  return run_with_transport(*target, nuts, ro, t, 3);
}
}  // namespace

TEST(Transport, RoundsInTheTransientLoseTheirLayers) {
  // Note [Transport warm-up]: chains started 8 x 10^5 out on the strongly correlated 2-d
  // Gaussian (sds 10 and 0.32 rotated by pi/4) are still arriving after the first round (the
  // second round's fit ends at the clip, 10^4); a later round whose fit ends above
  // TransportRules().transient_loss drops its coupling layers and its states, and the run still ends on the
  // target. Every round but the last is flagged exactly when its loss says so; the broken
  // variant, the rule switched off (transient_loss = infinity), must fail that check.
  // The first two fits end far out: with the restart on the rounds would start again (next test).
  auto flags_follow_the_losses = [](const json& rounds) {
    bool follow = !rounds[0]["transient"].get<bool>() && !rounds[rounds.size() - 1]["transient"].get<bool>();
    for (size_t r = 1; r + 1 < rounds.size(); ++r) {
      const bool above = !(rounds[r]["fit"]["loss_end"].get<double>() <= TransportRules().transient_loss);
      follow = follow && rounds[r]["transient"].get<bool>() == above;
    }
    return follow;
  };
  TransportRun tr = scg_from_far_out(/*arrival_round=*/0);
  ASSERT_TRUE(tr.result.complete);
  const json& rounds = tr.report["rounds"];
  ASSERT_EQ(rounds.size(), 4u);
  std::cout << "  rounds " << rounds.dump() << "\n";
  int transient = 0;
  for (size_t r = 1; r + 1 < rounds.size(); ++r) transient += rounds[r]["transient"].get<bool>();
  EXPECT_TRUE(flags_follow_the_losses(rounds));
  EXPECT_GE(transient, 1) << "the test's premise: a later round still in the transient";
  EXPECT_FALSE(flags_follow_the_losses(scg_from_far_out(0, std::numeric_limits<double>::infinity()).report["rounds"]))
      << "the rule switched off passes the check";
  EXPECT_EQ(test_support::moments_within(tr.result.draws, torch::zeros({2}, kF64), torch::full({2}, std::sqrt(50.05), kF64)), "");
}

TEST(Transport, FarOutTwiceStartsTheRoundsAgain) {
  // Note [Far out twice]: the previous test's chains (8 x 10^5 out on the strongly correlated 2-d
  // Gaussian) end the first two rounds with fits far out (above TransportRules().far_out_loss); with the default
  // arrival_round the rounds start again once from where the chains are, with a first round of
  // that length: the record keeps the two abandoned rounds, the warm-up runs their iterations
  // longer, every gradient counts, and the run ends on the target.
  ASSERT_EQ(TransportOptions().arrival_round, kDefaultArrivalRound);
  TransportRun tr = scg_from_far_out(kDefaultArrivalRound);
  ASSERT_TRUE(tr.result.complete);
  const json& rounds = tr.report["rounds"];
  std::cout << "  rounds " << rounds.dump() << "\n  restarted " << tr.report.value("restarted", json()).dump() << "\n";
  ASSERT_EQ(rounds.size(), 6u);
  EXPECT_GT(rounds[0]["fit"]["loss_end"].get<double>(), TransportRules().far_out_loss);
  EXPECT_GT(rounds[1]["fit"]["loss_end"].get<double>(), TransportRules().far_out_loss);
  EXPECT_TRUE(rounds[1].value("restarted_after", false));
  EXPECT_EQ(rounds[2]["iterations"].get<int64_t>(), kDefaultArrivalRound);
  for (size_t r = 2; r < rounds.size(); ++r) EXPECT_FALSE(rounds[r].contains("restarted_after")) << r;  // once
  ASSERT_TRUE(tr.report.contains("restarted"));
  const int64_t extra = rounds[1]["iterations"].get<int64_t>() + kDefaultArrivalRound;
  EXPECT_EQ(tr.report["restarted"]["warmup_iterations"].get<int64_t>(), 600 + extra);
  int64_t round_grads = 0;
  for (const json& r : rounds) round_grads += r["grads_per_chain"].get<int64_t>();
  EXPECT_GT(tr.result.grads_warmup, round_grads);  // the abandoned rounds count, and the final warm-up
  EXPECT_EQ(test_support::moments_within(tr.result.draws, torch::zeros({2}, kF64), torch::full({2}, std::sqrt(50.05), kF64)), "");
}

// Note [The transport's options]: one choice in two JSON forms, its rules written once, and the
// run's options made from it with the command's own default rounds.
TEST(Transport, OneChoiceOfTheTransportForEveryCommand) {
  using nlohmann::json;
  const TransportChoice kind_only = json("flow").get<TransportChoice>();
  EXPECT_EQ(kind_only.kind, TransportKind::kFlow);
  EXPECT_FALSE(kind_only.layers || kind_only.rounds || kind_only.hidden);
  const TransportChoice full = json{{"kind", "auto"}, {"layers", 2}, {"rounds", 3}, {"global_moves", true}}.get<TransportChoice>();
  EXPECT_EQ(full.kind, TransportKind::kAuto);
  EXPECT_EQ(full.layers.value_or(-1), 2);
  EXPECT_EQ(full.rounds.value_or(-1), 3);
  EXPECT_TRUE(full.global_moves);
  EXPECT_EQ(json(full).get<TransportChoice>().rounds.value_or(-1), 3);  // written and read back
  EXPECT_EQ(json(TransportChoice())["layers"], json());                 // unset: null, the key named
  for (const json& bad : {json{{"kind", "flow"}, {"layer", 2}}, json{{"kind", "flow"}, {"layers", 2.5}},
                          json{{"kind", "spline"}}, json(3), json{{"kind", "flow"}, {"global_moves", "yes"}}}) {
    EXPECT_THROW(bad.get<TransportChoice>(), UsageError) << bad.dump();
  }
  // the rules
  EXPECT_NO_THROW(check_transport_choice(full, /*sampling=*/true, "sample"));
  EXPECT_THROW(check_transport_choice(TransportChoice().set_layers(8), true, "sample"), UsageError);
  EXPECT_THROW(check_transport_choice(TransportChoice().set_global_moves(true), true, "sample"), UsageError);
  EXPECT_THROW(check_transport_choice(full, /*sampling=*/false, "config"), UsageError);  // no global moves in training
  EXPECT_THROW(check_transport_choice(TransportChoice().set_kind(TransportKind::kFlow).set_rounds(0), true, "sample"), UsageError);
  EXPECT_THROW(check_transport_choice(TransportChoice().set_kind(TransportKind::kFlow).set_rounds(31), true, "sample"), UsageError);
  EXPECT_THROW(check_transport_choice(TransportChoice().set_kind(TransportKind::kFlow).set_layers(-1), true, "sample"), UsageError);
  // the run's options: the command's default rounds where none is set, the engine's fit gradient
  const TransportOptions sample = transport_options(TransportChoice().set_kind(TransportKind::kFlow), kDefaultTransportRounds);
  EXPECT_EQ(sample.rounds, kDefaultTransportRounds);
  EXPECT_EQ(sample.layers, kDefaultTransportLayers);
  EXPECT_TRUE(sample.fit.own_gradient);
  EXPECT_EQ(transport_options(TransportChoice().set_kind(TransportKind::kFlow), kTrainTransportRounds).rounds, kTrainTransportRounds);
  TransportChoice reference = full;
  reference.engine = Engine::kLibTorch;
  const TransportOptions given = transport_options(reference, kDefaultTransportRounds);
  EXPECT_EQ(given.rounds, 3);
  EXPECT_EQ(given.layers, 2);
  EXPECT_TRUE(given.global_moves);
  EXPECT_FALSE(given.fit.own_gradient);
}
