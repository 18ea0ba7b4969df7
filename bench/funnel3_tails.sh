#!/usr/bin/env bash
# Funnel-3 (20-d, sigma 3) through the flow transport: x1's sd over ten seeds at Stan's target
# accept 0.8 and at 0.95 (4 chains x 1000 + 1000, as bench/transport_auto.sh), then one seed with
# 20,000 draws per chain at 0.8, 0.95 and 0.99, and how often the long runs visit x1's tails.
# `--transport flow` (auto takes the flow here: the same draws). About 8 minutes on 2 vCPUs.
# Usage: bash bench/funnel3_tails.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash bench/funnel3_tails.sh OUT}
NMCMC=${NMCMC:-build/nmcmc}
export OMP_NUM_THREADS=1
mkdir -p "$OUT/seeds" "$OUT/long"
run() {  # dir target-accept draws seed
  [ -f "$1/summary.json" ] && return 0
  "$NMCMC" sample --target funnel --dim 20 --sigma 3 --sampler nuts --metric diag --transport flow \
    --target-accept "$2" --chains 4 --warmup 1000 --draws "$3" --seed "$4" --dtype float64 --quiet \
    --format csv --output "$1" > "$1.log"
}
for ta in 0.8 0.95; do
  for seed in 1 2 3 4 5 6 7 8 9 10; do run "$OUT/seeds/funnel3_nuts_flow_ta${ta}_s$seed" "$ta" 1000 "$seed"; done
done
for ta in 0.8 0.95 0.99; do run "$OUT/long/funnel3_nuts_flow20k_ta${ta}_s1" "$ta" 20000 1; done
echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -qw amx_bf16 /proc/cpuinfo && echo AMX || echo 'no AMX')"
/usr/bin/python3 bench/transport_table.py "$OUT/seeds"
/usr/bin/python3 bench/transport_table.py "$OUT/long"
grep -h "divergences" "$OUT"/long/*.log
/usr/bin/python3 bench/funnel3_tails.py "$OUT"/long/funnel3_*[0-9]
