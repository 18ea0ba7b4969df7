#pragma once
/// std::optional<T> in nlohmann::json: null when unset. Lets option structs with optional fields
/// use NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT (an absent or null key leaves it unset).
#include <nlohmann/json.hpp>

#include <optional>

namespace nlohmann {
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& value) {
    if (value) j = *value;
    else j = nullptr;
  }
  static void from_json(const json& j, std::optional<T>& value) {
    if (j.is_null()) value.reset();
    else value = j.get<T>();
  }
};
}  // namespace nlohmann
