#!/usr/bin/env bash
# nmcmc's NUTS against Stan 2.21's NUTS (figures measured on this machine kind, quoted in the
# NUTS issue): diag_e metric, adapt_delta 0.8, 4 chains x (1000 warm-up + 2000 draws); the
# funnels over 5 seeds (median). Writes OUT/TARGET_sSEED/ and prints the table (bench/nuts_table.py).
# Usage: bash bench/nuts_vs_stan.sh [OUT]   (about 1-2 minutes on a 2-vCPU machine at 0c1d3fd)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/nuts_vs_stan}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
run() {  # name seed target-options...
  local name=$1 seed=$2; shift 2
  local dir="$OUT/${name}_s${seed}"
  [ -f "$dir/summary.json" ] && return 0
  "$NMCMC" sample "$@" --sampler nuts --metric diag --target-accept 0.8 --chains 4 --warmup 1000 --draws 2000 \
    --seed "$seed" --threads 1 --quiet --output "$dir" > "$dir.log"
}
run icg 1 --target icg
run scg 1 --target scg
run german 1 --target logistic --dataset german --dtype float64
run australian 1 --target logistic --dataset australian --dtype float64
run heart 1 --target logistic --dataset heart --dtype float64
for s in 1 2 3 4 5; do
  run funnel1 $s --target funnel --dim 100 --sigma 1
  run funnel3 $s --target funnel --dim 20 --sigma 3
done
/usr/bin/python3 bench/nuts_table.py "$OUT"
