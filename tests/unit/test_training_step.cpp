// The training step's speed-ups must not change what it computes: deferred weight gradients
// (Note [Deferred weight gradients]) equal autograd's, and a whole ProposalTrainer step equals the
// plain one (autograd, clipping, torch's Adam) in float64.
// Over 500 lines: each speed-up has its own equality test here, and the objective its gradient check.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>
#include <stdexcept>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/nn/activations.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/flows/learned.hpp"
#include "nmcmc/nn/onednn_gemm.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/training/objective.hpp"
#include "nmcmc/training/proposal_trainer.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;

namespace {

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::Tensor());
  return g;
}

void clear_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
}

/// A loss that uses every sub-step's MLP twice (as the forward and reverse flow passes do) on
/// inputs that require grad; returns it and the inputs.
std::pair<torch::Tensor, torch::Tensor> mlp_loss(StepMLP& mlp, int64_t substeps, int64_t rows) {
  at::Generator gen = make_generator(5);
  torch::Tensor x = torch::randn({rows, 6}, gen, kF64).requires_grad_();
  torch::Tensor h = x;
  torch::Tensor loss = torch::zeros({}, kF64);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k = 0; k < substeps; ++k) {
      torch::Tensor out = mlp->forward(k, h);  // [rows, 6]
      loss = loss + (out * out).sum() * (0.1 * static_cast<double>(k + 1));
      h = h + 0.5 * torch::tanh(out);
    }
  }
  return {loss, x};
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].defined(), b[k].defined()) << "tensor " << k;
    if (!a[k].defined()) continue;
    const double scale = 1.0 + b[k].abs().max().item<double>();
    EXPECT_LE((a[k] - b[k]).abs().max().item<double>(), tol * scale) << "tensor " << k;
  }
}

/// A policy that leaves the rows of zero gradient out of every layer however small (Note
/// [Zero-gradient rows]: by default only in layers of 2^16 weights or more).
LinearPolicy small_layers_skip(MatmulOption matmul = MatmulOption::kNative) {
  LinearPolicy p;
  p.matmul = matmul;
  p.zero_rows_min_layer = 0;
  return p;
}

StepMLP random_mlp() {
  StepMLP mlp(3, 6, 16, 6, 2, Activation::kElu, true, small_layers_skip());
  mlp->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  at::Generator gen = make_generator(9);
  for (auto& p : mlp->parameters()) p.add_(0.3 * torch::randn(p.sizes(), gen, kF64));  // output layers start at zero
  return mlp;
}
}  // namespace

// Inside a scope the weight gradients of all uses are accumulated and handed over by flush():
// equal to autograd's to rounding, inputs' gradients unchanged. Without flush() the weights have
// no gradient at all (so the comparison can fail), the scope refuses create_graph and nesting,
// and a graph that outlives its scope gets ordinary gradients.
TEST(DeferredWeightGrads, EqualAutogradsGradients) {
  StepMLP mlp = random_mlp();
  auto [ref_loss, ref_x] = mlp_loss(mlp, 3, 7);
  ref_loss.backward();
  const std::vector<torch::Tensor> ref = grads_of(*mlp);
  const torch::Tensor ref_dx = ref_x.grad().clone();
  for (const auto& g : ref) ASSERT_TRUE(g.defined());

  clear_grads(*mlp);
  {
    DeferredWeightGrads deferred;
    auto [loss, x] = mlp_loss(mlp, 3, 7);
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-12);
    loss.backward();
    EXPECT_EQ(deferred.pending(), 8);  // 3 input layers, 2 shared, 3 output layers
    std::vector<torch::Tensor> before = grads_of(*mlp);
    int64_t missing = 0;
    for (const auto& g : before) missing += g.defined() ? 0 : 1;
    EXPECT_EQ(missing, 16);  // every weight and bias waits for flush()
    deferred.flush();
    EXPECT_EQ(deferred.pending(), 0);
    expect_close(grads_of(*mlp), ref, 1e-12);
    EXPECT_LE((x.grad() - ref_dx).abs().max().item<double>(), 1e-12);

    // A second backward pass in the same scope accumulates, as autograd does.
    auto [loss2, x2] = mlp_loss(mlp, 3, 7);
    loss2.backward();
    deferred.flush();
    std::vector<torch::Tensor> twice;
    for (const auto& g : ref) twice.push_back(2 * g);
    expect_close(grads_of(*mlp), twice, 1e-12);

    EXPECT_THROW(DeferredWeightGrads nested, std::logic_error);
    auto [loss3, x3] = mlp_loss(mlp, 3, 7);
    EXPECT_THROW(torch::autograd::grad({loss3}, {x3}, {}, /*retain_graph=*/true, /*create_graph=*/true),
                 std::exception);
  }
  // The scope has ended: a graph recorded inside it gets ordinary gradients.
  clear_grads(*mlp);
  torch::Tensor late;
  {
    DeferredWeightGrads deferred;
    late = mlp_loss(mlp, 3, 7).first;
  }
  late.backward();
  expect_close(grads_of(*mlp), ref, 1e-12);
  // Under no_grad nothing is recorded.
  {
    DeferredWeightGrads deferred;
    torch::NoGradGuard no_grad;
    mlp->forward(0, torch::randn({4, 6}, kF64));
    EXPECT_EQ(deferred.pending(), 0);
  }
}

