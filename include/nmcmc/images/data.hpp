#pragma once
/// Image data for energy-based models: IDX files (MNIST / Fashion-MNIST, plain or gzip), folders
/// of PNG/JPEG images, the 5-bit dequantisation and RealNVP's logit transform, and image grids.
//
// Note [Logit space]
// A pixel v in {0..255} is quantised to b bits, k = floor(v / 2^(8-b)) in {0..2^b - 1}, and
// dequantised with uniform noise: u = (k + U(0,1)) / 2^b in (0, 1). RealNVP's transform
// y = alpha + (1 - 2 alpha) u, x = logit(y) maps it to R (alpha = 0.05 keeps x in [-2.9, 2.9]).
// Sampling happens in x; to_unit() inverts the map for display.
#include <torch/torch.h>

#include <string>

namespace nmcmc {

/// Reads an IDX image file (magic 0x00000803, uint8) -> [N, 1, H, W] uint8. Reads gzip-compressed
/// files transparently. Throws DataError for a missing, truncated or malformed file.
torch::Tensor read_idx_images(const std::string& path, int64_t limit = 0);

/// Reads every PNG/JPEG/BMP image in a folder (sorted by name), converted to `channels` (1 or 3)
/// and resized to size x size (area averaging when shrinking, bilinear when growing)
/// -> [N, channels, size, size] uint8. Throws DataError if the folder has no readable image or a
/// file that looks like an image cannot be decoded.
torch::Tensor read_image_folder(const std::string& dir, int64_t size, int64_t channels, int64_t limit = 0);

/// Where Debian's dataset-fashion-mnist package puts its files.
std::string fashion_mnist_directory();
/// Sets the directory fashion_mnist_directory() returns (empty: /usr/share/datasets/fashion-mnist);
/// `nmcmc` and the Python package pass $NMCMC_FASHION_MNIST here.
void set_fashion_mnist_directory(const std::string& directory);

/// Loads a data set by name: "fashion-mnist" (training split, from the Debian package), the path
/// of an IDX file, or a folder of images (then resized to `size` with `channels`).
/// -> [N, C, H, W] uint8.
torch::Tensor load_image_dataset(const std::string& source, int64_t size, int64_t channels, int64_t limit = 0);

/// See Note [Logit space].
struct LogitTransform {
  int bits = 5;
  double alpha = 0.05;
  /// uint8 images [N, C, H, W] -> dequantised logit-space images (same shape), dtype of `options`.
  torch::Tensor to_logit(const torch::Tensor& images, at::Generator& gen, const torch::TensorOptions& options) const;
  /// Logit-space images -> [0, 1] (for display).
  torch::Tensor to_unit(const torch::Tensor& x) const;
};

/// A grid of images [N, 1|3, H, W] in [0, 1], `columns` per row, as a figure (PNG and SVG via
/// matplotlib, see io/plot.hpp): a title, one caption per image (or none), a label per row and a
/// caption under the grid.
void save_image_grid(const std::string& path, const torch::Tensor& images, int64_t columns, const std::string& title,
                     const std::vector<std::string>& captions = {}, const std::vector<std::string>& row_labels = {},
                     const std::string& caption = "");

}  // namespace nmcmc
