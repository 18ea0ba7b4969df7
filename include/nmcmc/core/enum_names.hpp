#pragma once
/// Options that take one of a few names (sampler, matmul, activation, precondition) are enums in
/// the code and names at the edges (command line, JSON configs, checkpoints, Python). An enum E
/// declares its names once, by specialising EnumNames<E>; enum_name, parse_enum and (through
/// NMCMC_ENUM_JSON) nlohmann::json then convert, and a name that is not one of them is a
/// UsageError that lists the choices (never a silently taken default).
#include <nlohmann/json.hpp>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

/// Specialise with: static constexpr const char* what = "sampler";
///                  static std::vector<std::pair<E, const char*>> values() { return {...}; }
template <typename E>
struct EnumNames;

template <typename E>
std::string enum_name(E value) {
  for (const auto& [v, name] : EnumNames<E>::values()) {
    if (v == value) return name;
  }
  throw std::logic_error(std::string("enum_name: a ") + EnumNames<E>::what + " without a name");
}

/// "a, b or c"
template <typename E>
std::string enum_choices() {
  const auto values = EnumNames<E>::values();
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) {
    s += i == 0 ? "" : i + 1 == values.size() ? " or " : ", ";
    s += values[i].second;
  }
  return s;
}

/// The value named `name`; UsageError "unknown WHAT 'name' (choose a, b or c)" otherwise.
template <typename E>
E parse_enum(const std::string& name) {
  for (const auto& [v, n] : EnumNames<E>::values()) {
    if (name == n) return v;
  }
  throw UsageError(std::string("unknown ") + EnumNames<E>::what + " '" + name + "' (choose " + enum_choices<E>() + ")");
}

/// Streams an enum's name (messages, test output).
template <typename E, typename = decltype(EnumNames<E>::values())>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << enum_name(value);
}

}  // namespace nmcmc

/// JSON as the enum's name, in the enum's namespace (found by argument-dependent lookup).
#define NMCMC_ENUM_JSON(E)                                                                         \
  inline void to_json(nlohmann::json& j, E value) { j = ::nmcmc::enum_name(value); }              \
  inline void from_json(const nlohmann::json& j, E& value) {                                       \
    if (!j.is_string()) {                                                                          \
      throw ::nmcmc::UsageError(std::string(::nmcmc::EnumNames<E>::what) + " must be a name (" +  \
                                ::nmcmc::enum_choices<E>() + "), got " + j.dump());               \
    }                                                                                              \
    value = ::nmcmc::parse_enum<E>(j.get<std::string>());                                          \
  }
