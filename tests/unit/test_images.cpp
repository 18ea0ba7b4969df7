// Images and the energy-based model (#5): loaders on good and malformed files, the logit
// transform, the convolutional flow (invertibility, log-determinant, MALA at initialisation, the
// detailed-balance identity), and the training loop (runs, changes the energy, resumes exactly).
#include <gtest/gtest.h>

#if NMCMC_STB_WRITE_IMPLEMENTATION  // no stb library (Note [A build without Debian's packages])
#define STB_IMAGE_WRITE_IMPLEMENTATION
#endif
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/images/conv_sampler.hpp"
#include "nmcmc/images/data.hpp"
#include "nmcmc/images/ebm.hpp"
#include "nmcmc/targets/targets.hpp"
#include "stats.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "nmcmc_images_" + name; }

/// Bytes of an IDX image file of n images h x w with pixel (i, r, c) = (7 i + 3 r + c) % 256.
std::string idx_bytes(int n, int h, int w) {
  std::string b = {0, 0, 8, 3};
  for (int v : {n, h, w}) {
    b.push_back(static_cast<char>((v >> 24) & 255));
    b.push_back(static_cast<char>((v >> 16) & 255));
    b.push_back(static_cast<char>((v >> 8) & 255));
    b.push_back(static_cast<char>(v & 255));
  }
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < h; ++r)
      for (int c = 0; c < w; ++c) b.push_back(static_cast<char>((7 * i + 3 * r + c) % 256));
  return b;
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

ConvSampler random_conv_sampler(const ConvSamplerOptions& o, uint64_t seed, double scale = 0.3) {
  return test_support::perturbed_conv_sampler(o, seed, scale);
}

ConvSamplerOptions tiny_conv(int64_t c, int64_t h, int64_t w) {
  ConvSamplerOptions o;
  o.channels = c;
  o.height = h;
  o.width = w;
  o.filters = 6;
  o.layers = 3;
  o.steps = 2;
  o.eps = 0.3;
  return o;
}

json gaussian_spec(int64_t d) {
  json scales = json::array();
  for (int64_t i = 0; i < d; ++i) scales.push_back(0.5 + 0.1 * static_cast<double>(i % 7));
  return {{"name", "gaussian"}, {"scales", scales}};
}
}  // namespace

TEST(ImageData, IdxPlainAndGzipReadTheSamePixels) {
  const std::string bytes = idx_bytes(5, 3, 4);
  write_bytes(temp_path("a.idx"), bytes);
  write_gzip(temp_path("a.idx.gz"), bytes);
  for (const auto& path : {temp_path("a.idx"), temp_path("a.idx.gz")}) {
    torch::Tensor t = read_idx_images(path);
    ASSERT_EQ(t.sizes(), (std::vector<int64_t>{5, 1, 3, 4})) << path;
    EXPECT_EQ(t[2][0][1][3].item<int>(), (7 * 2 + 3 * 1 + 3) % 256);
    EXPECT_EQ(read_idx_images(path, 2).size(0), 2);
  }
  EXPECT_EQ(load_image_dataset(temp_path("a.idx.gz"), 0, 0).size(0), 5);
}

TEST(ImageData, MalformedIdxFilesAreDataErrors) {
  const std::string good = idx_bytes(4, 3, 3);
  std::string bad_magic = good;
  bad_magic[2] = 9;
  std::string labels = good;
  labels[3] = 1;  // a label file (1 dimension)
  write_bytes(temp_path("trunc.idx"), good.substr(0, good.size() - 5));
  write_bytes(temp_path("header.idx"), good.substr(0, 9));
  write_bytes(temp_path("magic.idx"), bad_magic);
  write_bytes(temp_path("labels.idx"), labels);
  write_bytes(temp_path("empty.idx"), "");
  write_gzip(temp_path("trunc.idx.gz"), good.substr(0, good.size() - 1));
  for (const char* name : {"trunc.idx", "header.idx", "magic.idx", "labels.idx", "empty.idx", "trunc.idx.gz", "missing.idx"}) {
    EXPECT_THROW(read_idx_images(temp_path(name)), DataError) << name;
  }
}

