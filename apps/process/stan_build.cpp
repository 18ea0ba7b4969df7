// Building Stan programs (Note [Stan programs]): translate, compile, cache.
#include "nmcmc/process/stan_build.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/process/command.hpp"
#include "nmcmc/targets/stan.hpp"

namespace nmcmc {

namespace fs = std::filesystem;

namespace {

const char* const kPackages = "r-cran-rstan r-cran-stanheaders r-cran-rcppeigen libboost-dev";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw IoError("cannot write " + path.string());
}

/// FNV-1a, 64 bits: the cache key (stable across runs and machines).
uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// Where Debian (or a user's R) keeps an R package: its directory, or "".
std::string r_package_dir(const std::string& package, const std::vector<std::string>& given) {
  std::vector<std::string> roots = given;
  for (const char* env : {"R_LIBS_USER", "R_LIBS_SITE", "R_LIBS"}) {
    if (const char* v = std::getenv(env); v && *v && given.empty()) {
      std::stringstream s(v);
      std::string item;
      while (std::getline(s, item, ':')) roots.push_back(item);
    }
  }
  if (given.empty()) {
    for (const char* r : {"/usr/local/lib/R/site-library", "/usr/lib/R/site-library", "/usr/lib/R/library"}) roots.push_back(r);
  }
  for (const std::string& r : roots) {
    if (fs::exists(fs::path(r) / package / "DESCRIPTION")) return (fs::path(r) / package).string();
  }
  return "";
}

std::string description_version(const std::string& package_dir) {
  std::istringstream in(read_file(fs::path(package_dir) / "DESCRIPTION"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Version:", 0) == 0) return line.substr(line.find_first_not_of(" ", 8));
  }
  return "unknown";
}

/// The shim and the interface header: the source tree's, else the installed copies.
struct ShimFiles {
  fs::path shim, include_dir;
};
ShimFiles shim_files() {
  if (fs::exists(NMCMC_SOURCE_STAN_SHIM)) return {NMCMC_SOURCE_STAN_SHIM, NMCMC_SOURCE_INCLUDE_DIR};
  return {NMCMC_INSTALL_STAN_SHIM, NMCMC_INSTALL_INCLUDE_DIR};
}

/// A program's name for Stan's compiler: the file stem, made an identifier.
std::string model_name(const fs::path& program) {
  std::string s = program.stem().string();
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "m_" + s;
  return s;
}

/// The compiler's message, readable: R's noise dropped, the generated model name replaced by the file.
std::string compiler_message(const std::string& output, const std::string& label) {
  std::istringstream in(output);
  std::string line, out;
  bool started = false;
  while (std::getline(in, line)) {
    if (line.find("codetools") != std::string::npos || line.find("suspicious field") != std::string::npos) continue;
    if (line.rfind("Error in ", 0) == 0 || line.rfind("Execution halted", 0) == 0) break;
    if (!started && line.find_first_not_of(" \t") == std::string::npos) continue;
    started = true;
    out += line + "\n";
  }
  out = std::regex_replace(out, std::regex("error in 'model[0-9a-f]*_[A-Za-z0-9_]*'"), "error in " + label);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.empty() ? output : out;
}

/// An exclusive lock on a file for the lifetime of the object (two runs building one program).
class FileLock {
 public:
  explicit FileLock(const fs::path& path) : fd_(::open(path.c_str(), O_CREAT | O_RDWR, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

// Note [Stan's build flags]
// A Stan program's gradient is Stan's reverse-mode autodiff: every operation allocates on its
// stack, which Debian's StanHeaders declares thread-local (each thread its own tape, whether
// STAN_THREADS is set or not; stan/shim.cpp's ensure_tape). In a shared library built with
// -fPIC the default TLS dialect reaches that stack through a call to __tls_get_addr each time (a
// tenth of nes's gradient in perf, 701 rows x 9 coefficients); TLS descriptors (gnu2, x86-64
// only: aarch64 uses descriptors already) resolve it once per thread. With -O3 as CmdStan's
// default, one gradient of nes1976 took 255 us against -O2's 465 (1.8x; hmm_example 1.5x, arK
// 1.25x, diamonds 1.05x; bench/stan_gradient.py, BENCHMARKS "Stan programs"), with the same bits:
// energies and gradients identical at 64 points of each of that bench's programs. initial-exec
// TLS was as fast, but a library loaded with dlopen takes its static TLS from a small reserve that
// many models in one process would exhaust. The dialect is GCC's option (Debian 12's clang does
// not take it), so another $CXX gets -O3 alone.
std::string default_stan_flags(const std::string& cxx) {
  const std::string name = fs::path(cxx).filename().string();
  const bool gcc = name.find("clang") == std::string::npos &&
                   (name.find("g++") != std::string::npos || name.find("gcc") != std::string::npos);
#if defined(__x86_64__)
  if (gcc) return "-O3 -mtls-dialect=gnu2";
#endif
  (void)gcc;
  return "-O3";
}

std::string default_stan_cache() {
  if (const char* v = std::getenv("NMCMC_STAN_CACHE"); v && *v) return v;
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v) return (fs::path(v) / "nmcmc" / "stan").string();
  if (const char* v = std::getenv("HOME"); v && *v) return (fs::path(v) / ".cache" / "nmcmc" / "stan").string();
  return (fs::temp_directory_path() / "nmcmc-stan-cache").string();
}

StanBuildOptions stan_build_options_from_environment() {
  StanBuildOptions o;
  o.cache_dir = default_stan_cache();
  if (const char* v = std::getenv("CXX"); v && *v) o.cxx = v;
  o.flags = default_stan_flags(o.cxx);
  if (const char* v = std::getenv("NMCMC_STAN_CXXFLAGS"); v && *v) o.flags = v;
  return o;
}

std::string build_stan_program(const std::string& program_path, const StanBuildOptions& options) {
  const fs::path program = fs::absolute(program_path).lexically_normal();
  const std::string label = program.filename().string();
  const std::string stan_headers = r_package_dir("StanHeaders", options.r_libraries);
  const std::string eigen = r_package_dir("RcppEigen", options.r_libraries);
  if (stan_headers.empty() || eigen.empty() || r_package_dir("rstan", options.r_libraries).empty()) {
    throw ExitError(fmt::format("--stan needs Stan's compiler and math library: apt-get install {} "
                                "(or run `make deps`)", kPackages), kExitUnavailable);
  }
  const std::string translated = translate_stan_syntax(read_file(program), label);
  const ShimFiles shim = shim_files();
  const std::string abi = read_file(shim.include_dir / "nmcmc" / "targets" / "stan_abi.h");
  const std::string stan_version = description_version(stan_headers);
  const std::string name = model_name(program);
  uint64_t key = fnv1a(translated);
  for (const std::string& part : {read_file(shim.shim), abi, options.cxx, options.flags, stan_version, name}) {
    key = fnv1a(part, key * 31 + 7);
  }
  const fs::path dir = fs::path(options.cache_dir) / fmt::format("{}-{:016x}", name, key);
  const fs::path library = dir / (name + ".so");
  if (fs::exists(library)) return library.string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("stan: cannot create the model cache {}: {}", dir.string(), ec.message()));
  FileLock lock(dir / "lock");
  if (fs::exists(library)) return library.string();  // built by another run while this one waited

  // 1. Stan's compiler: the program (in 2.21's syntax) to C++.
  write_file(dir / (name + ".stan"), translated);
  if (options.log) options.log(fmt::format("compiling {} with Stan {}'s compiler and g++ (about a minute; cached in {})",
                                           label, stan_version, dir.string()));
  const std::string stanc = fmt::format(
      "Rscript --vanilla -e {}",
      shell_quote(fmt::format("suppressMessages(library(rstan)); r <- stanc(file = '{}', model_name = '{}', verbose = FALSE); "
                              "cat(r$cppcode, file = '{}')",
                              (dir / (name + ".stan")).string(), name, (dir / (name + ".hpp")).string())));
  auto [code, output] = run_command(stanc);
  if (code == 127) throw ExitError(fmt::format("--stan needs Rscript: apt-get install {}", kPackages), kExitUnavailable);
  if (code != 0 || !fs::exists(dir / (name + ".hpp"))) {
    throw DataError(fmt::format("stan: {} does not compile:\n{}", program.string(), compiler_message(output, label)));
  }
  // 2. The C++ with the shim, against Stan's headers, into a shared library (written aside, then
  // renamed: an interrupted build leaves no library behind).
  const fs::path partial = dir / (name + ".so.partial");
  const std::string cxx = fmt::format(
      "{} -std=c++14 {} -fPIC -shared -fvisibility=hidden -Wl,-Bsymbolic -DNDEBUG -DEIGEN_NO_DEBUG -DBOOST_DISABLE_ASSERTS "
      "-D_REENTRANT -DBOOST_MATH_OVERFLOW_ERROR_POLICY=errno_on_error -w -I{} -I{} -I{} -I{} -include {} {} -o {} {}",
      options.cxx, options.flags, shell_quote(stan_headers + "/include/src"), shell_quote(stan_headers + "/include"),
      shell_quote(eigen + "/include"), shell_quote(shim.include_dir.string()), shell_quote((dir / (name + ".hpp")).string()),
      shell_quote(shim.shim.string()), shell_quote(partial.string()), shell_quote(stan_headers + "/lib/libStanHeaders.a"));
  std::tie(code, output) = run_command(cxx);
  if (code != 0) {
    fs::remove(partial, ec);
    throw DataError(fmt::format("stan: {} translated, but its C++ did not compile ({}):\n{}", program.string(), options.cxx,
                                output.substr(0, 4000)));
  }
  fs::rename(partial, library, ec);
  if (ec) throw IoError(fmt::format("stan: cannot write {}: {}", library.string(), ec.message()));
  return library.string();
}

void register_stan_builder(std::function<void(const std::string&)> log) {
  StanBuildOptions options = stan_build_options_from_environment();
  options.log = std::move(log);
  set_stan_builder([options](const std::string& program) { return build_stan_program(program, options); });
}

}  // namespace nmcmc
