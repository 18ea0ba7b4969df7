#!/usr/bin/env bash
# NUTS against HMC per gradient at 64 chains (issue #34's goal: NUTS's wall time per gradient
# within 1.5x of HMC's), as alternating pairs of ordinary runs of one binary: NUTS (diag metric,
# target accept 0.8) then HMC (adapted diagonal mass, 10 leapfrog steps, jitter 0.2), warm-up 300 +
# 1000 draws, float32, 1 thread, seed 1; the sampling phase's seconds over its gradients (NUTS's
# own count per chain). Prints one row per pair and the median per target.
# Usage: [TARGETS="icg funnel1 german"] bash bench/nuts_hmc_pairs.sh [PAIRS=3] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
OUT=${2:-bench/out/nuts_hmc_pairs}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
declare -A T=([icg]="--target icg" [german]="--target logistic --dataset german"
              [funnel1]="--target funnel --dim 100 --sigma 1")
for name in ${TARGETS:-icg funnel1 german}; do
  for r in $(seq 1 "$PAIRS"); do
    for s in nuts hmc; do
      extra="--metric diag"; [ "$s" = hmc ] && extra="--adapt-mass --leapfrog 10 --jitter 0.2"
      rm -rf "$OUT/${name}_${s}_$r"
      # shellcheck disable=SC2086
      "$NMCMC" sample ${T[$name]} --sampler $s $extra --chains 64 --warmup 300 --draws 1000 --seed 1 \
        --threads 1 --quiet --format csv --output "$OUT/${name}_${s}_$r" > /dev/null
    done
  done
done
/usr/bin/python3 - "$OUT" "$PAIRS" "${TARGETS:-icg funnel1 german}" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
print("| target | NUTS s (grads/draw per chain, deepest tree/draw) | HMC s (grads/draw) | NUTS / HMC per gradient, pair by pair (median) |")
print("|---|---|---|---|")
for name in sys.argv[3].split():
    ratios, ns, hs = [], [], []
    for r in range(1, pairs + 1):
        n = json.load(open(f"{out}/{name}_nuts_{r}/summary.json"))
        h = json.load(open(f"{out}/{name}_hmc_{r}/summary.json"))
        ratios.append((n["seconds_sampling"] / n["grads_per_step"]) / (h["seconds_sampling"] / h["grads_per_step"]))
        ns.append(n); hs.append(h)
    nsec = [n["seconds_sampling"] for n in ns]; hsec = [h["seconds_sampling"] for h in hs]
    print(f"| {name} | {min(nsec):.3f}-{max(nsec):.3f} ({ns[0]['grads_per_step']:.1f}, {ns[0]['batch_grads_per_step']:.1f}) | "
          f"{min(hsec):.3f}-{max(hsec):.3f} ({hs[0]['grads_per_step']:.0f}) | "
          f"{', '.join(f'{x:.2f}' for x in ratios)} (**{statistics.median(ratios):.2f}**) |")
PY
