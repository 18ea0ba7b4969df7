#include "nmcmc/io/checkpoint.hpp"

#include <filesystem>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"

namespace nmcmc {

torch::serialize::InputArchive open_checkpoint(const std::string& path, const std::string& what,
                                               const torch::Device& device) {
  if (!std::filesystem::exists(path)) throw DataError(what + " '" + path + "' does not exist");
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(path, device);
  } catch (const std::exception&) {
    throw DataError(what + " '" + path + "' is truncated or corrupt (cannot be read as an nmcmc " + what + ")");
  }
  return ar;
}

nlohmann::json read_checkpoint_meta(torch::serialize::InputArchive& ar, const std::string& path,
                                    const std::string& what, const std::string& format) {
  c10::IValue meta;
  if (!ar.try_read("meta", meta) || !meta.isString()) throw DataError("'" + path + "' is not an nmcmc " + what + " (no metadata)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(meta.toStringRef());
  } catch (const std::exception&) {
    throw DataError(what + " '" + path + "' has corrupt metadata");
  }
  if (j.value("format", "") != format) throw DataError("'" + path + "' is not an nmcmc " + what);
  return j;
}

void write_checkpoint(const std::string& path, torch::serialize::OutputArchive& ar, const nlohmann::json& meta) {
  ar.write("meta", c10::IValue(meta.dump()));
  write_atomically(path, [&](std::ostream& os) { ar.save_to(os); });
}

}  // namespace nmcmc
