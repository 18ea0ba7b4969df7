#pragma once
/// A process-wide text setting that the program sets (from its environment: apps/process/
/// environment.hpp) and the library reads, e.g. where the shipped data are. Thread-safe.
#include <mutex>
#include <string>

namespace nmcmc {

class Setting {
 public:
  void set(const std::string& value) {
    std::lock_guard<std::mutex> lock(mutex_);
    value_ = value;
  }
  /// The value set, or `fallback` where none (or an empty one) was.
  std::string get_or(const std::string& fallback) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return value_.empty() ? fallback : value_;
  }

 private:
  mutable std::mutex mutex_;
  std::string value_;
};

}  // namespace nmcmc
