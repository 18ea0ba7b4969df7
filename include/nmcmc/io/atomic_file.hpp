#pragma once
/// Atomic file output: write to a temporary file beside the destination, fsync, rename.
/// A reader never sees a half-written file, and an interrupted run leaves the old one intact.
#include <fstream>
#include <functional>
#include <string>

namespace nmcmc {

/// Calls `write` on a stream to `path + ".tmp.<pid>"`, then renames it onto `path`.
/// Throws IoError (and removes the temporary) if anything fails.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

/// Creates a directory (and parents); throws IoError if it cannot.
void ensure_directory(const std::string& path);

/// Reads a whole file; throws DataError if it cannot.
std::string read_file(const std::string& path);

}  // namespace nmcmc
