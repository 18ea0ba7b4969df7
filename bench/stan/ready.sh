# Sourced by the benchmarks that run Stan 2.21 beside nmcmc: checks that rstan is there and lets
# Debian's rstan find Boost (it looks under BH/include, which Debian's r-cran-bh does not ship:
# linked to /usr/include).
if ! command -v Rscript > /dev/null || ! Rscript -e 'library(rstan); library(jsonlite)' > /dev/null 2>&1; then
  echo "these benchmarks need Stan: apt-get install r-cran-rstan r-cran-jsonlite" >&2
  exit 69
fi
BH=$(Rscript -e 'cat(system.file(package="BH"))')
[ -e "$BH/include" ] || ln -s /usr/include "$BH/include"
