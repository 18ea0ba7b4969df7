#pragma once
/// Error types that the command layer maps to sysexits-style exit codes.
#include <stdexcept>
#include <string>

namespace nmcmc {

/// Exit codes (sysexits.h): what the command line returns.
enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 64,     // wrong option or argument
  kExitData = 65,      // malformed data, config or checkpoint file
  kExitUnavailable = 69,  // another process of a distributed run died, hung or never joined
  kExitSoftware = 70,  // internal error
  kExitIo = 74,        // cannot write output
  kExitConfig = 78,    // bad configuration value
};

/// A wrong option or option value given by the user.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// A malformed or unreadable input file (data set, config, checkpoint).
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// An output that cannot be written.
struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// A failure whose exit code is already decided, e.g. a child process's (`reproduce --jobs`).
struct ExitError : std::runtime_error {
  ExitError(const std::string& message, int exit_code) : std::runtime_error(message), code(exit_code) {}
  int code;
};

}  // namespace nmcmc
