#pragma once
/// Configuration files and command-line overrides, shared by every command that reads a config.
#include <nlohmann/json.hpp>

#include <string>

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

/// Reads a JSON configuration file (DataError if it cannot be read or is not valid JSON).
nlohmann::json read_config_file(const std::string& path);

/// Applies an override "a.b.c=value" to `config`: the value is parsed as JSON when it is JSON
/// (numbers, true/false, lists, objects, "quoted strings"), else taken as a string; the dotted
/// path creates objects as needed. UsageError for a malformed assignment. Whether the key exists
/// is for the config's parser to say.
void apply_override(nlohmann::json& config, const std::string& assignment);

/// Throws UsageError("<what>: option 'a.b' is unknown") for the first key of `given` (recursively
/// into objects) that `known` (an options struct's JSON, e.g. its defaults) does not have.
void check_known_keys(const nlohmann::json& given, const nlohmann::json& known, const std::string& what);

/// Converts `j` to an options struct with its nlohmann type macro, after check_known_keys; a
/// wrong type becomes a UsageError naming `what`. Range checks stay with the struct.
template <typename T>
T options_from_json(const nlohmann::json& j, const std::string& what) {
  check_known_keys(j, nlohmann::json(T{}), what);
  try {
    return j.get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + ": " + e.what());
  }
}


}  // namespace nmcmc
