#!/usr/bin/env bash
# Note [The learned step's native pass]: seconds per learned MH step, the native pass against
# LibTorch's (`nmcmc_bench learned --mode sample [--libtorch-step]`), on posteriordb's arK (D = 7)
# and eight schools (D = 10) at the default width (64) and the paper's German (D = 25, width 128),
# at 4 and 16 chains (an untrained model: a step's cost does not depend on the weights).
# Usage: bash bench/native_step.sh [OUT]   (about a minute; run it alone on the machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/native_step}
mkdir -p "$OUT"
PYTHONPATH=build/python /usr/bin/python3 scripts/posteriordb.py export "$OUT/modules" arK-arK eight_schools-eight_schools_noncentered > /dev/null
for p in arK-arK eight_schools-eight_schools_noncentered; do
  cat > "$OUT/$p.json" <<JSON
{"name": "$p", "target": {"name": "torchscript", "module": "modules/$p.pt"},
 "model": {"variant": "langevin", "hidden": 64, "steps": 1, "precondition": "dense", "learn_precondition": true},
 "train": {"batch": 64}}
JSON
done
echo "config chains native_us libtorch_us native_taken"
for cfg in "$OUT/arK-arK.json" "$OUT/eight_schools-eight_schools_noncentered.json" configs/german.json; do
  for b in 4 16; do
    row="$(basename "$cfg" .json) $b"
    taken=""
    for flag in "" --libtorch-step; do
      # shellcheck disable=SC2086
      j=$(OMP_NUM_THREADS=1 build/bench/nmcmc_bench learned --config "$cfg" --mode sample --batch $b --reps 200 $flag | tail -1)
      row="$row $(/usr/bin/python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['seconds_per_step'] * 1e6))" "$j")"
      [ -z "$flag" ] && taken=$(/usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])['native_step'])" "$j")
    done
    echo "$row $taken"
  done
done
