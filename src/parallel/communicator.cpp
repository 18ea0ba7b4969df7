#include "nmcmc/parallel/communicator.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "nmcmc/core/errors.hpp"

#if NMCMC_HAVE_C10D
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if NMCMC_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

namespace nmcmc::parallel {


void DistOptions::validate() const {
  if (world_size < 1) throw UsageError(fmt::format("world size must be at least 1, got {}", world_size));
  if (rank < 0 || rank >= world_size) {
    throw UsageError(fmt::format("rank {} is outside 0..{} (world size {})", rank, world_size - 1, world_size));
  }
  if (local_rank < 0) throw UsageError(fmt::format("local rank must be non-negative, got {}", local_rank));
  if (master_port < 1 || master_port > 65535) throw UsageError(fmt::format("port {} is outside 1..65535", master_port));
  if (timeout.count() <= 0) throw UsageError("the distributed timeout must be positive");
  if (backend != "auto" && backend != "gloo" && backend != "nccl") {
    throw UsageError("backend must be auto, gloo or nccl, not '" + backend + "'");
  }
}

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw IoError(std::string("cannot open a socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw IoError(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string Communicator::where() const { return fmt::format("rank {} of {}", rank(), world_size()); }

std::pair<int64_t, int64_t> block_of(int64_t n, int rank, int world) {
  const int64_t base = n / world, extra = n % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

torch::Tensor all_gather_along(Communicator& comm, const torch::Tensor& t, int64_t dim) {
  if (!t.defined()) return t;
  const bool is_bool = t.scalar_type() == torch::kBool;
  torch::Tensor local = (is_bool ? t.to(torch::kUInt8) : t).transpose(0, dim).contiguous();
  torch::Tensor all = comm.all_gather_rows(local).transpose(0, dim).contiguous();
  return is_bool ? all.to(torch::kBool) : all;
}

std::vector<double> all_reduce_doubles(Communicator& comm, std::vector<double> values) {
  if (comm.world_size() == 1) return values;
  std::vector<torch::Tensor> t = {torch::tensor(values, torch::kFloat64)};
  comm.all_reduce_sum(t);
  auto a = t[0].accessor<double, 1>();
  for (size_t k = 0; k < values.size(); ++k) values[k] = a[static_cast<int64_t>(k)];
  return values;
}

namespace {
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(std::vector<torch::Tensor>&) override { ++stats_.calls; }
  torch::Tensor all_gather_rows(const torch::Tensor& rows) override {
    ++stats_.calls;
    return rows;
  }
  void broadcast(torch::Tensor&, int) override { ++stats_.calls; }
  void barrier() override {}
};
}  // namespace

std::shared_ptr<Communicator> single_process() { return std::make_shared<SingleProcess>(); }

#if NMCMC_HAVE_C10D
namespace {
// Templated on the concrete group (ProcessGroupGloo, ProcessGroupNCCL) rather than held as a
// c10d::ProcessGroup: in LibTorch 1.13 they derive from ProcessGroup, in 2.x from c10d::Backend,
// and both offer these collectives with these signatures.
template <typename Group>
class C10dCommunicator final : public Communicator {
 public:
  /// `device`: where the group's tensors must live (CPU for Gloo, the rank's GPU for NCCL); inputs
  /// elsewhere are copied there and results back.
  C10dCommunicator(c10::intrusive_ptr<Group> group, c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                   std::chrono::milliseconds timeout, torch::Device device)
      : group_(std::move(group)), store_(std::move(store)), rank_(rank), world_(world), timeout_(timeout),
        device_(device) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_reduce_sum(std::vector<torch::Tensor>& tensors) override {
    // One flat buffer per dtype (and device): a handful of large messages, as DDP's buckets.
    std::map<std::pair<int, std::string>, std::vector<size_t>> groups;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (!tensors[k].defined()) continue;
      groups[{static_cast<int>(tensors[k].scalar_type()), tensors[k].device().str()}].push_back(k);
    }
    for (auto& [key, members] : groups) {
      std::vector<torch::Tensor> flat;
      for (size_t k : members) flat.push_back(tensors[k].detach().reshape({-1}));
      std::vector<torch::Tensor> buffer = {torch::cat(flat).to(device_)};
      run("all-reduce", buffer[0].numel() * buffer[0].element_size(), [&] {
        c10d::AllreduceOptions o;
        o.timeout = timeout_;
        return group_->allreduce(buffer, o);
      });
      int64_t offset = 0;
      for (size_t k : members) {
        const int64_t n = tensors[k].numel();
        tensors[k].detach().copy_(buffer[0].narrow(0, offset, n).view(tensors[k].sizes()).to(tensors[k].device()));
        offset += n;
      }
    }
  }

  torch::Tensor all_gather_rows(const torch::Tensor& rows) override {
    TORCH_CHECK(rows.dim() >= 1, "all_gather_rows: need at least one dimension");
    torch::Tensor local = rows.to(device_).contiguous();
    // The row counts first, then equal-sized (padded) blocks.
    std::vector<torch::Tensor> n = {torch::tensor({local.size(0)}, torch::kInt64).to(local.device())};
    std::vector<std::vector<torch::Tensor>> counts(1);
    for (int r = 0; r < world_; ++r) counts[0].push_back(torch::empty_like(n[0]));
    run("all-gather", 8, [&] { return group_->allgather(counts, n); });
    std::vector<int64_t> sizes;
    int64_t most = 0;
    for (auto& c : counts[0]) {
      sizes.push_back(c.to(torch::kCPU).item<int64_t>());
      most = std::max(most, sizes.back());
    }
    std::vector<int64_t> shape = local.sizes().vec();
    shape[0] = most;
    std::vector<torch::Tensor> padded = {torch::zeros(shape, local.options())};
    if (local.size(0) > 0) padded[0].narrow(0, 0, local.size(0)).copy_(local);
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < world_; ++r) out[0].push_back(torch::empty(shape, local.options()));
    run("all-gather", padded[0].numel() * padded[0].element_size(), [&] { return group_->allgather(out, padded); });
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < world_; ++r) parts.push_back(out[0][r].narrow(0, 0, sizes[r]));
    return torch::cat(parts).to(rows.device());
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<torch::Tensor> t = {tensor.to(device_).contiguous()};
    run("broadcast", t[0].numel() * t[0].element_size(), [&] {
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = timeout_;
      return group_->broadcast(t, o);
    });
    if (!t[0].is_same(tensor)) tensor.copy_(t[0]);
  }

  void barrier() override {
    run("barrier", 0, [&] {
      c10d::BarrierOptions o;
      o.timeout = timeout_;
      return group_->barrier(o);
    });
  }

 private:
  template <typename F>
  void run(const char* what, int64_t bytes, F&& start) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      auto work = start();
      work->wait(timeout_);
    } catch (const std::exception& e) {
      throw DistError(fmt::format("{}: {} failed: another process of the run died, hung longer than the {} s "
                                  "timeout or cut the connection ({})",
                                  where(), what, timeout_.count() / 1000, first_line(e.what())));
    }
    ++stats_.calls;
    stats_.bytes += bytes;
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  c10::intrusive_ptr<Group> group_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  torch::Device device_;
};
}  // namespace
#endif

