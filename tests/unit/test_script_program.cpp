// nmcmc's own evaluator for TorchScript energies (Note [Native engine]): for every operation it
// covers, a module's energy and gradient on the evaluator ("native") against the same module on
// LibTorch's autograd ("libtorch"), on random batches of several sizes; what it does not cover
// runs on LibTorch with the reason; float32 runs get float64 results rounded.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/targets/torchscript.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string save(const std::string& name, const std::string& forward_source,
                 const std::function<void(torch::jit::Module&)>& extra = nullptr) {
  fs::path dir = fs::temp_directory_path() / "nmcmc_test_script_program";
  fs::create_directories(dir);
  torch::jit::Module m(name);
  if (extra) extra(m);
  m.define(forward_source);
  const std::string path = (dir / (name + ".pt")).string();
  m.save(path);
  return path;
}

std::unique_ptr<Target> load(const std::string& path, int64_t dim, const std::string& engine,
                             torch::TensorOptions options = kF64, const std::string& output = "energy") {
  return make_target({{"name", "torchscript"}, {"module", path}, {"dim", dim}, {"engine", engine}, {"output", output}},
                     options);
}

const TorchScriptTarget& as_module(const Target& t) { return dynamic_cast<const TorchScriptTarget&>(t); }

/// The module's energy and gradient on both engines agree to rounding, on batches of 1, 3 and 7
/// rows drawn from N(0, 1.5^2) (seeded).
void expect_engines_agree(const std::string& name, const std::string& source, int64_t dim,
                          const std::function<void(torch::jit::Module&)>& extra = nullptr) {
  SCOPED_TRACE(name);
  const std::string path = save(name, source, extra);
  std::unique_ptr<Target> native;
  try {
    native = load(path, dim, "native");
  } catch (const UsageError& e) {
    FAIL() << e.what();
  }
  ASSERT_EQ(as_module(*native).engine(), "native") << as_module(*native).engine_note();
  auto libtorch = load(path, dim, "libtorch");
  ASSERT_EQ(as_module(*libtorch).engine(), "libtorch");
  at::Generator gen = make_generator(17);
  for (int64_t c : {1, 3, 7}) {
    const torch::Tensor x = torch::randn({c, dim}, gen, kF64) * 1.5;
    const EnergyGrad a = native->energy_and_grad(x), b = libtorch->energy_and_grad(x);
    ASSERT_EQ(a.energy.sizes(), b.energy.sizes());
    ASSERT_EQ(a.grad.sizes(), b.grad.sizes());
    EXPECT_TRUE(torch::allclose(a.energy, b.energy, 1e-12, 1e-12)) << (a.energy - b.energy).abs().max();
    EXPECT_TRUE(torch::allclose(a.grad, b.grad, 1e-11, 1e-11)) << "c=" << c << "\n" << a.grad << "\n" << b.grad;
    EXPECT_TRUE(torch::allclose(native->energy(x), b.energy, 1e-12, 1e-12));  // energy without the gradient
  }
}
}  // namespace

TEST(NativeEngine, ElementwiseArithmeticAndScalars) {
  expect_engines_agree("arith",
                       "def forward(self, x):\n"
                       "    a = (x * 2.0 + 1.0 - x / 3.0) ** 2\n"
                       "    b = (2.0 - x).exp() + 0.5 ** x + x ** 3 + torch.pow(x * x + 1.0, x * 0.25)\n"
                       "    c = torch.rsub(x, x * x, alpha=2.0) + torch.add(x, x, alpha=-0.5) - torch.sub(x, 1.5, alpha=2)\n"
                       "    d = x / (x * x + 1.0) + 3.0 / (x * x + 2.0) - x * x.sin()\n"
                       "    return (a + b + c + d).sum(-1)\n",
                       4);
}

