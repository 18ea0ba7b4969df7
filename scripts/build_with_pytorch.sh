#!/bin/bash
# Builds nmcmc against the LibTorch inside a PyTorch installation (CUDA or not), on a machine
# without Debian's packages: Note [A build without Debian's packages] in CMakeLists.txt.
#   scripts/build_with_pytorch.sh DEPS BUILD [TARGET...]
# DEPS: a folder with include/{nlohmann,fmt,CLI,stb} (and zlib.h, zconf.h where the system has
#       none) and, for the tests, googletest/ (GoogleTest's source): e.g. copies of Debian's
#       /usr/include/{nlohmann,fmt,CLI,stb} and /usr/src/googletest (docs/gpu.md).
# BUILD: the build folder. TARGETs: what to build (default: the program and the test suites).
# PYTHON (default python3): the Python whose torch is used. NMCMC_CXX_STANDARD: 17 unless the
# LibTorch headers need 20 (probed). JOBS: parallel compiles (default: all cores).
set -euo pipefail
deps=$(realpath "$1"); build=$2; shift 2
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(nmcmc_cli nmcmc_unit_tests nmcmc_statistical_tests)
py=${PYTHON:-python3}
torch_cmake=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_include=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
echo "LibTorch: $("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)') ($torch_cmake)"
std=${NMCMC_CXX_STANDARD:-}
if [ -z "$std" ]; then
  # The headers say which standard they need; C++17 where they compile with it.
  if echo '#include <torch/torch.h>' | ${CXX:-c++} -std=c++17 -fsyntax-only -x c++ - -I"$torch_include" \
       -I"$torch_include/torch/csrc/api/include" 2>/dev/null; then std=17; else std=20; fi
fi
echo "C++$std"
zlib=()
if ! ldconfig -p | grep -q 'libz\.so '; then
  z=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  [ -n "$z" ] && zlib=(-DZLIB_LIBRARY="$z")
fi
gtest=()
[ -d "$deps/googletest" ] && gtest=(-DNMCMC_GTEST_SOURCE_DIR="$deps/googletest")
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$(dirname "$0")/.." -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD="$std" \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$deps" -DNMCMC_BUILD_PYTHON=OFF -DNMCMC_BUILD_BENCH=OFF "${gtest[@]}" "${zlib[@]}"
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}" -- ${KEEP_GOING:+-k 0}
