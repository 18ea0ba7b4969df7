#include "nmcmc/io/config.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"

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
    const json& k = known[key];
    if (k.is_object() && value.is_object()) check_known_keys(value, k, what + "." + key);
    // JSON's conversions would wrap a negative number into an unsigned option (a seed of -1
    // becomes 2^64 - 1) and truncate a fraction into an integer one: refused instead.
    if (k.is_number_integer() && value.is_number_float() && value.get<double>() != std::floor(value.get<double>())) {
      throw UsageError(what + ": option '" + key + "' must be a whole number, got " + value.dump());
    }
    const bool negative = (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() < 0) ||
                          (value.is_number_float() && value.get<double>() < 0);
    if (k.is_number_unsigned() && negative) {
      throw UsageError(what + ": option '" + key + "' must be a non-negative integer, got " + value.dump());
    }
  }
}

}  // namespace nmcmc