TEST(NativeEngine, UnaryFunctions) {
  expect_engines_agree("unary",
                       "def forward(self, x):\n"
                       "    y = torch.log(x.abs() + 1.0) + torch.log1p(x * x) + torch.expm1(x * 0.3) + torch.sqrt(x * x + 1.0)\n"
                       "    y = y + torch.rsqrt(x * x + 1.0) + torch.sigmoid(x) + torch.log_sigmoid(x) + torch.tanh(x)\n"
                       "    y = y + torch.cos(x) + torch.reciprocal(x * x + 2.0) + torch.erf(x) + torch.square(x) + torch.relu(x)\n"
                       "    y = y + torch.softplus(x, 1.0, 20.0) + torch.softplus(x, 2.0, 1.0) - (-x).neg()\n"
                       "    return y.sum(-1)\n",
                       5);
}

TEST(NativeEngine, BroadcastingAgainstData) {
  at::Generator gen = make_generator(3);
  const torch::Tensor w = torch::randn({2, 50}, gen, kF64), y = torch::randn({50}, gen, kF64);
  const torch::Tensor v = torch::randn({4, 1}, gen, kF64);
  expect_engines_agree("bcast",
                       "def forward(self, x):\n"
                       "    mu = x[:, 0:2] @ self.w\n"                              // [C, 50]
                       "    r = self.y.unsqueeze(0) - mu * x[:, 2:3]\n"             // [1, 50] - [C, 50] * [C, 1]
                       "    s = x[:, 3].unsqueeze(1) + self.y\n"                    // [C, 1] + [50]
                       "    g = x.unsqueeze(1)[:, :, 0:3] * self.v\n"               // [C, 1, 3] * [4, 1] -> [C, 4, 3]
                       "    return 0.5 * (r * r).sum(-1) + s.mean(-1) + g.sum([1, 2]) + (x[:, 1:2] - x).sum(-1)\n",
                       4, [&](torch::jit::Module& m) {
                         m.register_buffer("w", w);
                         m.register_buffer("y", y);
                         m.register_buffer("v", v);
                       });
}

TEST(NativeEngine, ReductionsAndShapes) {
  expect_engines_agree("shapes",
                       "def forward(self, x):\n"
                       "    a = torch.stack([x[:, 0], x[:, -1] * 2.0, x[:, 1]], 1)\n"          // [C, 3]
                       "    b = torch.cat([x[:, 0:2], a, x[:, 4:]], 1)\n"                      // [C, 7]
                       "    c = torch.logsumexp(a, 1) + torch.logsumexp(b.view(-1, 7), -1, keepdim=True).squeeze(1)\n"
                       "    d = b.reshape(b.size(0), 7, 1).flatten(1).t().transpose(0, 1)\n"   // back to [C, 7]
                       "    e = x[:, 1::2].sum(-1) + x[:, -3:].mean(1) + x.select(1, -2)\n"
                       "    f = x[:, 0].unsqueeze(1).expand(-1, 3) * a\n"
                       "    g = torch.full_like(x, 2.0) * x + torch.ones_like(x) - torch.zeros_like(x)\n"
                       "    h = x.sum(1, keepdim=True).squeeze() if x.size(0) > 1 else x.sum(-1)\n"
                       "    return c + d.sum(-1) + e + f.sum(-1) + g.sum(-1) + h + b.contiguous().clone().sum(-1)\n",
                       6);
}

TEST(NativeEngine, MatmulSmallAndThroughBlas) {
  at::Generator gen = make_generator(4);
  const torch::Tensor small = torch::randn({4, 3}, gen, kF64), big = torch::randn({4, 3000}, gen, kF64);
  const torch::Tensor vec = torch::randn({4}, gen, kF64);
  expect_engines_agree("matmul",
                       "def forward(self, x):\n"
                       "    a = torch.tanh(x @ self.small).sum(-1)\n"
                       "    b = torch.sin(torch.matmul(x, self.big)).mean(-1)\n"  // 7 x 4 x 3000: BLAS
                       "    c = x @ self.vec + torch.mm(x, self.small)[:, 1]\n"
                       "    return a + b + c + (x * x).sum(-1) * (self.vec @ self.vec)\n",
                       4, [&](torch::jit::Module& m) {
                         m.register_buffer("small", small);
                         m.register_buffer("big", big);
                         m.register_buffer("vec", vec);
                       });
}