bool have_c10d() { return NMCMC_HAVE_C10D != 0; }
bool have_nccl() { return NMCMC_HAVE_NCCL != 0; }

std::shared_ptr<Communicator> connect(const DistOptions& options, const torch::Device& device) {
  options.validate();
  if (options.world_size == 1) return single_process();
#if NMCMC_HAVE_C10D
  const bool cuda = device.is_cuda();
  std::string backend = options.backend == "auto" ? (cuda ? "nccl" : "gloo") : options.backend;
  if (backend == "nccl" && !cuda) throw UsageError("backend nccl needs --device cuda");
  if (backend == "gloo" && cuda) backend = "gloo";  // Gloo also reduces CUDA tensors (through the host)
#if !NMCMC_HAVE_NCCL
  if (backend == "nccl") throw UsageError("this nmcmc was built without NCCL (LibTorch without CUDA): use backend gloo");
#endif
  const std::string who = fmt::format("rank {} of {}", options.rank, options.world_size);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = options.world_size;
    so.waitWorkers = true;
    so.timeout = options.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
  } catch (const std::exception& e) {
    throw DistError(fmt::format("{}: rendezvous at {}:{} failed within {} s: {}", who, options.master_addr,
                                options.master_port, options.timeout.count() / 1000,
                                std::string(e.what()).substr(0, std::string(e.what()).find('\n'))));
  }
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nmcmc/", store);
    std::shared_ptr<Communicator> comm;
#if NMCMC_HAVE_NCCL
    if (backend == "nccl") {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = options.timeout;
      auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, options.rank, options.world_size, o);
      comm = std::make_shared<C10dCommunicator<c10d::ProcessGroupNCCL>>(group, store, options.rank, options.world_size,
                                                                        options.timeout, device);
    }
#endif
    if (!comm) {
      auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
      if (!options.gloo_interface.empty()) {
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface));
      } else if (options.master_addr == "127.0.0.1" || options.master_addr == "localhost") {
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank, options.world_size, o);
      comm = std::make_shared<C10dCommunicator<c10d::ProcessGroupGloo>>(group, store, options.rank, options.world_size,
                                                                        options.timeout, torch::Device(torch::kCPU));
    }
    comm->barrier();
    comm->reset_stats();
    return comm;
  } catch (const DistError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError(fmt::format("{}: joining the {} process group failed: {}", who, backend,
                                std::string(e.what()).substr(0, std::string(e.what()).find('\n'))));
  }
#else
  (void)device;
  throw UsageError("this nmcmc was built without c10d (LibTorch's distributed headers and Debian's libgloo-dev): "
                   "it runs on one process only");
#endif
}

}  // namespace nmcmc::parallel