// Note [Zero-gradient rows]: rows whose output gradient is zero are left out of the backward
// products inside a training step's scope. The gradients equal those of the other rows alone
// (computed with skipping off), and the skipping is seen to happen.
TEST(DeferredWeightGrads, ZeroGradientRowsAreLeftOutExactly) {
  StepMLP mlp = random_mlp();
  at::Generator gen = make_generator(11);
  const torch::Tensor x_all = torch::randn({16, 6}, gen, kF64);
  const torch::Tensor mask = torch::zeros({16}, torch::kBool);
  const std::vector<int64_t> live = {1, 4, 5, 9, 14};
  for (int64_t i : live) mask[i] = true;
  auto loss_of = [&](const torch::Tensor& x, const torch::Tensor& m) {
    torch::Tensor h = x, per_row = torch::zeros({x.size(0)}, kF64);
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k = 0; k < 3; ++k) {
        torch::Tensor out = mlp->forward(k, h);
        per_row = per_row + (out * out).sum(1) * (0.1 * static_cast<double>(k + 1));
        h = h + 0.5 * torch::tanh(out);
      }
    }
    return torch::where(m, per_row, torch::zeros_like(per_row)).sum();
  };
  // Reference: only the live rows, every row multiplied.
  LinearPolicy every_row = small_layers_skip();
  every_row.skip_zero_gradient_rows = false;
  mlp->set_policy(every_row);
  const torch::Tensor idx = torch::tensor(live, torch::kLong);
  torch::Tensor x_live = x_all.index_select(0, idx).clone().requires_grad_();
  loss_of(x_live, torch::ones({5}, torch::kBool)).backward();
  const std::vector<torch::Tensor> ref = grads_of(*mlp);
  const torch::Tensor ref_dx = x_live.grad().clone();
  for (const auto& g : ref) ASSERT_TRUE(g.defined());
  mlp->set_policy(small_layers_skip());

  clear_grads(*mlp);
  const uint64_t skipped = test_hooks::zero_gradient_rows_skipped();
  torch::Tensor x = x_all.clone().requires_grad_();
  {
    DeferredWeightGrads deferred;  // a training step's scope
    loss_of(x, mask).backward();
    deferred.flush();
  }
  // 24 uses (2 passes x 3 sub-steps x 4 layers), each with 11 rows of zero output gradient
  EXPECT_EQ(test_hooks::zero_gradient_rows_skipped() - skipped, 24u * 11);
  expect_close(grads_of(*mlp), ref, 1e-12);
  EXPECT_LE((x.grad().index_select(0, idx) - ref_dx).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(x.grad().index_select(0, (~mask).nonzero().squeeze(1)).abs().max().item<double>(), 0.0);
  // By default layers this small (16 x 16) multiply every row: leaving rows out would save less
  // than the gathers cost.
  {
    mlp->set_policy(LinearPolicy());
    clear_grads(*mlp);
    const uint64_t before = test_hooks::zero_gradient_rows_skipped();
    torch::Tensor x2 = x_all.clone().requires_grad_();
    {
      DeferredWeightGrads deferred;
      loss_of(x2, mask).backward();
      deferred.flush();
    }
    EXPECT_EQ(test_hooks::zero_gradient_rows_skipped(), before);
    expect_close(grads_of(*mlp), ref, 1e-12);
  }
  // The setting is the model's, not the process's: another model in the same process is unaffected.
  StepMLP other = random_mlp();
  EXPECT_EQ(other->policy().zero_rows_min_layer, 0);
  EXPECT_EQ(LinearPolicy().zero_rows_min_layer, int64_t{1} << 16);
}

