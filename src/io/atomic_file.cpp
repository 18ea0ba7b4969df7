#include "nmcmc/io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "nmcmc/core/errors.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw IoError("cannot write '" + tmp + "'");
      write(out);
      out.flush();
      if (!out) throw IoError("error while writing '" + tmp + "' (disk full?)");
    }
    int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw IoError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

void ensure_directory(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec || !fs::is_directory(path)) throw IoError("cannot create directory '" + path + "'" + (ec ? ": " + ec.message() : ""));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace nmcmc