TEST(ImageData, FolderOfPngsResizedToGrayOrColour) {
  const std::string dir = temp_path("folder");
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Two 8x6 RGB images: a red one and a horizontal grey ramp; a text file that is ignored.
  std::vector<unsigned char> red(8 * 6 * 3), ramp(8 * 6 * 3);
  for (int i = 0; i < 8 * 6; ++i) {
    red[3 * i] = 255;
    for (int k = 0; k < 3; ++k) ramp[3 * i + k] = static_cast<unsigned char>((i % 8) * 32);
  }
  ASSERT_TRUE(stbi_write_png((dir + "/a.png").c_str(), 8, 6, 3, red.data(), 8 * 3));
  ASSERT_TRUE(stbi_write_png((dir + "/b.png").c_str(), 8, 6, 3, ramp.data(), 8 * 3));
  std::ofstream(dir + "/notes.txt") << "not an image";
  torch::Tensor rgb = read_image_folder(dir, 4, 3);
  ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
  EXPECT_EQ(rgb[0][0].min().item<int>(), 255);  // red stays red
  EXPECT_EQ(rgb[0][1].max().item<int>(), 0);
  EXPECT_LT(rgb[1][0][0][0].item<int>(), rgb[1][0][0][3].item<int>());  // the ramp survives the resize
  torch::Tensor grey = read_image_folder(dir, 16, 1);
  ASSERT_EQ(grey.sizes(), (std::vector<int64_t>{2, 1, 16, 16}));
  // Malformed: a file named .png that is not one; an empty folder; a missing folder.
  std::ofstream(dir + "/c.png") << "garbage";
  EXPECT_THROW(read_image_folder(dir, 4, 3), DataError);
  fs::create_directories(temp_path("empty_folder"));
  EXPECT_THROW(read_image_folder(temp_path("empty_folder"), 4, 1), DataError);
  EXPECT_THROW(read_image_folder(temp_path("no_such_folder"), 4, 1), DataError);
  EXPECT_THROW(read_image_folder(dir, 4, 2), UsageError);
}

TEST(ImageData, LogitTransformRoundTripsWithinOneQuantisationStep) {
  at::Generator gen = make_generator(3);
  torch::Tensor img = torch::arange(256, torch::kInt64).to(torch::kUInt8).reshape({4, 1, 8, 8});
  LogitTransform tf;
  torch::Tensor x = tf.to_logit(img, gen, kF64);
  EXPECT_TRUE(torch::isfinite(x).all().item<bool>());
  EXPECT_LT(x.abs().max().item<double>(), 2.95);  // alpha = 0.05 bounds the logits
  torch::Tensor back = tf.to_unit(x);
  torch::Tensor want = torch::floor(img.to(torch::kFloat64) / 8) / 32;  // the 5-bit bin's lower edge
  EXPECT_GE((back - want).min().item<double>(), -1e-9);
  EXPECT_LE((back - want).max().item<double>(), 1.0 / 32 + 1e-9);
}