// Note [Native linear algebra]: a Gaussian process's kernel matrix per row, its Cholesky factor
// (lower and upper), triangular solves (lower, upper, unit diagonal, a shared matrix or a shared
// right-hand side), diagonals with offsets, batched matmul with either operand shared, eye.
TEST(NativeEngine, BatchedLinearAlgebra) {
  at::Generator gen = make_generator(5);
  const torch::Tensor w = torch::randn({4, 4}, gen, kF64) * 0.5, v = torch::randn({1, 3}, gen, kF64);
  const torch::Tensor tri = torch::randn({4, 4}, gen, kF64).tril() * 0.3 + torch::eye(4, kF64) * 2.0;
  const torch::Tensor rhs = torch::randn({4, 2}, gen, kF64), xs = torch::linspace(0.0, 3.0, 4, kF64);
  expect_engines_agree("linalg",
                       "def forward(self, x):\n"
                       "    n = x.size(1) - 2\n"
                       "    eye = torch.eye(n, dtype=x.dtype, device=x.device)\n"
                       "    b = x[:, 0:4].unsqueeze(2) * self.w\n"                                  // [C, 4, 4]
                       "    k = torch.exp(x[:, 4]).view(-1, 1, 1) * torch.exp(-0.5 * self.sq / torch.exp(x[:, 5]).view(-1, 1, 1))\n"
                       "    cov = torch.matmul(b, b.transpose(1, 2)) + k + eye\n"
                       "    l = torch.linalg_cholesky(cov)\n"
                       "    u = torch.linalg_cholesky(cov, upper=True) + torch.cholesky(cov, upper=True) - torch.cholesky(cov, True)\n"
                       "    r = x[:, 1:5].unsqueeze(2) * self.v\n"                                  // [C, 4, 3]
                       "    z = torch.linalg_solve_triangular(l, r, upper=False)\n"
                       "    zu = torch.linalg_solve_triangular(u, r, upper=True)\n"
                       "    z1 = torch.linalg_solve_triangular(l, r, upper=False, unitriangular=True)\n"
                       "    za = torch.linalg_solve_triangular(self.tri, r, upper=False)\n"          // shared A
                       "    zb = torch.linalg_solve_triangular(u, self.rhs, upper=True)\n"           // shared B
                       "    d = torch.log(torch.diagonal(l, 0, 1, 2)).sum(-1) + torch.diagonal(cov, 1, 1, 2).sum(-1)\n"
                       "    d = d + torch.diagonal(cov, -2, -2, -1).sum(-1) + torch.diagonal(u, 1, 2, 1).sum(-1)\n"
                       "    m = (self.w @ b).sum([1, 2]) + torch.sin(b @ self.w).sum([1, 2]) + (l @ z).sum([1, 2])\n"
                       "    e = (torch.eye(3, 4, dtype=x.dtype) * x[:, 0:4].unsqueeze(1)).sum([1, 2])\n"
                       "    return 0.5 * (z * z).sum([1, 2]) + (zu * z1).sum([1, 2]) + torch.tanh(za).sum([1, 2]) + zb.sum([1, 2]) + d + m + e\n",
                       6, [&](torch::jit::Module& m) {
                         m.register_buffer("w", w);
                         m.register_buffer("v", v);
                         m.register_buffer("tri", tri);
                         m.register_buffer("rhs", rhs);
                         m.register_buffer("sq", (xs.unsqueeze(0) - xs.unsqueeze(1)).pow(2));
                       });
}

