#!/usr/bin/env bash
# Installs the Debian packages nmcmc needs, if any is missing. Safe to run again.
set -euo pipefail
packages=(build-essential cmake ninja-build ccache libtorch-dev libopenblas0-pthread libcli11-dev nlohmann-json3-dev
          libfmt-dev libgtest-dev libstb-dev zlib1g-dev dataset-fashion-mnist
          pybind11-dev python3-dev python3-torch python3-pytest python3-numpy
          pkg-config libnetcdf-dev libgloo-dev libdnnl-dev python3-xarray python3-netcdf4 python3-pandas python3-matplotlib
          r-cran-rstan r-cran-stanheaders r-cran-rcppeigen libboost-dev r-cran-jsonlite r-cran-posterior)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "nmcmc: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "nmcmc: run as root, or install them: apt-get install ${missing[*]}" >&2; exit 1; fi
else SUDO=""; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