// A whole training step (deferred weight gradients, zero-gradient rows left out,
// gradients dropped rather than zeroed) equals the plain one: the objective, autograd's backward pass, clip_grad_norm_ and
// torch's Adam, for the full and the Langevin variant in float64.
TEST(ProposalTrainer, StepEqualsThePlainAutogradStep) {
  auto target = make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1}}, kF64);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    SCOPED_TRACE(variant_name(v));
    auto opts = LearnedOptions().set_dim(5).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.3);
    LearnedSampler fast = test_support::perturbed_sampler(opts, 21);
    LearnedSampler plain = test_support::perturbed_sampler(opts, 21);
    fast->to(torch::kFloat64);
    plain->to(torch::kFloat64);
    fast->set_linear_policy(small_layers_skip(opts.matmul));
    auto adam = torch::optim::AdamOptions(1e-2);
    const double clip = 0.5;  // small enough that clipping acts
    ProposalTrainer trainer(fast.ptr(), adam, BetaController(0.5, 1e-3, 1e3, 0.3, 0.7), clip);
    torch::optim::Adam reference(plain->parameters(), adam);
    at::Generator data = make_generator(3), g1 = make_generator(7), g2 = make_generator(7);
    double beta = 0.5;
    const uint64_t skipped = test_hooks::zero_gradient_rows_skipped();
    for (int step = 0; step < 4; ++step) {
      torch::Tensor x = target->sample(9, data);
      auto [u, grad] = target->energy_and_grad(x);
      TrainingStep s = trainer.step(*target, {{x, u, grad, &g1}}, true, *parallel::single_process());
      ASSERT_FALSE(s.skipped);

      reference.zero_grad();
      ObjectiveTerms t = entropy_objective(*target, *plain, x, u, grad, beta, g2, true);
      t.loss.backward();
      torch::nn::utils::clip_grad_norm_(plain->parameters(), clip);
      reference.step();
      beta = BetaController(beta, 1e-3, 1e3, 0.3, 0.7).update(t.accept);
      EXPECT_NEAR(s.loss, t.loss_value, 1e-10 * (1 + std::abs(t.loss_value)));
    }
    // Rows accepted with probability one left the reverse pass's products (Note [Zero-gradient
    // rows]); the plain step, outside a scope, multiplied every row.
    EXPECT_GT(test_hooks::zero_gradient_rows_skipped(), skipped);
    auto pf = fast->parameters(), pp = plain->parameters();
    ASSERT_EQ(pf.size(), pp.size());
    double moved = 0;
    for (size_t k = 0; k < pf.size(); ++k) {
      EXPECT_LE((pf[k] - pp[k]).abs().max().item<double>(), 1e-9 * (1 + pp[k].abs().max().item<double>())) << k;
    }
    LearnedSampler start = test_support::perturbed_sampler(opts, 21);
    start->to(torch::kFloat64);
    auto p0 = start->parameters();
    for (size_t k = 0; k < pf.size(); ++k) moved = std::max(moved, (pf[k] - p0[k]).abs().max().item<double>());
    EXPECT_GT(moved, 1e-3);  // the steps moved the weights: the equality is not of two idle models
  }
}

// ---- Note [Bfloat16 matmul] ----

TEST(Bfloat16Matmul, OptionsAreCheckedAndResolved) {
  using M = MatmulOption;
  EXPECT_THROW(parse_enum<MatmulOption>("fast"), UsageError);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 4}, {"matmul", "bf16"}}), UsageError);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 4}, {"gemm", "mkl"}}), UsageError);
  EXPECT_THROW(LearnedOptions::from_json({{"dim", 4}, {"matmul", 1}}), UsageError);
  EXPECT_EQ(LearnedOptions::from_json({{"dim", 4}}).matmul, M::kAuto);
  EXPECT_EQ(LearnedOptions::from_json({{"dim", 4}}).gemm, GemmBackend::kAuto);
  EXPECT_EQ(LearnedOptions::from_json(LearnedOptions().set_dim(4).set_matmul(M::kBFloat16).to_json()).matmul, M::kBFloat16);
  EXPECT_EQ(LearnedOptions().set_dim(4).set_gemm(GemmBackend::kLibTorch).to_json().at("gemm"), "libtorch");
  const torch::Tensor f32 = torch::zeros({2, 2}), f64 = torch::zeros({2, 2}, kF64);
  EXPECT_EQ(resolve_matmul(M::kNative, f32), Matmul::kNative);
  EXPECT_EQ(resolve_matmul(M::kBFloat16, f32), Matmul::kBFloat16);
  EXPECT_EQ(resolve_matmul(M::kBFloat16, f64), Matmul::kBFloat16);
  EXPECT_EQ(resolve_matmul(M::kAuto, f64), Matmul::kNative);  // auto never lowers a float64 model
  const bool fast = cpu_has_fast_bf16_matmul();
  {
    torch::AutoGradMode training(true);  // auto trains in the model's own precision
    EXPECT_EQ(resolve_matmul(M::kAuto, f32), Matmul::kNative);
    EXPECT_EQ(resolve_matmul(M::kBFloat16, f32), Matmul::kBFloat16);
    EXPECT_EQ(matmul_dtype_name(M::kAuto, torch::kFloat32, torch::kCPU, true), "float32");
    EXPECT_EQ(matmul_dtype_name(M::kBFloat16, torch::kFloat32, torch::kCPU, true), "bfloat16");
  }
  {
    torch::NoGradGuard sampling;  // and samples in bfloat16 where that is fast
    EXPECT_EQ(resolve_matmul(M::kAuto, f32), fast ? Matmul::kBFloat16 : Matmul::kNative);
    EXPECT_EQ(resolve_matmul(M::kAuto, f64), Matmul::kNative);
    EXPECT_EQ(resolve_matmul(M::kNative, f32), Matmul::kNative);
  }
  EXPECT_EQ(matmul_dtype_name(M::kAuto, torch::kFloat32, torch::kCPU, false), fast ? "bfloat16" : "float32");
  EXPECT_EQ(matmul_summary(M::kAuto, torch::kFloat32, torch::kCPU),
            fast ? "float32 in training, bfloat16 in sampling" : "float32");
  EXPECT_EQ(matmul_summary(M::kBFloat16, torch::kFloat32, torch::kCPU), "bfloat16");
  EXPECT_EQ(matmul_summary(M::kNative, torch::kFloat64, torch::kCPU), "float64");
}

