#include "nmcmc/images/data.hpp"

#include "nmcmc/core/setting.hpp"

#include "nmcmc/io/plot.hpp"

#include <stb/stb_image.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/io/atomic_file.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

namespace {

/// gzread reads gzip and plain files alike.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : f_(gzopen(path.c_str(), "rb")) {
    if (!f_) throw DataError("cannot open '" + path + "'");
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  /// Reads exactly n bytes, or returns false.
  bool read(void* out, size_t n) {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
      const int got = gzread(f_, p, chunk);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }

 private:
  gzFile f_;
};

uint32_t big_endian(const std::array<unsigned char, 4>& b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

}  // namespace

torch::Tensor read_idx_images(const std::string& path, int64_t limit) {
  if (!fs::exists(path)) throw DataError("IDX file '" + path + "' does not exist");
  GzFile f(path);
  std::array<unsigned char, 4> word{};
  if (!f.read(word.data(), 4)) throw DataError("IDX file '" + path + "' is empty or truncated");
  if (word[0] != 0 || word[1] != 0 || word[2] != 0x08) {
    throw DataError("'" + path + "' is not an IDX file of unsigned bytes (bad magic number)");
  }
  const int ndim = word[3];
  if (ndim != 3) throw DataError("IDX file '" + path + "' has " + std::to_string(ndim) + " dimensions; images need 3");
  std::array<uint32_t, 3> dims{};
  for (auto& d : dims) {
    if (!f.read(word.data(), 4)) throw DataError("IDX file '" + path + "' is truncated in its header");
    d = big_endian(word);
  }
  if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0 || dims[1] > 4096 || dims[2] > 4096) {
    throw DataError("IDX file '" + path + "' has implausible dimensions");
  }
  int64_t n = dims[0];
  if (limit > 0) n = std::min<int64_t>(n, limit);
  torch::Tensor out = torch::empty({n, 1, int64_t(dims[1]), int64_t(dims[2])}, torch::kUInt8);
  if (!f.read(out.data_ptr<uint8_t>(), static_cast<size_t>(out.numel()))) {
    throw DataError("IDX file '" + path + "' is truncated: the header promises " + std::to_string(dims[0]) + " images of " +
                    std::to_string(dims[1]) + "x" + std::to_string(dims[2]));
  }
  return out;
}

torch::Tensor read_image_folder(const std::string& dir, int64_t size, int64_t channels, int64_t limit) {
  if (channels != 1 && channels != 3) throw UsageError("images: channels must be 1 or 3");
  if (size < 4 || size > 1024) throw UsageError("images: size must be between 4 and 1024");
  if (!fs::is_directory(dir)) throw DataError("image folder '" + dir + "' does not exist");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (limit > 0 && static_cast<int64_t>(files.size()) > limit) files.resize(static_cast<size_t>(limit));
  if (files.empty()) throw DataError("image folder '" + dir + "' has no PNG, JPEG or BMP file");
  std::vector<torch::Tensor> images;
  for (const auto& path : files) {
    int w = 0, h = 0, c = 0;
    unsigned char* px = stbi_load(path.c_str(), &w, &h, &c, static_cast<int>(channels));
    if (!px) {
      throw DataError("cannot decode image '" + path.string() + "': " + std::string(stbi_failure_reason()));
    }
    torch::Tensor t = torch::from_blob(px, {h, w, channels}, torch::kUInt8).permute({2, 0, 1}).to(torch::kFloat32);
    stbi_image_free(px);  // to() copied the pixels
    t = t.unsqueeze(0);
    namespace F = torch::nn::functional;
    if (h != size || w != size) {
      const bool shrink = h >= size && w >= size;
      auto opts = F::InterpolateFuncOptions().size(std::vector<int64_t>{size, size});
      if (shrink) opts.mode(torch::kArea);
      else opts.mode(torch::kBilinear).align_corners(false);
      t = F::interpolate(t, opts);
    }
    images.push_back(t.round().clamp(0, 255).to(torch::kUInt8));
  }
  return torch::cat(images, 0);
}

