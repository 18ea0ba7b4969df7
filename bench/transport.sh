#!/usr/bin/env bash
# The flow transport (issue #36) against NUTS with Stan's diagonal and the fisher-lowrank metric,
# same run, same machine: Funnel-1 (100-d, sigma 1) and Funnel-3 (20-d, sigma 3), 4 chains,
# 1000 warm-up + 1000 draws, float64, seed 1. Reports per run: R-hat, x1's mean and sd against the
# truth (in MCSE), the minimum bulk-ESS over all coordinates and x1's, per sampling gradient and
# all-in (warm-up, the flow's fitting rounds and sampling gradients; seconds likewise).
# Usage: bash bench/transport.sh [OUT]   (about 20 minutes on a 2-vCPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/transport}
NMCMC=${NMCMC:-build/nmcmc}
SEEDS=${SEEDS:-1}
mkdir -p "$OUT"
declare -A T=([funnel1]="--target funnel --dim 100 --sigma 1" [funnel3]="--target funnel --dim 20 --sigma 3")
declare -A S=([nuts_diag]="--metric diag" [nuts_lowrank]="--metric fisher-lowrank" [nuts_flow]="--metric diag --transport flow")
for name in funnel1 funnel3; do
  for s in nuts_diag nuts_lowrank nuts_flow; do
    for seed in $SEEDS; do
      dir="$OUT/${name}_${s}_s$seed"
      [ -f "$dir/summary.json" ] && continue
      echo "== $dir"
      # shellcheck disable=SC2086
      "$NMCMC" sample ${T[$name]} --sampler nuts ${S[$s]} --chains 4 --warmup 1000 --draws 1000 --seed "$seed" \
        --dtype float64 --quiet --format csv --output "$dir" > "$dir.log"
    done
  done
done
/usr/bin/python3 bench/transport_table.py "$OUT"