namespace {
/// Whether /proc/cpuinfo lists AVX-512 BW (LibTorch's oneDNN bfloat16 GEMMs need it).
bool cpu_has_avx512bw() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" avx512bw") != std::string::npos;
  }
  return false;
}
}  // namespace

// The product is a bfloat16 GEMM's (bfloat16 operands, accumulated by LibTorch's kernel, result
// rounded to bfloat16) plus the bias; the cached weight copies follow in-place updates and set_data.
TEST(Bfloat16Matmul, LinearMultipliesInBfloat16AndFollowsWeightUpdates) {
  torch::NoGradGuard no_grad;
  at::Generator gen = make_generator(3);
  torch::Tensor x = torch::randn({9, 40}, gen, torch::TensorOptions());
  torch::Tensor w = torch::randn({40, 24}, gen, torch::TensorOptions());
  torch::Tensor b = torch::randn({24}, gen, torch::TensorOptions());
  auto reference = [&](const torch::Tensor& weight, bool transposed) {  // float32 products of the rounded operands
    torch::Tensor wr = (transposed ? weight.t() : weight).to(torch::kBFloat16).to(torch::kFloat);
    return x.to(torch::kBFloat16).to(torch::kFloat).mm(wr);
  };
  WeightCache cache;  // the layer's: its copies must follow the weight
  const LinearPolicy bf16{MatmulOption::kBFloat16};
  auto check = [&](const torch::Tensor& weight, bool transposed) {
    torch::Tensor out = linear(x, weight, b, transposed, bf16, &cache);
    ASSERT_EQ(out.scalar_type(), torch::kFloat);
    torch::Tensor exact = reference(weight, transposed);
    const double scale = exact.abs().max().item<double>();
    // the result is the rounded product: within one bfloat16 ulp (2^-8 relative) of it where
    // LibTorch 1.13 multiplies bfloat16 with oneDNN (float32 accumulation: CPUs with AVX-512); its
    // fallback kernel on other CPUs accumulates in bfloat16, a few ulps over 40 terms (2.8 on an
    // AMD EPYC with AVX2 only)
    const double ulps = cpu_has_avx512bw() ? 2.0 : 16.0;
    EXPECT_LE(((out - b) - exact).abs().max().item<double>(), scale * ulps * std::pow(2.0, -8));
    // and it is not the float32 product of the unrounded operands
    torch::Tensor native = linear(x, weight, b, transposed, LinearPolicy{MatmulOption::kNative, GemmBackend::kLibTorch});
    EXPECT_GT((out - native).abs().max().item<double>(), scale * 1e-5);
    EXPECT_LE((out - native).abs().max().item<double>(), scale * 5e-2);
  };
  check(w, false);
  check(w.t().contiguous(), true);
  w.add_(1.0);  // in place: the cached copy must not be used
  check(w, false);
  w.set_data(torch::randn({40, 24}, gen, torch::TensorOptions()));  // new storage
  check(w, false);
}

// Inside a scope the bfloat16 backward pass (bfloat16 GEMMs, weight gradients added to a float
// buffer) gives the gradients autograd computes through the casts, to bfloat16 rounding, and
// they are not the native gradients.
TEST(Bfloat16Matmul, DeferredGradientsEqualAutogradThroughTheCasts) {
  StepMLP mlp(3, 6, 16, 6, 2, Activation::kElu, true, LinearPolicy{MatmulOption::kBFloat16});
  StepMLP native(3, 6, 16, 6, 2, Activation::kElu, true, LinearPolicy{MatmulOption::kNative});
  mlp->to(torch::kFloat64);
  native->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    at::Generator gen = make_generator(9);
    auto p = mlp->parameters(), q = native->parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      p[i].add_(0.3 * torch::randn(p[i].sizes(), gen, kF64));
      q[i].copy_(p[i]);
    }
  }
  auto [ref_loss, ref_x] = mlp_loss(mlp, 3, 7);  // no scope: autograd through the casts
  ref_loss.backward();
  const std::vector<torch::Tensor> ref = grads_of(*mlp);
  const torch::Tensor ref_dx = ref_x.grad().clone();
  auto [nat_loss, nat_x] = mlp_loss(native, 3, 7);
  nat_loss.backward();
  const std::vector<torch::Tensor> nat = grads_of(*native);
  clear_grads(*mlp);
  {
    DeferredWeightGrads deferred;
    auto [loss, x] = mlp_loss(mlp, 3, 7);
    EXPECT_EQ(loss.item<double>(), ref_loss.item<double>());
    loss.backward();
    EXPECT_EQ(deferred.pending(), 8);
    deferred.flush();
    expect_close(grads_of(*mlp), ref, 1e-2);
    EXPECT_LE((x.grad() - ref_dx).abs().max().item<double>(), 1e-3 * (1.0 + ref_dx.abs().max().item<double>()));
  }
  expect_close(grads_of(*mlp), nat, 0.1);
  double gap = 0;
  const auto got = grads_of(*mlp);
  for (size_t i = 0; i < got.size(); ++i) gap = std::max(gap, (got[i] - nat[i]).abs().max().item<double>());
  EXPECT_GT(gap, 1e-6);
}