namespace {
Setting& fashion_mnist_setting() {
  static Setting s;
  return s;
}
}  // namespace

void set_fashion_mnist_directory(const std::string& directory) { fashion_mnist_setting().set(directory); }

std::string fashion_mnist_directory() { return fashion_mnist_setting().get_or("/usr/share/datasets/fashion-mnist"); }

torch::Tensor load_image_dataset(const std::string& source, int64_t size, int64_t channels, int64_t limit) {
  if (source == "fashion-mnist") {
    const fs::path dir = fashion_mnist_directory();
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"}) {
      if (fs::exists(dir / name)) return read_idx_images((dir / name).string(), limit);
    }
    throw DataError("Fashion-MNIST not found in " + dir.string() +
                    ": install Debian's package (apt-get install dataset-fashion-mnist) or set NMCMC_FASHION_MNIST");
  }
  if (fs::is_directory(source)) return read_image_folder(source, size, channels, limit);
  if (fs::exists(source)) return read_idx_images(source, limit);
  throw DataError("image data '" + source + "' is neither 'fashion-mnist', an IDX file nor a folder");
}

torch::Tensor LogitTransform::to_logit(const torch::Tensor& images, at::Generator& gen,
                                       const torch::TensorOptions& options) const {
  const double levels = std::pow(2.0, bits);
  torch::Tensor k = torch::floor(images.to(torch::kFloat64) / std::pow(2.0, 8 - bits));
  torch::Tensor u = (k + rand(images.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64))) / levels;
  torch::Tensor y = alpha + (1.0 - 2.0 * alpha) * u;
  return torch::log(y / (1.0 - y)).to(options);
}

torch::Tensor LogitTransform::to_unit(const torch::Tensor& x) const {
  return ((torch::sigmoid(x.to(torch::kFloat64)) - alpha) / (1.0 - 2.0 * alpha)).clamp(0.0, 1.0);
}

void save_image_grid(const std::string& path, const torch::Tensor& images, int64_t columns, const std::string& title,
                     const std::vector<std::string>& captions, const std::vector<std::string>& row_labels,
                     const std::string& caption) {
  TORCH_CHECK(images.dim() == 4 && (images.size(1) == 1 || images.size(1) == 3), "image grid: expected [N, 1|3, H, W]");
  TORCH_CHECK(captions.empty() || static_cast<int64_t>(captions.size()) == images.size(0), "image grid: one caption per image");
  // Three decimals are more than a PNG's 8 bits show, and keep the spec small.
  torch::Tensor px = (images.detach().to(torch::kCPU, torch::kFloat64).clamp(0, 1) * 1000.0).round() / 1000.0;
  px = images.size(1) == 1 ? px.squeeze(1) : px.permute({0, 2, 3, 1});
  px = px.contiguous();
  const int64_t n = px.size(0), per = px.numel() / std::max<int64_t>(n, 1);
  nlohmann::json list = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) {
    const double* d = px.data_ptr<double>() + i * per;
    nlohmann::json rows = nlohmann::json::array();
    const int64_t h = px.size(1), w = px.size(2), ch = images.size(1) == 1 ? 1 : 3;
    for (int64_t y = 0; y < h; ++y) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t x = 0; x < w; ++x) {
        if (ch == 1) row.push_back(d[y * w + x]);
        else row.push_back({d[(y * w + x) * 3], d[(y * w + x) * 3 + 1], d[(y * w + x) * 3 + 2]});
      }
      rows.push_back(std::move(row));
    }
    list.push_back(std::move(rows));
  }
  save_figure_spec(path, {{"type", "image_grid"}, {"title", title}, {"columns", columns}, {"images", std::move(list)},
                          {"captions", captions}, {"row_labels", row_labels}, {"caption", caption}});
}

}  // namespace nmcmc