// A kernel matrix that is not positive definite raises on the evaluator as on LibTorch, and only
// the rows that raise are rejected (Note [A density may fail]).
TEST(NativeEngine, ACholeskyThatFailsRejectsItsRowsOnly) {
  const std::string path = save("cholfail",
                                "def forward(self, x):\n"
                                "    cov = torch.eye(2, dtype=x.dtype) * (x.unsqueeze(2) + 2.5) + 0.1\n"
                                "    l = torch.linalg_cholesky(cov)\n"
                                "    return 2.0 * torch.log(torch.diagonal(l, 0, -2, -1)).sum(-1) + (x * x).sum(-1)\n");
  auto native = load(path, 2, "native");
  auto libtorch = load(path, 2, "libtorch");
  ASSERT_EQ(as_module(*native).engine(), "native") << as_module(*native).engine_note();
  const torch::Tensor x = torch::tensor({{0.3, -0.2}, {-2.9, 0.1}, {1.0, 2.0}}, kF64);
  const EnergyGrad a = native->energy_and_grad(x), b = libtorch->energy_and_grad(x);
  EXPECT_TRUE(std::isnan(a.energy[1].item<double>()) && torch::isnan(a.grad[1]).all().item<bool>());
  EXPECT_TRUE(std::isnan(b.energy[1].item<double>()));
  for (int64_t row : {0, 2}) {
    EXPECT_NEAR(a.energy[row].item<double>(), b.energy[row].item<double>(), 1e-12);
    EXPECT_TRUE(torch::allclose(a.grad[row], b.grad[row], 1e-12, 1e-12)) << a.grad << b.grad;
  }
  EXPECT_EQ(native->density_failures(), 1);
  EXPECT_NE(native->first_density_failure().find("positive-definite"), std::string::npos) << native->first_density_failure();
}

TEST(NativeEngine, IndexingByGroups) {
  // a hierarchical model as users write it: each observation's group effect by an int index
  at::Generator gen = make_generator(9);
  const torch::Tensor group = torch::randint(0, 5, {60}, gen, torch::kInt64), y = torch::randn({60}, gen, kF64);
  expect_engines_agree("groups",
                       "def forward(self, x):\n"
                       "    theta = x[:, 0:5]\n"
                       "    mu = theta[:, self.group] + torch.index_select(x, 1, self.pick)\n"  // [C, 60] + [C, 60]
                       "    r = self.y - mu\n"
                       "    return 0.5 * (r * r).sum(-1) + 0.5 * (theta * theta).sum(-1) + x[:, self.last].sum(-1)\n",
                       6, [&](torch::jit::Module& m) {
                         m.register_buffer("group", group);
                         m.register_buffer("y", y);
                         m.register_buffer("pick", torch::full({60}, 5, torch::kInt64));
                         m.register_buffer("last", torch::tensor({-1, 2}, torch::kInt64));
                       });
}

TEST(NativeEngine, LoopsAndBranchesOverInts) {
  // a recursion over a data series (as GARCH's and ARMA's), a while loop and an int branch
  at::Generator gen = make_generator(5);
  const torch::Tensor series = torch::randn({40}, gen, kF64);
  expect_engines_agree("loops",
                       "def forward(self, x):\n"
                       "    s = torch.zeros_like(x[:, 0])\n"
                       "    h = torch.exp(x[:, 1])\n"
                       "    for t in range(1, self.series.size(0)):\n"
                       "        r = self.series[t - 1] - x[:, 0]\n"
                       "        h = 0.1 + 0.2 * r * r + 0.5 * h\n"
                       "        z = (self.series[t] - x[:, 0]) / torch.sqrt(h)\n"
                       "        s = s + 0.5 * z * z + 0.5 * torch.log(h)\n"
                       "    k = 0\n"
                       "    while k < 3:\n"
                       "        s = s + x[:, k % 2] * x[:, 2]\n"
                       "        k += 1\n"
                       "    if x.size(1) // 2 == 1:\n"
                       "        s = s * 2.0\n"
                       "    else:\n"
                       "        s = s - 1.0\n"
                       "    return s\n",
                       3, [&](torch::jit::Module& m) { m.register_buffer("series", series); });
}