// ---- Note [Fast activations] ----

// The float32 kernels are within a few ulp of the exactly rounded functions over their whole
// range (and near zero, where expm1 matters), let NaN and infinities through, and their
// gradients are LibTorch's.
TEST(FastActivations, AccurateNanSafeAndDifferentiable) {
  std::vector<float> xs;
  for (float x = -100.0f; x < 20.0f; x += 0.000731f) xs.push_back(x);
  for (float x = -1e-3f; x < 1e-3f; x += 1.1e-7f) xs.push_back(x);
  std::vector<float> elu(xs.size()), th(xs.size());
  elu_kernel(xs.data(), elu.data(), static_cast<int64_t>(xs.size()));
  tanh_kernel(xs.data(), th.data(), static_cast<int64_t>(xs.size()));
  double worst_elu = 0, worst_tanh = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double re = x > 0 ? x : std::expm1(x), rt = std::tanh(x);
    if (re != 0) worst_elu = std::max(worst_elu, std::fabs(elu[i] - re) / (std::fabs(re) * std::pow(2.0, -24)));
    if (rt != 0) worst_tanh = std::max(worst_tanh, std::fabs(th[i] - rt) / (std::fabs(rt) * std::pow(2.0, -24)));
  }
  EXPECT_LE(worst_elu, 3.0);   // ulp (measured 1.3)
  EXPECT_LE(worst_tanh, 5.0);  // ulp (measured 2.7)
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> special = {nan, inf, -inf, 0.0f, -0.0f, 1e-30f, -1e-30f, -1000.0f, 1000.0f}, out(special.size());
  elu_kernel(special.data(), out.data(), static_cast<int64_t>(special.size()));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], inf);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[7], -1.0f);
  EXPECT_EQ(out[8], 1000.0f);
  EXPECT_FLOAT_EQ(out[6], -1e-30f);
  tanh_kernel(special.data(), out.data(), static_cast<int64_t>(special.size()));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_FLOAT_EQ(out[5], 1e-30f);
  EXPECT_EQ(out[7], -1.0f);

  at::Generator gen = make_generator(4);
  for (Activation a : {Activation::kElu, Activation::kTanh}) {
    torch::Tensor x = (2 * torch::randn({37, 65}, gen, torch::TensorOptions())).requires_grad_();
    torch::Tensor w = torch::randn({37, 65}, gen, torch::TensorOptions());
    torch::Tensor y = activate(x * 1.0, a);
    (y * w).sum().backward();
    torch::Tensor ref_x = x.detach().clone().requires_grad_();
    torch::Tensor ref = a == Activation::kElu ? torch::elu(ref_x) : torch::tanh(ref_x);
    (ref * w).sum().backward();
    EXPECT_LE((y - ref).abs().max().item<double>(), 1e-6);
    EXPECT_LE((x.grad() - ref_x.grad()).abs().max().item<double>(), 1e-5);
    torch::NoGradGuard no_grad;  // in place without a graph; float64 goes through LibTorch's
    torch::Tensor z = x.detach().clone();
    EXPECT_TRUE(activate(z, a).is_same(z));
    EXPECT_LE((z - ref).abs().max().item<double>(), 1e-6);
    torch::Tensor d = x.detach().to(torch::kFloat64);
    torch::Tensor rd = a == Activation::kElu ? torch::elu(d) : torch::tanh(d);
    EXPECT_TRUE(torch::equal(activate(d.clone(), a), rd));
  }
}

// Sampling's fused bfloat16 path (no gradients: bias, activation and cast in one pass) computes
// bit for bit what the differentiable path computes.
TEST(Bfloat16Matmul, FusedSamplingPathEqualsTheDifferentiableOne) {
  for (const bool tanh_last : {false, true}) {
    StepMLP mlp(2, 6, 48, 5, 2, Activation::kElu, tanh_last, LinearPolicy{MatmulOption::kBFloat16});
    mlp->to(torch::kFloat32);
    at::Generator gen = make_generator(11);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : mlp->parameters()) p.add_(0.3 * torch::randn(p.sizes(), gen, torch::TensorOptions()));
    }
    torch::Tensor x = 2 * torch::randn({33, 6}, gen, torch::TensorOptions());
    torch::Tensor with_graph = mlp->forward(1, x);  // parameters require grad: linear() + activate()
    ASSERT_TRUE(with_graph.requires_grad());
    torch::NoGradGuard no_grad;
    torch::Tensor fused = mlp->forward(1, x);
    EXPECT_TRUE(torch::equal(fused, with_graph.detach())) << (fused - with_graph).abs().max();
    StepMLP native(2, 6, 48, 5, 2, Activation::kElu, tanh_last, LinearPolicy{MatmulOption::kNative});
    native->to(torch::kFloat32);
    auto p = mlp->parameters(), q = native->parameters();
    for (size_t i = 0; i < p.size(); ++i) q[i].copy_(p[i]);
    const double gap = (native->forward(1, x) - fused).abs().max().item<double>();
    EXPECT_GT(gap, 0.0);
    EXPECT_LT(gap, 0.05 * (1.0 + fused.abs().max().item<double>()));
  }
}

