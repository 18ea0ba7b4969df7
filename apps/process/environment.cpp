#include "nmcmc/process/environment.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/images/data.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

std::optional<std::string> environment_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {
int64_t environment_int(const char* name, int64_t fallback) {
  auto v = environment_value(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    const long long x = std::stoll(*v, &used);
    if (used != v->size()) throw std::invalid_argument(*v);
    return x;
  } catch (const std::exception&) {
    throw UsageError(fmt::format("environment variable {}='{}' is not an integer", name, *v));
  }
}
}  // namespace

void apply_environment() {
  if (auto d = environment_value("NMCMC_DATA_DIR")) set_data_directory(*d);
  if (auto d = environment_value("NMCMC_FASHION_MNIST")) set_fashion_mnist_directory(*d);
}

parallel::DistOptions dist_options_from_environment() {
  parallel::DistOptions o;
  o.world_size = static_cast<int>(environment_int("WORLD_SIZE", 1));
  o.rank = static_cast<int>(environment_int("RANK", 0));
  o.local_rank = static_cast<int>(environment_int("LOCAL_RANK", o.rank));
  o.master_addr = environment_value("MASTER_ADDR").value_or("127.0.0.1");
  o.master_port = static_cast<int>(environment_int("MASTER_PORT", 29500));
  o.timeout = std::chrono::seconds(environment_int("NMCMC_DIST_TIMEOUT", 300));
  o.gloo_interface = environment_value("GLOO_SOCKET_IFNAME").value_or("");
  o.validate();
  return o;
}

}  // namespace nmcmc
