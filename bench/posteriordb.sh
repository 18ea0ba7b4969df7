#!/usr/bin/env bash
# posteriordb's reference posteriors (posteriordb/): NUTS with Stan's settings (diagonal metric,
# 4 chains x 1000 warm-up + 1000 draws, float64) against the learned sampler with the defaults of
# `nmcmc train --module` (Note [Training budget]) sampled the same way; moment checks against the
# reference, bulk-ESS per gradient and per second sampling only and all-in (warm-up, preconditioner,
# training), the cost of 10,000 effective draws and the break-even. Prints the BENCHMARKS table.
# Usage: bash bench/posteriordb.sh [OUT] [--only P ...]   (hours on a 2-vCPU machine: the
# correlated regressions run NUTS at its tree-depth limit)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/posteriordb}
shift || true
mkdir -p "$OUT"
export PYTHONPATH=build/python
[ -f "$OUT/nuts.json" ] || /usr/bin/python3 scripts/posteriordb.py check --sampler nuts --json "$OUT/nuts.json" "$@" | tee "$OUT/nuts.log" || true
[ -f "$OUT/learned.json" ] || /usr/bin/python3 scripts/posteriordb.py check --sampler learned --json "$OUT/learned.json" "$@" | tee "$OUT/learned.log" || true
echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -qw amx_bf16 /proc/cpuinfo && echo AMX || echo 'no AMX')"
/usr/bin/python3 scripts/posteriordb.py table "$OUT/nuts.json" "$OUT/learned.json"
