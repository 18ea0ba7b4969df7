#!/usr/bin/env bash
# NUTS through `nmcmc sample --stan` against rstan's own NUTS (Stan 2.21, Debian's r-cran-rstan) on
# the same Stan programs and data: 4 chains x (1000 warm-up + 1000 draws), diagonal metric, target
# accept 0.8, one core each (rstan's chains one after another; nmcmc's batched in one thread, its
# Stan rows too).
# Also the first `--stan` run's compile-plus-first-draw time with an empty cache, and from the cache.
# Writes OUT/*.json and prints a table. Usage: bash bench/stan_vs_rstan.sh [OUT]   (about 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/stan_vs_rstan}
NMCMC=${NMCMC:-build/nmcmc}
source bench/stan/ready.sh
mkdir -p "$OUT"
export NMCMC_STAN_CACHE="$OUT/cache"
PDB=posteriordb
now() { date +%s.%N; }
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }  # b - a, as JSON

# Compile plus first draw, cold (an empty cache) and warm, on eight schools.
rm -rf "$NMCMC_STAN_CACHE"
t0=$(now); "$NMCMC" sample --stan $PDB/stan/eight_schools_noncentered.stan --data $PDB/data/eight_schools.json \
  --chains 1 --warmup 1 --draws 1 --quiet > /dev/null 2>&1; t1=$(now)
"$NMCMC" sample --stan $PDB/stan/eight_schools_noncentered.stan --data $PDB/data/eight_schools.json \
  --chains 1 --warmup 1 --draws 1 --quiet > /dev/null 2>&1; t2=$(now)
echo "{\"cold_seconds\": $(seconds $t0 $t1), \"cached_seconds\": $(seconds $t1 $t2)}" > "$OUT/first_draw.json"

for spec in "eight_schools_noncentered eight_schools" "arK arK" "hmm_example hmm_example"; do
  set -- $spec
  model=$1 data=$2
  # built before the timed runs (their wall time is the run's, not the compiler's)
  "$NMCMC" sample --stan $PDB/stan/$model.stan --data $PDB/data/$data.json --chains 1 --warmup 1 --draws 1 -q > /dev/null 2>&1
  for seed in 1 2 3; do
    dir="$OUT/nmcmc_${model}_s$seed"
    if [ ! -f "$dir/summary.json" ]; then
      t0=$(now)
      # one core, as rstan's run: the Stan rows in one thread (Note [Stan rows in threads])
      "$NMCMC" sample --target-json "{\"name\": \"stan\", \"program\": \"$PDB/stan/$model.stan\", \"data\": \"$PDB/data/$data.json\", \"threads\": 1}" \
        --chains 4 --warmup 1000 --draws 1000 --seed $seed --threads 1 --quiet --output "$dir" > "$dir.log" 2>&1
      t1=$(now)
      echo "{\"wall_seconds\": $(seconds $t0 $t1)}" > "$dir.wall.json"
    fi
    # rstan reads the program in 2.21's syntax: the translation nmcmc compiled (in the cache).
    translated=$(ls "$NMCMC_STAN_CACHE"/$model-*/$model.stan | head -1)
    [ -f "$OUT/rstan_${model}_s$seed.json" ] || \
      Rscript bench/stan/run_stan.R "$translated" $PDB/data/$data.json 4 1000 1000 $seed "$OUT/rstan_${model}_s$seed.json" \
        > "$OUT/rstan_${model}_s$seed.log" 2>&1
  done
done
/usr/bin/python3 bench/stan_vs_rstan.py "$OUT"
