#!/usr/bin/env bash
# Your own density on the command line: script it in PyTorch, then sample, train and compare it
# with `nmcmc`. Usage: bash examples/torchscript/run.sh [OUT] (QUICK=1: small sizes, as CI runs it)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NMCMC=${NMCMC:-$HERE/../../build/nmcmc}
OUT=${1:-eight_schools_out}
mkdir -p "$OUT"
if [ "${QUICK:-0}" = 1 ]; then steps=300; draws=300; else steps=2000; draws=2000; fi

# 1. Script the density (writes the module next to the config, which names it relatively).
/usr/bin/python3 "$HERE/eight_schools.py" "$HERE/eight_schools.pt"
# 2. NUTS on it: the Stan-CSV columns carry the module's parameter names.
"$NMCMC" sample --module "$HERE/eight_schools.pt" --sampler nuts --chains 4 --draws "$draws" -q --output "$OUT/nuts"
# 3. Train the learned sampler from a config that names the module, and sample with it.
"$NMCMC" train --config "$HERE/eight_schools.json" --steps "$steps" -q --output "$OUT/model.pt"
"$NMCMC" sample --sampler learned --model "$OUT/model.pt" --chains 16 --warmup 200 --draws "$draws" -q --output "$OUT/learned"
# 4. All samplers side by side, with the learned sampler's break-even against NUTS.
"$NMCMC" compare --model "$OUT/model.pt" --chains 4 --warmup 500 --draws "$draws" -q --output "$OUT/compare"
