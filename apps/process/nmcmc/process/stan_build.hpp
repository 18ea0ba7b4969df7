#pragma once
/// Building a Stan program into the shared library that targets/stan.hpp loads (Note [Stan
/// programs]): Stan 2.21's compiler through Rscript (Debian's r-cran-rstan), then g++ against
/// Debian's r-cran-stanheaders, r-cran-rcppeigen and Boost, with stan/shim.cpp. A process concern:
/// it runs child processes, reads the environment and writes a cache, so it lives here and is
/// handed to the library through set_stan_builder.
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace nmcmc {

/// Note [Stan's build flags]: -O3, and with GCC on x86-64 TLS descriptors (-mtls-dialect=gnu2).
std::string default_stan_flags(const std::string& cxx = "g++");

struct StanBuildOptions {
  /// Where built models are kept: $NMCMC_STAN_CACHE, else $XDG_CACHE_HOME/nmcmc/stan, else
  /// ~/.cache/nmcmc/stan (default_stan_cache()).
  std::string cache_dir;
  /// The C++ compiler ($CXX, else g++) and its optimisation flags (part of the cache key):
  /// default_stan_flags(cxx) unless $NMCMC_STAN_CXXFLAGS says otherwise.
  std::string cxx = "g++";
  std::string flags = default_stan_flags();
  /// Where R's packages are looked for (StanHeaders, RcppEigen, rstan): empty means $R_LIBS_USER,
  /// $R_LIBS_SITE, $R_LIBS, then Debian's /usr/local/lib/R/site-library, /usr/lib/R/site-library,
  /// /usr/lib/R/library.
  std::vector<std::string> r_libraries;
  /// Told what takes time ("compiling model.stan ..."); unset: silent.
  std::function<void(const std::string&)> log;
};

/// $NMCMC_STAN_CACHE, else $XDG_CACHE_HOME/nmcmc/stan, else ~/.cache/nmcmc/stan.
std::string default_stan_cache();

/// Options from the environment: NMCMC_STAN_CACHE, XDG_CACHE_HOME, HOME, CXX, NMCMC_STAN_CXXFLAGS.
StanBuildOptions stan_build_options_from_environment();

/// The library built from `program` (a .stan file): from the cache when the program, the
/// interface, the flags and Stan's version are unchanged, else translated and compiled (about a
/// minute on 2 cores) and cached. DataError with the compiler's message and line for a program
/// that does not compile; ExitError (69) naming the Debian packages when Stan is not installed.
std::string build_stan_program(const std::string& program, const StanBuildOptions& options);

/// Rewrites the syntax of current Stan that Stan 2.21 does not read into the equivalent that it
/// does, line for line (so that the compiler's line numbers are the program's): array
/// declarations (`array[N] real y;` -> `real y[N];`, `array[] real` arguments -> `real[]`), the
/// `_lupdf`/`_lupmf` suffixes, `%/%`, and `profile` blocks. Throws DataError naming the line for
/// what 2.21 cannot express (tuples, complex numbers, `jacobian +=`).
std::string translate_stan_syntax(const std::string& program, const std::string& file_label);

/// Registers build_stan_program (with stan_build_options_from_environment and `log`) as the
/// library's builder (targets/stan.hpp set_stan_builder).
void register_stan_builder(std::function<void(const std::string&)> log = nullptr);

}  // namespace nmcmc
