#!/usr/bin/env bash
# NUTS speed beside HMC (issue #15): steps per second and gradients per second at 1, 64 and 1024
# chains on ICG, German and Funnel-1, measured in the sampling phase of ordinary `nmcmc sample`
# runs (so the step sizes and trajectory lengths are the adapted ones, not a guess).
#   NUTS: --metric diag, target accept 0.8; HMC: --adapt-mass, 10 leapfrog steps, jitter 0.2.
#   Warm-up 300 + 1000 draws at 1 and 64 chains (200 until 2026-11-26: with NUTS chains running
#   ahead, a short run is mostly its start and its drain); 150 + 50 at 1024 chains. float32, 1 thread.
# Columns: steps/s = draws of the whole batch per second; grads/s = gradients the chains need
# (each NUTS chain's own count) per second; batch grads/s = batched gradient evaluations per second;
# utilisation = the chains' own gradients / (batch gradient evaluations x chains): NUTS chains in
# one batch wait for the longest trajectory.
# Usage: bash bench/nuts_speed.sh [OUT]   (about 2 minutes on a 2-vCPU machine at 0c1d3fd)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/nuts_speed}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
declare -A T=([icg]="--target icg" [german]="--target logistic --dataset german"
              [funnel1]="--target funnel --dim 100 --sigma 1")
for name in icg german funnel1; do
  for s in nuts hmc; do
    for c in 1 64 1024; do
      dir="$OUT/${name}_${s}_c$c"
      [ -f "$dir/summary.json" ] && continue
      w=300; n=1000; [ "$c" = 1024 ] && { w=150; n=50; }
      extra="--metric diag"; [ "$s" = hmc ] && extra="--adapt-mass --leapfrog 10 --jitter 0.2"
      # shellcheck disable=SC2086
      "$NMCMC" sample ${T[$name]} --sampler $s $extra --chains $c --warmup $w --draws $n --seed 1 \
        --threads 1 --quiet --output "$dir" > "$dir.log"
    done
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print("| target | sampler | chains | grads/draw (per chain) | batch grads/step | utilisation | steps/s | grads/s | batch grads/s |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("icg", "german", "funnel1"):
    for s in ("nuts", "hmc"):
        for c in (1, 64, 1024):
            j = json.load(open(os.path.join(out, f"{name}_{s}_c{c}", "summary.json")))
            steps_s = j["draws"] / j["seconds_sampling"]
            g = j["grads_per_step"]; bg = j.get("batch_grads_per_step", g)
            print(f"| {name} | {s} | {c} | {g:.1f} | {bg:.1f} | {g / bg:.2f} | {steps_s:.1f} | {g * c * steps_s:.3g} | {bg * steps_s:.3g} |")
PY
