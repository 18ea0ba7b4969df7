#!/usr/bin/env bash
# Where the learned step's native pass stops paying on this CPU (Note [The learned step's native
# pass], model.native_max_flops): seconds per learned MH step with the native pass forced
# (`--native-step`) against LibTorch's (`--libtorch-step`), over the chains of a step, for
# posteriordb's arK (D = 7, width 64), the paper's German (D = 25, width 128) and ICG (D = 100,
# width 256). Prints network flops per step, both times and their ratio; the threshold for this
# machine is about where the ratio crosses 1 (set it with --set model.native_max_flops=F).
# Usage: bash bench/native_threshold.sh [OUT]   (about 3 minutes; run it alone on the machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/native_threshold}
mkdir -p "$OUT"
PYTHONPATH=build/python /usr/bin/python3 scripts/posteriordb.py export "$OUT/modules" arK-arK > /dev/null
cat > "$OUT/arK-arK.json" <<JSON
{"name": "arK-arK", "target": {"name": "torchscript", "module": "modules/arK-arK.pt"},
 "model": {"variant": "langevin", "hidden": 64, "steps": 1, "precondition": "dense", "learn_precondition": true},
 "train": {"batch": 64}}
JSON
echo "config chains mflops native_us libtorch_us libtorch/native"
for cfg in "$OUT/arK-arK.json" configs/german.json configs/icg.json; do
  for b in 1 2 4 8 16 32 64; do
    n=$(OMP_NUM_THREADS=1 build/bench/nmcmc_bench learned --config "$cfg" --mode sample --batch $b --reps 200 --native-step | tail -1)
    l=$(OMP_NUM_THREADS=1 build/bench/nmcmc_bench learned --config "$cfg" --mode sample --batch $b --reps 200 --libtorch-step | tail -1)
    /usr/bin/python3 - "$cfg" "$b" "$n" "$l" <<'PY'
import json, os, sys
n, l = json.loads(sys.argv[3]), json.loads(sys.argv[4])
if not n["native_step"]:
    sys.exit(f"{sys.argv[1]}: the native pass does not apply")
print(os.path.basename(sys.argv[1])[:-5], sys.argv[2], round(n["network_flops_per_step"] / 1e6, 2),
      round(n["seconds_per_step"] * 1e6), round(l["seconds_per_step"] * 1e6),
      round(l["seconds_per_step"] / n["seconds_per_step"], 2))
PY
  done
done
