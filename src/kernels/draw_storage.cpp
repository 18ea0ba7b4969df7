// Where a run's draws live: what they need of memory and scratch disk, the scratch file they live
// in when they do not fit in RAM, and the per-draw copy into their record.
#include "draw_storage.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <fcntl.h>
#include <unistd.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/kernels/run.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

namespace {
constexpr double kStateCopiesPerChain = 32;  // [C, D] tensors a kernel keeps alive (NUTS: its trees' buffers, ~20)
constexpr double kStatBytesPerDraw = 48;     // lp, accept, divergent, n_grad, tree depth, energy per chain

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  return std::numeric_limits<double>::infinity();
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(int64_t{1} << 30)); }
}  // namespace

RunFootprint estimate_footprint(const RunOptions& o, int64_t dim, int64_t dtype_bytes) {
  const double c = static_cast<double>(o.chains), s = static_cast<double>(o.draws), d = static_cast<double>(dim);
  RunFootprint f;
  f.memory_bytes = kStateCopiesPerChain * c * d * static_cast<double>(dtype_bytes) + kStatBytesPerDraw * s * c;
  const double draws = o.keep_draws ? s * c * d * 8.0 : 0.0;
  if (draws > static_cast<double>(o.draws_in_memory_limit) && o.draws_in_memory_limit > 0) f.disk_bytes = draws;
  else f.memory_bytes += draws;
  return f;
}

void check_footprint(const RunOptions& o, int64_t dim, int64_t dtype_bytes) {
  const RunFootprint f = estimate_footprint(o, dim, dtype_bytes);
  const double mem = available_memory_bytes();
  if (f.memory_bytes > mem) {
    throw UsageError(fmt::format(
        "this run needs about {} of memory ({} chains x {} dimensions of sampler state, {} draws of statistics per "
        "chain) but {} is available: use fewer chains or draws",
        gib(f.memory_bytes), o.chains, dim, o.draws, gib(mem)));
  }
  if (f.disk_bytes > 0) {
    std::error_code ec;
    const fs::path dir = o.scratch_directory.empty() ? fs::temp_directory_path() : fs::path(o.scratch_directory);
    const auto space = fs::space(dir, ec);
    if (!ec && static_cast<double>(space.available) < f.disk_bytes) {
      throw UsageError(fmt::format("the draws need {} of scratch disk in '{}' but {} is free: use fewer draws or chains",
                                   gib(f.disk_bytes), dir.string(), gib(static_cast<double>(space.available))));
    }
  }
}

torch::Tensor disk_backed_tensor(torch::IntArrayRef shape, const std::string& directory) {
  fs::path dir = directory.empty() ? fs::temp_directory_path() : fs::path(directory);
  std::string pattern = (dir / "nmcmc-draws-XXXXXX").string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw IoError("cannot create a scratch file for the draws in '" + dir.string() + "'");
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  const bool sized = ::ftruncate(fd, static_cast<off_t>(numel * 8)) == 0;
  ::close(fd);
  if (!sized) {
    fs::remove(name.data());
    throw IoError("cannot size the scratch file for the draws in '" + dir.string() + "'");
  }
  torch::Tensor t = at::from_file(name.data(), /*shared=*/true, numel, torch::TensorOptions().dtype(torch::kFloat64));
  fs::remove(name.data());  // the mapping keeps the data; nothing is left behind
  return t.view(shape);
}

/// dst[i] = src (or -src), the sampling loop's per-draw copy of a [C] or [C, D] value into its
/// [S, C] or [S, C, D] record: a plain loop where both are on the CPU, dst's rows are contiguous
/// and the types are float32/float64 into float64 or the same type (a draw is 64 x 50 numbers, a
/// tensor op costs microseconds: the ops were as much as NUTS's leaves on a cheap target), else
/// the tensor ops.
void put_row(const torch::Tensor& dst, int64_t i, const torch::Tensor& src, bool negate) {
  const int64_t n = src.numel();
  const bool fast = dst.device().is_cpu() && src.device().is_cpu() && dst.is_contiguous() && src.is_contiguous() &&
                    dst.numel() / std::max<int64_t>(dst.size(0), 1) == n;
  if (fast && dst.scalar_type() == torch::kFloat64 &&
      (src.scalar_type() == torch::kFloat64 || src.scalar_type() == torch::kFloat32)) {
    double* out = dst.data_ptr<double>() + i * n;
    const double sign = negate ? -1.0 : 1.0;
    if (src.scalar_type() == torch::kFloat64) {
      const double* in = src.data_ptr<double>();
      for (int64_t j = 0; j < n; ++j) out[j] = sign * in[j];
    } else {
      const float* in = src.data_ptr<float>();
      for (int64_t j = 0; j < n; ++j) out[j] = sign * static_cast<double>(in[j]);
    }
    return;
  }
  if (fast && !negate && dst.scalar_type() == src.scalar_type()) {
    std::memcpy(static_cast<char*>(dst.data_ptr()) + i * n * static_cast<int64_t>(dst.element_size()), src.data_ptr(),
                static_cast<size_t>(n) * dst.element_size());
    return;
  }
  dst[i].copy_(negate ? -src : src);
}

}  // namespace nmcmc