// Note [oneDNN GEMM]: float32 products through oneDNN with cached reordered weights equal
// LibTorch's (OpenBLAS) to float32 rounding, follow in-place and set_data updates of the weight
// (a stale cached copy fails the second and third checks), give a row the same bits whatever the
// other rows hold, and the training step's gradients (deferred, in a scope) equal OpenBLAS's.
TEST(OneDnnGemm, LinearEqualsLibTorchAndFollowsWeightUpdates) {
  if (!onednn_gemm_available()) GTEST_SKIP() << "this build has no oneDNN";
  torch::NoGradGuard no_grad;
  at::Generator gen = make_generator(13);
  torch::Tensor x = torch::randn({33, 40}, gen, torch::TensorOptions());
  torch::Tensor w = torch::randn({40, 24}, gen, torch::TensorOptions());
  torch::Tensor b = torch::randn({24}, gen, torch::TensorOptions());
  WeightCache cache;  // the layer's: its reordered copies must follow the weight
  const LinearPolicy onednn{MatmulOption::kNative, GemmBackend::kOneDnn};
  auto check = [&](const torch::Tensor& weight, bool transposed) {
    torch::Tensor out = linear(x, weight, b, transposed, onednn, &cache);
    torch::Tensor exact = torch::addmm(b.to(torch::kFloat64), x.to(torch::kFloat64),
                                       (transposed ? weight.t() : weight).to(torch::kFloat64));
    const double scale = exact.abs().max().item<double>();
    EXPECT_LE((out.to(torch::kFloat64) - exact).abs().max().item<double>(), scale * 1e-5);
  };
  check(w, false);
  torch::Tensor wt = w.t().contiguous();
  check(wt, true);
  w.add_(1.0);  // in place: the cached reordered copy must not be used
  check(w, false);
  w.set_data(torch::randn({40, 24}, gen, torch::TensorOptions()));  // new storage
  check(w, false);
  // The path is taken, and the automatic choice follows the threads (Note [oneDNN GEMM]).
  const uint64_t calls = test_hooks::onednn_gemm_calls();
  (void)linear(x, w, b, false, onednn, &cache);
  EXPECT_GT(test_hooks::onednn_gemm_calls(), calls);
  const uint64_t calls2 = test_hooks::onednn_gemm_calls();
  (void)linear(x, w, b, false, LinearPolicy{MatmulOption::kNative, GemmBackend::kLibTorch}, &cache);
  EXPECT_EQ(test_hooks::onednn_gemm_calls(), calls2);  // libtorch: not through oneDNN
  EXPECT_FALSE(onednn_gemm_enabled(GemmBackend::kLibTorch));
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_FALSE(onednn_gemm_enabled(GemmBackend::kAuto));  // two LibTorch threads: LibTorch's GEMM
  at::set_num_threads(threads);
  EXPECT_TRUE(onednn_gemm_enabled(GemmBackend::kOneDnn));
  // A row's bits do not depend on the other rows (same batch size, same place).
  torch::Tensor base = linear(x, w, b, false, onednn, &cache);
  torch::Tensor x2 = torch::randn({33, 40}, gen, torch::TensorOptions());
  x2[5] = x[5];
  x2[32] = x[32];
  torch::Tensor again = linear(x2, w, b, false, onednn, &cache);
  EXPECT_TRUE(torch::equal(again[5], base[5]));
  EXPECT_TRUE(torch::equal(again[32], base[32]));
  EXPECT_FALSE(torch::equal(again, base));
}