TEST(ConvSampler, ShapesInverseAndLogDet) {
  auto o = tiny_conv(2, 3, 2);  // D = 12, so the Jacobian is small
  auto s = random_conv_sampler(o, 5, 1.0);
  at::Generator gen = make_generator(6);
  torch::Tensor x = torch::randn({3, 12}, gen, kF64), z0 = torch::randn({3, 12}, gen, kF64);
  {
    torch::NoGradGuard no_grad;
    FlowPass f = s->forward_flow(x, z0);
    ASSERT_EQ(f.z.sizes(), z0.sizes());
    ASSERT_EQ(f.log_det.sizes(), (std::vector<int64_t>{3}));
    EXPECT_GT((f.z - z0).abs().max().item<double>(), 1e-3);
    FlowPass b = s->inverse_flow(x, f.z);
    EXPECT_LT((b.z - z0).abs().max().item<double>(), 1e-12);
    EXPECT_LT((b.log_det - f.log_det).abs().max().item<double>(), 1e-12);
  }
  torch::Tensor zin = z0[0].clone().requires_grad_(true);
  torch::Tensor out = s->forward_flow(x.narrow(0, 0, 1), zin.unsqueeze(0)).z.squeeze(0);
  torch::Tensor jac = torch::zeros({12, 12}, kF64);
  for (int i = 0; i < 12; ++i) jac[i] = torch::autograd::grad({out[i]}, {zin}, {}, true)[0];
  const double logdet = std::log(std::abs(torch::linalg_det(jac).item<double>()));
  torch::NoGradGuard no_grad;
  const double flow = s->forward_flow(x.narrow(0, 0, 1), z0.narrow(0, 0, 1)).log_det.item<double>();
  EXPECT_GT(std::abs(flow), 1e-3);
  EXPECT_NEAR(flow, logdet, 1e-10);
  // The checkerboard: half the pixels, alternating.
  EXPECT_EQ(s->mask().sum().item<double>(), 6.0);
  EXPECT_EQ(s->mask()[0][0][0][0].item<double>() + s->mask()[0][0][0][1].item<double>(), 1.0);
}

TEST(ConvSampler, EqualsMalaAtInitialisationAndCountsOneGradient) {
  auto target = make_target(gaussian_spec(16), kF64);
  auto o = tiny_conv(1, 4, 4);
  ConvSampler s(o);
  s->to(torch::kFloat64);
  at::Generator g1 = make_generator(8), g2 = make_generator(8), g0 = make_generator(9);
  torch::Tensor x = torch::randn({5, 16}, g0, kF64);
  auto eg = target->energy_and_grad(x);
  target->reset_counters();
  torch::NoGradGuard no_grad;
  Proposed p = s->propose(*target, x, eg.grad, g1, false);
  EXPECT_EQ(target->grad_evals(), 1);
  torch::Tensor z0 = randn({5, 16}, g2, kF64);
  torch::Tensor mala = x + 0.3 * z0 - 0.5 * 0.09 * eg.grad;
  EXPECT_LT((p.x_new - mala).abs().max().item<double>(), 1e-13);
  EXPECT_LT(p.log_det.abs().max().item<double>(), 1e-15);
}

TEST(ConvSampler, DetailedBalanceIdentity) {
  // The forward pass's log q(x'|x) and log q(x|x') equal the inverse-pass densities.
  auto target = make_target(gaussian_spec(16), kF64);
  auto s = random_conv_sampler(tiny_conv(1, 4, 4), 11);
  at::Generator gen = make_generator(12);
  torch::NoGradGuard no_grad;
  torch::Tensor x = target->sample(7, gen);
  auto eg = target->energy_and_grad(x);
  Proposed p = s->propose(*target, x, eg.grad, gen, false);
  torch::Tensor fwd = s->log_density(*target, x, eg.grad, p.x_new);
  torch::Tensor rev = s->log_density(*target, p.x_new, p.grad_new, x);
  EXPECT_LT((fwd - p.log_q_fwd).abs().max().item<double>(), 1e-9);
  EXPECT_LT((rev - p.log_q_rev).abs().max().item<double>(), 1e-9);
  EXPECT_GT((p.log_q_rev - p.log_q_fwd).abs().max().item<double>(), 1e-3);  // not trivially symmetric
}

TEST(EnergyNet, ShapesAndGradient) {
  for (auto [c, h, w] : {std::tuple{1, 28, 28}, std::tuple{3, 8, 8}, std::tuple{1, 4, 6}}) {
    EnergyNet net(c, h, w, 8, 1);
    EbmTarget t(net, c, h, w, kF64);
    at::Generator gen = make_generator(2);
    torch::Tensor x = torch::randn({3, c * h * w}, gen, kF64);
    auto eg = t.energy_and_grad(x);
    ASSERT_EQ(eg.energy.sizes(), (std::vector<int64_t>{3})) << c << h << w;
    ASSERT_EQ(eg.grad.sizes(), x.sizes());
    EXPECT_TRUE(torch::isfinite(eg.grad).all().item<bool>());
    EXPECT_GT(eg.grad.abs().max().item<double>(), 0.0);
  }
}

