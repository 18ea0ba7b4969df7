#!/usr/bin/env bash
# The paper's learned proposal trained in a flow transport's latent space (issue #36, item 2)
# against the same proposal with the affine preconditioner (the default), same session, same
# machine: Funnel-1 (100-d, sigma 1) and Funnel-3 (20-d, sigma 3). Training: `nmcmc train` with the
# defaults of Note [Training budget] (batch 256, <= 3,000 steps, <= 90 s of steps), with or without
# `--transport flow`; sampling: 4 chains, 100 burn-in + 1000 draws (float32, the model's dtype),
# seed 1. Reports per run: R-hat, x1's mean and sd in MCSE, bulk-ESS per sampling gradient (x1 and
# the minimum over all coordinates) and all-in (the warm-up or the flow's rounds, training and
# sampling gradients; seconds likewise).
# Usage: bash bench/transport_learned.sh [OUT]   (about 25 minutes on a 2-vCPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/transport_learned}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
declare -A T=([funnel1]="--target funnel --dim 100 --sigma 1" [funnel3]="--target funnel --dim 20 --sigma 3")
declare -A P=([affine]="" [flow]="--transport flow")
for name in ${TARGETS:-funnel1 funnel3}; do
  for p in flow affine; do
    dir="$OUT/${name}_learned_${p}"
    mkdir -p "$dir"
    if [ ! -f "$dir/model.pt" ]; then
      echo "== train $dir"
      # shellcheck disable=SC2086
      /usr/bin/time -f "%e s wall" "$NMCMC" train ${T[$name]} ${P[$p]} --seed 1 --quiet --output "$dir/model.pt" \
        > "$dir/train.log" 2>&1
    fi
    if [ ! -f "$dir/run/summary.json" ]; then
      echo "== sample $dir"
      "$NMCMC" sample --sampler learned --model "$dir/model.pt" --chains 4 --warmup 100 --draws 1000 --seed 1 \
        --quiet --format csv --output "$dir/run" > "$dir/sample.log"
    fi
  done
done
/usr/bin/python3 bench/transport_learned_table.py "$OUT"