TEST(NativeEngine, LogProbOutputAndFloat32Runs) {
  const std::string path = save("logp_native", "def forward(self, x):\n    return -0.5 * (x * x / 3.0).sum(-1)\n");
  auto t = load(path, 3, "native", kF64, "log_prob");
  at::Generator gen = make_generator(6);
  const torch::Tensor x = torch::randn({4, 3}, gen, kF64);
  const EnergyGrad eg = t->energy_and_grad(x);
  EXPECT_TRUE(torch::allclose(eg.energy, 0.5 * (x * x / 3.0).sum(-1), 1e-14, 1e-14));
  EXPECT_TRUE(torch::allclose(eg.grad, x / 3.0, 1e-14, 1e-14));
  // float32: computed in float64 and rounded, so exactly the float64 result's rounding
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto t32 = load(path, 3, "auto", f32, "log_prob");
  EXPECT_EQ(as_module(*t32).engine(), "native");
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const EnergyGrad e32 = t32->energy_and_grad(x32);
  EXPECT_EQ(e32.energy.scalar_type(), torch::kFloat32);
  EXPECT_EQ(e32.grad.scalar_type(), torch::kFloat32);
  const EnergyGrad e64 = t->energy_and_grad(x32.to(torch::kFloat64));
  EXPECT_TRUE(torch::equal(e32.energy, e64.energy.to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(e32.grad, e64.grad.to(torch::kFloat32)));
  EXPECT_EQ(t32->energy_evals(), 1);
  EXPECT_EQ(t32->grad_evals(), 1);
}

TEST(NativeEngine, WhatItDoesNotCoverRunsOnLibTorchWithTheReason) {
  const std::string clamp = save("clamped", "def forward(self, x):\n    return (x.clamp(min=-1.0) ** 2).sum(-1)\n");
  auto t = load(clamp, 2, "auto");
  EXPECT_EQ(as_module(*t).engine(), "libtorch");
  EXPECT_NE(as_module(*t).engine_note().find("aten::clamp"), std::string::npos) << as_module(*t).engine_note();
  const torch::Tensor x = torch::tensor({{-2.0, 0.5}}, kF64);
  EXPECT_TRUE(torch::allclose(t->energy_and_grad(x).grad, torch::tensor({{0.0, 1.0}}, kF64)));
  try {
    load(clamp, 2, "native");
    ADD_FAILURE() << "engine native must refuse a module outside the evaluator";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run on nmcmc's evaluator"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aten::clamp"), std::string::npos) << e.what();
  }
  // an in-place operation, a data-dependent branch and a 3-d matmul are outside it too
  EXPECT_EQ(as_module(*load(save("inplace", "def forward(self, x):\n    y = x * 1.0\n    y.add_(1.0)\n    return (y * y).sum(-1)\n"),
                            2, "auto"))
                .engine(),
            "libtorch");
  // freezing would drop detach(): a module that stops gradients stays on LibTorch
  auto detached = load(save("detachx", "def forward(self, x):\n    return (x.detach() * x).sum(-1)\n"), 2, "auto");
  EXPECT_EQ(as_module(*detached).engine(), "libtorch");
  EXPECT_TRUE(torch::allclose(detached->energy_and_grad(x).grad, x));
  EXPECT_EQ(as_module(*load(save("databranch", "def forward(self, x):\n"
                                               "    if bool((x > 0).all()):\n        return x.sum(-1)\n"
                                               "    return (x * x).sum(-1)\n"),
                            2, "auto"))
                .engine(),
            "libtorch");
  auto batched = load(save("bmv", "def forward(self, x):\n    return (x.unsqueeze(1) @ self.w).view(-1)\n",
                           [](torch::jit::Module& m) { m.register_buffer("w", torch::tensor({1.0, -0.5}, kF64)); }),
                      2, "auto");
  EXPECT_EQ(as_module(*batched).engine(), "libtorch");
  EXPECT_NE(as_module(*batched).engine_note().find("matmul"), std::string::npos) << as_module(*batched).engine_note();
  // engine libtorch is honoured; an unknown engine is refused
  EXPECT_EQ(as_module(*load(save("plain", "def forward(self, x):\n    return (x * x).sum(-1)\n"), 2, "libtorch")).engine(),
            "libtorch");
  EXPECT_THROW(load(save("plain2", "def forward(self, x):\n    return (x * x).sum(-1)\n"), 2, "fast"), UsageError);
}

TEST(NativeEngine, AModuleErrorIsTheDensitysFailureRowByRow) {
  // an index out of range raises on the evaluator as on LibTorch: at every point, so the module is refused
  const std::string path = save("outofrange", "def forward(self, x):\n    return x[:, 5] * x[:, 0]\n");
  EXPECT_THROW(load(path, 2, "auto"), UsageError);
  // the training path (a differentiable gradient) stays on LibTorch and agrees
  auto t = load(save("twice", "def forward(self, x):\n    return (torch.exp(x) * x).sum(-1)\n"), 2, "native");
  torch::Tensor w = torch::ones({3, 2}, kF64).requires_grad_(true);
  const torch::Tensor x = torch::tensor({{0.1, -0.3}, {1.0, 0.5}, {-2.0, 0.0}}, kF64);
  const EnergyGrad g2 = t->energy_and_grad(x * w, /*create_graph=*/true);
  const torch::Tensor dw = torch::autograd::grad({g2.grad.sum()}, {w})[0];
  // d/dw sum(grad) with grad = e^{xw}(1 + xw): x e^{xw}(2 + xw) at w = 1
  EXPECT_TRUE(torch::allclose(dw, x * torch::exp(x) * (2.0 + x)));
  EXPECT_TRUE(torch::allclose(t->energy_and_grad(x).grad, torch::exp(x) * (1.0 + x)));
}

// LibTorch 1.13's graph executor, once it has profiled a module (from the second or third call),
// differentiates it with TorchScript's own derivative formulas, and the one for softplus with
// beta != 1 is wrong (here 1 instead of sigmoid(2 x) = 0.633 at x = 0.27). The LibTorch engine
// therefore runs the plain graph under eager autograd; without that this test fails from the
// third call on.
TEST(NativeEngine, LibTorchEngineDifferentiatesSoftplusRight) {
  auto t = load(save("softplus2", "def forward(self, x):\n    return torch.softplus(x, 2.0, 1.0).sum(-1)\n"), 1, "libtorch");
  const torch::Tensor x = torch::tensor({{0.27}, {-1.0}, {3.0}}, kF64);
  const torch::Tensor want = torch::sigmoid(2.0 * x).where(2.0 * x <= 1.0, torch::ones_like(x));
  for (int call = 0; call < 6; ++call) {
    EXPECT_TRUE(torch::allclose(t->energy_and_grad(x).grad, want, 1e-12, 1e-12)) << "call " << call;
  }
}

// Note [Native second derivatives]: training's double backward through the native engine (its
// Hessian-vector products by central differences) against LibTorch's exact one, on a loss that
// uses the energy and the gradient at points that depend on parameters; and a row whose
// difference steps out of the support (log x0 at x0 = 1e-7) falls back to the exact product.
TEST(NativeEngine, TrainingsSecondDerivativesAgreeWithLibTorch) {
  at::Generator gen = make_generator(8);
  const torch::Tensor w = torch::randn({3, 40}, gen, kF64), y = torch::randn({40}, gen, kF64);
  const std::string path = save("second", "def forward(self, x):\n"
                                          "    r = self.y - torch.tanh(x @ self.w)\n"
                                          "    return 0.5 * (r * r).sum(-1) + torch.softplus(x, 1.0, 20.0).sum(-1) + torch.log(x[:, 0] * x[:, 0] + 0.1)\n",
                                [&](torch::jit::Module& m) {
                                  m.register_buffer("w", w);
                                  m.register_buffer("y", y);
                                });
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const auto opts = torch::TensorOptions().dtype(dtype);
    auto native = load(path, 3, "native", opts), libtorch = load(path, 3, "libtorch", opts);
    const torch::Tensor base = torch::randn({6, 3}, gen, kF64).to(dtype);
    auto loss_grad = [&](Target& t) {
      torch::Tensor theta = torch::full({1, 3}, 0.7, opts).requires_grad_(true);
      const torch::Tensor x = base * theta + theta;
      const EnergyGrad eg = t.energy_and_grad(x, /*create_graph=*/true);
      const torch::Tensor x2 = x - 0.1 * eg.grad;  // a step that depends on dU, as the learned proposal's
      const torch::Tensor loss = t.energy(x2).sum() + (eg.grad * eg.grad).sum() + eg.energy.sum();
      return torch::autograd::grad({loss}, {theta})[0];
    };
    const torch::Tensor a = loss_grad(*native), b = loss_grad(*libtorch);
    const double tol = dtype == torch::kFloat64 ? 1e-7 : 2e-3;
    EXPECT_TRUE(torch::allclose(a, b, tol, tol)) << a << b;
  }
  // the support's edge: U = -log x0 + x1^2 / 2; at x0 = 1e-7 a difference step would cross zero
  auto edge = load(save("edge", "def forward(self, x):\n    return -torch.log(x[:, 0]) + 0.5 * x[:, 1] * x[:, 1]\n"), 2,
                   "native");
  torch::Tensor theta = torch::ones({1, 2}, kF64).requires_grad_(true);
  const torch::Tensor x = torch::tensor({{1e-7, 0.5}, {2.0, -1.0}}, kF64) * theta;
  const EnergyGrad eg = edge->energy_and_grad(x, true);
  const torch::Tensor d = torch::autograd::grad({(eg.grad * eg.grad).sum()}, {theta})[0];
  // d/dtheta of (1/x0^2 + x1^2) with x = c * theta at theta = 1: -2/c0^2 and 2 c1^2, summed over rows
  const torch::Tensor want = torch::tensor({{-2.0 / 1e-14 - 2.0 / 4.0, 2.0 * 0.25 + 2.0 * 1.0}}, kF64);
  EXPECT_TRUE(torch::allclose(d, want, 1e-9, 0.0)) << d << want;
}

// A module's integer buffers keep their dtype when the module is moved to the run's dtype (they
// were converted to doubles, and indexing by them failed: every such module was refused).
TEST(NativeEngine, IntegerBuffersSurviveTheRunsDtype) {
  const std::string path = save("intbuf", "def forward(self, x):\n    return (x[:, self.group] ** 2).sum(-1)\n",
                                [](torch::jit::Module& m) { m.register_buffer("group", torch::tensor({0, 0, 1}, torch::kInt64)); });
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const std::string engine : {"libtorch", "auto"}) {
      auto t = load(path, 2, engine, torch::TensorOptions().dtype(dtype));
      const torch::Tensor x = torch::tensor({{1.0, 2.0}}, torch::TensorOptions().dtype(dtype));
      const EnergyGrad eg = t->energy_and_grad(x);
      EXPECT_NEAR(eg.energy.item<double>(), 6.0, 1e-6) << engine;
      EXPECT_TRUE(torch::allclose(eg.grad, torch::tensor({{4.0, 4.0}}, torch::TensorOptions().dtype(dtype)))) << engine;
    }
  }
}
