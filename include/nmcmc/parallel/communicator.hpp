#pragma once
/// The one place that knows processes other than this one exist: a small collective interface over
/// LibTorch's c10d (a TCPStore rendezvous; ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA).
//
// Note [Data parallelism]
// A run over N processes ("ranks") is configured as torchrun configures PyTorch: MASTER_ADDR,
// MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (or the same as flags; `nmcmc launch` sets them for N
// local ranks). Training splits each batch into S shards with a random stream each (S = N unless
// train.shards says more: then a rank takes S/N shards in turn, accumulating gradients); the
// gradients of the summed per-row objective and the row counts are summed over ranks, so every
// rank takes the same Adam step on the gradient of the whole batch's mean (Note [Sampler training
// step]) and stays in lockstep. Sampling gives each rank a block of chains with its own seed and
// adaptation (independent runs, as Stan's chains); rank 0 gathers the draws and writes the
// summary. Every collective has a timeout: a rank that dies breaks the others' connections at
// once, one that hangs is given up on after the timeout; both end the run with a DistError.
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace nmcmc {

/// Lost contact with another process of a distributed run (it died, hung past the timeout, or
/// never joined). The command line exits with kExitUnavailable.
struct DistError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace parallel {

/// How this process joins a run.
struct DistOptions {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // rendezvous and every collective
  std::string backend = "auto";  // auto (gloo on CPU, nccl on CUDA) | gloo | nccl
  /// Gloo's network interface (empty: the loopback for a local master, else Gloo's default).
  /// The program fills these from the torchrun variables (apps/process/environment.hpp); the
  /// library reads no environment variable.
  std::string gloo_interface;
  /// UsageError unless 0 <= rank < world_size, 1 <= port <= 65535, timeout > 0.
  void validate() const;
};

/// Traffic and time spent in collectives (for the benchmarks).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;      // payload bytes this rank contributed
  double seconds = 0;     // wall time inside collectives, waiting included
};

/// Collectives over the processes of one run. All ranks must make the same calls in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_root() const { return rank() == 0; }
  /// Sums `tensors` over the ranks, in place; every rank gets the same values. The tensors are
  /// flattened into one buffer per dtype (one collective each).
  virtual void all_reduce_sum(std::vector<torch::Tensor>& tensors) = 0;
  /// Every rank's `rows` [n_r, ...] concatenated over ranks along dim 0 (n_r may differ by rank).
  virtual torch::Tensor all_gather_rows(const torch::Tensor& rows) = 0;
  /// Overwrites `tensor` with rank `root`'s (same shape and dtype on every rank).
  virtual void broadcast(torch::Tensor& tensor, int root = 0) = 0;
  virtual void barrier() = 0;
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  /// "rank r of N" (for messages).
  std::string where() const;

 protected:
  CommStats stats_;
};

/// A run of one process: every collective is the identity.
std::shared_ptr<Communicator> single_process();

/// Joins the run described by `options` (rank 0 hosts the TCPStore), with Gloo, or NCCL when
/// `device` is CUDA and the backend allows. World size 1 gives single_process(). Throws DistError
/// when the rendezvous fails or times out, UsageError when this build has no c10d (or no NCCL).
std::shared_ptr<Communicator> connect(const DistOptions& options, const torch::Device& device = torch::kCPU);

/// A TCP port on 127.0.0.1 that is free now (IoError if none can be found).
int free_local_port();

/// Whether this build can run distributed (c10d with Gloo found at build time), and with NCCL.
bool have_c10d();
bool have_nccl();

/// Sums a few doubles over the ranks (statistics, flags).
std::vector<double> all_reduce_doubles(Communicator& comm, std::vector<double> values);

/// Every rank's `t` concatenated over ranks along `dim` (the chains of `[S, C, ...]` draws along
/// 1); an undefined tensor stays undefined, a bool one travels as uint8.
torch::Tensor all_gather_along(Communicator& comm, const torch::Tensor& t, int64_t dim);

/// Rows [begin, end) of `n` rows that rank `rank` of `world` takes: contiguous blocks, the first
/// n % world ranks one row more.
std::pair<int64_t, int64_t> block_of(int64_t n, int rank, int world);

}  // namespace parallel
}  // namespace nmcmc
