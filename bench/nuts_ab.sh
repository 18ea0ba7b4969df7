#!/usr/bin/env bash
# Two nmcmc binaries' NUTS sampling phase side by side (A/B of an engine change): alternating pairs
# of the same run (diag metric, 64 chains, warm-up 300 + 1000 draws, float32, 1 thread, seed 1),
# the sampling phase's seconds of A over B's, pair by pair, and the median. Both binaries must draw
# the same (the script checks: the same gradients per draw and the same draws' means).
# Usage: [TARGETS="icg funnel1 german"] bash bench/nuts_ab.sh BINARY_A BINARY_B [PAIRS=5] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1; B=$2; PAIRS=${3:-5}; OUT=${4:-bench/out/nuts_ab}
mkdir -p "$OUT"
declare -A T=([icg]="--target icg" [german]="--target logistic --dataset german"
              [funnel1]="--target funnel --dim 100 --sigma 1")
for name in ${TARGETS:-icg funnel1 german}; do
  for r in $(seq 1 "$PAIRS"); do
    for s in a b; do
      bin=$A; [ "$s" = b ] && bin=$B
      rm -rf "$OUT/${name}_${s}_$r"
      # shellcheck disable=SC2086
      "$bin" sample ${T[$name]} --sampler nuts --metric diag --chains 64 --warmup 300 --draws 1000 --seed 1 \
        --threads 1 --quiet --format csv --output "$OUT/${name}_${s}_$r" > /dev/null
    done
  done
done
/usr/bin/python3 - "$OUT" "$PAIRS" "${TARGETS:-icg funnel1 german}" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
print("| target | A sampling s | B sampling s | A / B, pair by pair (median) |")
print("|---|---|---|---|")
for name in sys.argv[3].split():
    a = [json.load(open(f"{out}/{name}_a_{r}/summary.json")) for r in range(1, pairs + 1)]
    b = [json.load(open(f"{out}/{name}_b_{r}/summary.json")) for r in range(1, pairs + 1)]
    for x, y in zip(a, b):
        assert x["grads_per_step"] == y["grads_per_step"], "the two binaries draw differently"
    ratios = [x["seconds_sampling"] / y["seconds_sampling"] for x, y in zip(a, b)]
    sa = [x["seconds_sampling"] for x in a]; sb = [y["seconds_sampling"] for y in b]
    print(f"| {name} | {min(sa):.3f}-{max(sa):.3f} | {min(sb):.3f}-{max(sb):.3f} | "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (**{statistics.median(ratios):.2f}**) |")
PY
