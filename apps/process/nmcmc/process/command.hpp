#pragma once
/// Running a child command line and reading what it printed.
#include <string>
#include <utility>

namespace nmcmc {

/// `s` quoted for a POSIX shell.
std::string shell_quote(const std::string& s);
/// Runs a command line through the shell; returns its exit code (127: not found, 128: killed by a
/// signal) and its output (stdout and stderr together).
std::pair<int, std::string> run_command(const std::string& command);

}  // namespace nmcmc
