#!/usr/bin/env bash
# nmcmc against the authors' PyTorch code (NEM-MC/Entropy-NeuralMC), alternately in one run on one
# machine: Funnel-1 (512/3), training steps at batch 128 and 1024, sampling steps of 256 chains;
# one thread each (OPENBLAS_NUM_THREADS=1), median of 10 steps after warm-up, three rounds.
# Usage: bench/side_by_side.sh AUTHORS_CHECKOUT [OUT.jsonl]
#   (AUTHORS_CHECKOUT: e.g. `git archive` of github.com/NEM-MC/Entropy-NeuralMC into a folder;
#    it is never copied into this project)
set -euo pipefail
AUTHORS=${1:?give a checkout of NEM-MC/Entropy-NeuralMC}
OUT=${2:-bench/out/side_by_side.jsonl}
BENCH=${BENCH:-build/bench/nmcmc_bench}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
for round in 1 2 3; do
  for case in "train 128" "train 1024" "sample 256"; do
    set -- $case
    /usr/bin/python3 bench/authors_step.py "$AUTHORS" --mode "$1" --batch "$2" --reps 10 | sed "s/^{/{\"round\": $round, /" >> "$OUT"
    "$BENCH" learned --config configs/funnel1.json --mode "$1" --batch "$2" --reps 10 --threads 1 |
      sed "s/^{/{\"round\": $round, \"who\": \"nmcmc\", /" >> "$OUT"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| case | authors (s/step) | nmcmc (s/step) | nmcmc / authors |")
print("|---|---|---|---|")
for mode, batch in (("train", 128), ("train", 1024), ("sample", 256)):
    a = [r["seconds_per_step"] for r in rows if r.get("bench") == "authors" and r["mode"] == mode and r["batch"] == batch]
    n = [r["seconds_per_step"] for r in rows if r.get("who") == "nmcmc" and r.get("mode") == mode and r.get("batch") == batch]
    ratios = [x / y for x, y in zip(n, a)]
    print(f"| {mode} {batch} | {statistics.median(a):.3f} | {statistics.median(n):.3f} | "
          f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)}) |")
PY