namespace {
EbmOptions tiny_ebm_options() {
  EbmOptions o = EbmOptions::from_json({{"dtype", "float64"}}, "smoke");
  o.buffer = 32;
  o.iterations = 6;
  return o;
}
torch::Tensor tiny_images() {
  return torch::arange(16 * 64, torch::kInt64).remainder(256).to(torch::kUInt8).reshape({16, 1, 8, 8});
}
}  // namespace

TEST(EbmTraining, IterationsRunAndChangeTheEnergy) {
  EbmOptions o = tiny_ebm_options();
  for (const std::string sampler : {"learned", "mala"}) {
    o.sampler = sampler;
    EbmTrainer tr(o, tiny_images());
    torch::Tensor probe = tr.data_batch(4);
    torch::Tensor e0 = tr.target().energy(probe).detach().clone();
    for (int i = 0; i < 4; ++i) {
      EbmStats s = tr.iterate();
      EXPECT_TRUE(std::isfinite(s.accept)) << sampler;
      EXPECT_TRUE(std::isfinite(s.entropy)) << sampler;
    }
    EXPECT_GT(tr.log().back().updates, 0) << sampler;
    torch::Tensor e1 = tr.target().energy(probe).detach();
    EXPECT_GT((e1 - e0).abs().max().item<double>(), 1e-6) << sampler;  // the EBM learnt something
    EXPECT_GT(tr.log().back().grads_sampling, 0) << sampler;
  }
}

TEST(EbmTraining, ResumeContinuesBitForBit) {
  EbmOptions o = tiny_ebm_options();
  EbmTrainer full(o, tiny_images());
  for (int i = 0; i < 4; ++i) full.iterate();
  EbmTrainer first(o, tiny_images());
  for (int i = 0; i < 2; ++i) first.iterate();
  const std::string ckpt = temp_path("ebm.pt");
  first.save(ckpt);
  EbmTrainer resumed(o, tiny_images());
  resumed.load(ckpt);
  for (int i = 0; i < 2; ++i) resumed.iterate();
  EXPECT_TRUE(torch::equal(full.buffer(), resumed.buffer()));
  EXPECT_EQ(full.log().back().updates, resumed.log().back().updates);
  // A corrupt or foreign checkpoint is a DataError, and so is a different configuration.
  std::ofstream(temp_path("corrupt.pt")) << "not a checkpoint";
  EXPECT_THROW(resumed.load(temp_path("corrupt.pt")), DataError);
  EbmOptions other = o;
  other.ebm_filters = 4;
  EbmTrainer different(other, tiny_images());
  EXPECT_THROW(different.load(ckpt), DataError);
}

TEST(EbmTraining, OptionsAreValidated) {
  EXPECT_THROW(EbmOptions::from_json({{"sampler", "gibbs"}}), UsageError);
  EXPECT_THROW(EbmOptions::from_json({{"frobnicate", 1}}), UsageError);
  EXPECT_THROW(EbmOptions::from_json({{"conv", {{"nope", 1}}}}), UsageError);
  EXPECT_THROW(EbmOptions::from_json({{"neg_batch", 20000}}), UsageError);
  EXPECT_THROW(EbmOptions::from_json({{"lr", "fast"}}), UsageError);
  EXPECT_THROW(EbmOptions::from_json({}, "gpu"), UsageError);
  EXPECT_EQ(EbmOptions::from_json({}, "paper").iterations, 100000);
  EXPECT_EQ(EbmOptions::from_json({}, "paper").conv.filters, 64);
}
