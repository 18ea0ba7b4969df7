#include "nmcmc/io/config.hpp"

#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError("cannot open config '" + path + "'");
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    throw DataError("config '" + path + "' is not valid JSON: " + e.what());
  }
  // A file the target names (a TorchScript module) is relative to the config's own directory.
  if (config.is_object() && config.contains("target") && config["target"].is_object() &&
      config["target"].value("name", "") == "torchscript" && config["target"].contains("module") &&
      config["target"]["module"].is_string()) {
    const std::string module = config["target"]["module"].get<std::string>();
    if (module.rfind("memory:", 0) != 0 && std::filesystem::path(module).is_relative()) {
      config["target"]["module"] = (std::filesystem::path(path).parent_path() / module).lexically_normal().string();
    }
  }
  return config;
}

void apply_override(json& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw UsageError("--set expects key=value or section.key=value, got '" + assignment + "'");
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  json* node = &config;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (key.empty()) throw UsageError("--set: empty key in '" + assignment + "'");
    if (!node->is_object()) throw UsageError("--set: '" + path.substr(0, begin - 1) + "' is not a section");
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    node = &(*node)[key];
    if (node->is_null()) *node = json::object();
    begin = dot + 1;
  }
}

void check_known_keys(const json& given, const json& known, const std::string& what) {
  if (!given.is_object()) throw UsageError(what + " must be a JSON object");
  for (auto& [key, value] : given.items()) {
    if (!known.contains(key)) throw UsageError(what + ": option '" + key + "' is unknown");
    if (known[key].is_object() && value.is_object()) check_known_keys(value, known[key], what + "." + key);
  }
}

std::string configs_directory() {
  // configs/ sits beside data/ in the source tree and in share/nmcmc when installed.
  const fs::path beside_data = fs::path(data_directory()).parent_path() / "configs";
  if (fs::exists(beside_data / "icg.json")) return beside_data.string();
  return "configs";
}

}  // namespace nmcmc