TEST(OneDnnGemm, TrainingGradientsEqualOpenBlasOnes) {
  if (!onednn_gemm_available()) GTEST_SKIP() << "this build has no oneDNN";
  auto run = [](bool onednn, bool skip_rows, torch::Dtype dtype = torch::kFloat32) {
    LinearPolicy policy = small_layers_skip();
    policy.gemm = onednn ? GemmBackend::kOneDnn : GemmBackend::kLibTorch;
    policy.skip_zero_gradient_rows = skip_rows;
    // wide enough that the two GEMMs sum in different orders (at width 16 they agree bit for bit)
    StepMLP mlp(3, 6, 160, 6, 2, Activation::kElu, true, policy);
    {
      torch::NoGradGuard no_grad;
      at::Generator pg = make_generator(9);
      for (auto& p : mlp->parameters()) p.add_(0.3 * torch::randn(p.sizes(), pg, kF64));
    }
    mlp->to(dtype);
    at::Generator gen = make_generator(5);
    torch::Tensor x = torch::randn({20, 6}, gen, torch::TensorOptions()).to(dtype).requires_grad_();
    {
      DeferredWeightGrads deferred;
      torch::Tensor h = x, loss = torch::zeros({}, torch::TensorOptions().dtype(dtype));
      // Some rows' outputs are left out of the loss, differently per pass, so that the backward
      // products see several row counts (Note [Zero-gradient rows]) against the cached weights.
      const torch::Tensor rows = torch::arange(20);
      for (int pass = 0; pass < 2; ++pass) {
        const torch::Tensor live = (pass == 0 ? rows.remainder(3) != 0 : rows.remainder(2) == 0).to(dtype);
        for (int64_t k = 0; k < 3; ++k) {
          torch::Tensor out = mlp->forward(k, h);
          loss = loss + ((out * out).sum(1) * (k == 2 ? live : torch::ones({20}, torch::TensorOptions().dtype(dtype)))).sum() * (0.1 * static_cast<double>(k + 1));
          h = h + 0.5 * torch::tanh(out);
        }
      }
      loss.backward();
      deferred.flush();
    }
    std::vector<torch::Tensor> g = grads_of(*mlp);
    g.push_back(x.grad().clone());
    return g;
  };
  const uint64_t skipped = test_hooks::zero_gradient_rows_skipped();
  const std::vector<torch::Tensor> with = run(true, true);
  EXPECT_GT(test_hooks::zero_gradient_rows_skipped(), skipped);
  const std::vector<torch::Tensor> without = run(false, false);  // LibTorch's GEMMs, every row
  // Both are float32 roundings of one float64 computation: oneDNN's may sum in another order, so
  // it is held to the float64 result as tightly as LibTorch's own float32 result is (within 3x,
  // and 1e-5 of the tensor's scale). A fixed 1e-4 of the scale between the two failed on a Zen 5
  // in one thread (1.01e-4): float32's rounding, not a wrong product, which is off by O(1).
  const std::vector<torch::Tensor> exact = run(false, false, torch::kFloat64);
  for (size_t k = 0; k < with.size(); ++k) {
    if (!with[k].defined()) continue;
    const torch::Tensor ref = exact[k].to(torch::kFloat64);
    const double scale = 1.0 + ref.abs().max().item<double>();
    const double err_with = (with[k].to(torch::kFloat64) - ref).abs().max().item<double>();
    const double err_without = (without[k].to(torch::kFloat64) - ref).abs().max().item<double>();
    EXPECT_LE(err_with, 3.0 * err_without + 1e-5 * scale) << "tensor " << k << ": LibTorch's float32 is off by " << err_without;
    EXPECT_LE(err_with, 1e-3 * scale) << "tensor " << k;
  }
  // They are different computations (another summation order), not the same call twice.
  double differ = 0.0;
  for (size_t k = 0; k < with.size(); ++k) {
    if (with[k].defined()) differ = std::max(differ, (with[k] - without[k]).abs().max().item<double>());
  }
  EXPECT_GT(differ, 0.0);
}

// The training objective's gradient (Note [Sampler training step]: the entropy-maximising loss
// with beta, backpropagated through the flow and, with create_graph, through the target's
// gradient) against central finite differences in float64, with common random numbers (the
// same base draws z0 for every evaluation), for the full and the Langevin variant. A wrong sign,
// a missing term or a detached path shows as a relative error far above 1e-5.
TEST(EntropyObjective, GradientMatchesFiniteDifferences) {
  auto target = make_target({{"name", "funnel"}, {"dim", 3}, {"sigma", 1}}, kF64);
  at::Generator data = make_generator(11);
  torch::Tensor x = target->sample(12, data);
  auto [u, grad] = target->energy_and_grad(x);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    SCOPED_TRACE(variant_name(v));
    LearnedSampler s = test_support::perturbed_sampler(
        LearnedOptions().set_dim(3).set_variant(v).set_hidden(8).set_steps(2).set_eps(0.4), 13, 0.5);
    s->to(torch::kFloat64);
    const double beta = 0.7;
    auto loss_at = [&](bool create_graph) {
      at::Generator g = make_generator(17);  // common random numbers
      return entropy_objective(*target, *s, x, u, grad, beta, g, create_graph);
    };
    for (auto& p : s->parameters()) p.mutable_grad() = torch::Tensor();
    ObjectiveTerms t = loss_at(true);
    ASSERT_TRUE(std::isfinite(t.loss_value));
    t.loss.backward();
    int checked = 0;
    for (auto& p : s->parameters()) {
      if (!p.grad().defined()) continue;
      torch::Tensor flat_grad = p.grad().reshape({-1});
      // A few entries of every parameter tensor: the first, the middle and the last.
      for (int64_t i : {int64_t{0}, p.numel() / 2, p.numel() - 1}) {
        const double h = 1e-5;
        torch::Tensor flat = p.data().view({-1});
        const double keep = flat[i].item<double>();
        double up, down;
        {
          torch::NoGradGuard no_grad;
          flat[i] = keep + h;
        }
        up = loss_at(true).loss_value;
        {
          torch::NoGradGuard no_grad;
          flat[i] = keep - h;
        }
        down = loss_at(true).loss_value;
        {
          torch::NoGradGuard no_grad;
          flat[i] = keep;
        }
        const double fd = (up - down) / (2 * h), ad = flat_grad[i].item<double>();
        EXPECT_NEAR(ad, fd, 1e-5 * (1 + std::abs(fd))) << "parameter entry " << i << " of a " << p.sizes() << " tensor";
        ++checked;
      }
    }
    EXPECT_GT(checked, 10);
  }
}

// ---- Note [Non-finite rows in training] ----

namespace {
/// N(0, I) in 4-d whose energy is NaN where x0 > 1 (a density that overflows or raises there).
class Holey : public Target {
 public:
  explicit Holey(bool hole) : Target(kF64), hole_(hole) {}
  std::string name() const override { return "holey"; }
  int64_t dim() const override { return 4; }
  nlohmann::json spec() const override { return {{"name", "holey"}}; }

 protected:
  torch::Tensor compute_energy(const torch::Tensor& x) const override {
    torch::Tensor u = 0.5 * (x * x).sum(1);
    if (!hole_) return u;
    return torch::where(x.select(1, 0) > 1.0, torch::full_like(u, NAN), u);
  }

 private:
  bool hole_;
};
}  // namespace

// A row whose proposal meets a non-finite energy counts as rejected and adds exactly nothing to the
// gradient: the gradient equals the one of the same batch on the target without the hole with
// those rows masked out of the loss (the other rows' computations are the same on both). Before,
// the step's gradient was NaN and the whole step was skipped.
TEST(ProposalTrainer, NonFiniteRowsAreRejectedAndAddNothing) {
  Holey holey(true), plain(false);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    SCOPED_TRACE(variant_name(v));
    auto opts = LearnedOptions().set_dim(4).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.8);
    LearnedSampler a = test_support::perturbed_sampler(opts, 5), b = test_support::perturbed_sampler(opts, 5);
    at::Generator data = make_generator(2);
    torch::Tensor x = 0.6 * torch::randn({48, 4}, data, kF64);  // finite starting rows, x0 < 1 mostly
    x.select(1, 0).clamp_max_(0.9);
    auto eg = plain.energy_and_grad(x);
    const double beta = 0.3;
    at::Generator g1 = make_generator(9), g2 = make_generator(9);
    ObjectiveTerms t = entropy_objective(holey, *a, x, eg.energy, eg.grad, beta, g1, true);
    ASSERT_GT(t.rows_bad, 0);
    ASSERT_LT(t.rows_bad, 48);
    EXPECT_TRUE(std::isfinite(t.loss_value));
    t.loss.backward();
    // the reference: the plain target, the same draws, the bad rows masked out by hand
    ObjectiveTerms r = entropy_objective(plain, *b, x, eg.energy, eg.grad, beta, g2, true);
    const Proposed& p = r.proposed;
    const torch::Tensor good = torch::isfinite(t.log_a);
    EXPECT_EQ(good.sum().item<int64_t>(), 48 - t.rows_bad);
    torch::Tensor per_x = torch::clamp_max(log_acceptance(eg.energy, p.energy_new, p.log_q_rev - p.log_q_fwd), 0.0) +
                          beta * (p.log_det + 4.0 * b->log_eps().to(torch::kFloat64));
    (-torch::where(good, per_x, torch::zeros_like(per_x)).sum() / good.sum().to(torch::kFloat64)).backward();
    auto pa = a->parameters(), pb = b->parameters();
    double largest = 0;
    for (size_t k = 0; k < pa.size(); ++k) {
      if (!pb[k].grad().defined()) continue;
      ASSERT_TRUE(pa[k].grad().defined()) << k;
      ASSERT_TRUE(torch::isfinite(pa[k].grad()).all().item<bool>()) << k;
      EXPECT_LE((pa[k].grad() - pb[k].grad()).abs().max().item<double>(), 1e-10 * (1 + pb[k].grad().abs().max().item<double>()))
          << k;
      largest = std::max(largest, pb[k].grad().abs().max().item<double>());
    }
    EXPECT_GT(largest, 1e-6);  // a real gradient, not two zeros
    // The bad rows are rejected: the buffer keeps them where they were.
    at::Generator g3 = make_generator(4);
    torch::Tensor moved = advance_rows(x, eg.energy, t, g3);
    const torch::Tensor bad = ~good;
    EXPECT_TRUE(torch::equal(moved.index({bad}), x.index({bad})));
  }
}

// Through the trainer: no step is skipped, and the bad rows are counted.
TEST(ProposalTrainer, StepsWithNonFiniteRowsAreNotSkipped) {
  Holey holey(true);
  auto opts = LearnedOptions().set_dim(4).set_hidden(16).set_steps(1).set_eps(0.8);
  LearnedSampler s = test_support::perturbed_sampler(opts, 6);
  ProposalTrainer trainer(s.ptr(), torch::optim::AdamOptions(1e-3), BetaController(0.3, 1e-3, 1e3, 0.03, 0.7), 10.0);
  at::Generator data = make_generator(3), gen = make_generator(8);
  int64_t bad = 0;
  for (int step = 0; step < 3; ++step) {
    torch::Tensor x = 0.6 * torch::randn({64, 4}, data, kF64);
    x.select(1, 0).clamp_max_(0.9);
    auto eg = holey.energy_and_grad(x);
    TrainingStep r = trainer.step(holey, {{x, eg.energy, eg.grad, &gen}}, true, *parallel::single_process());
    EXPECT_FALSE(r.skipped) << step;
    EXPECT_TRUE(std::isfinite(r.loss)) << step;
    bad += r.rows_bad;
  }
  EXPECT_GT(bad, 0);
}
