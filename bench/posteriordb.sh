#!/usr/bin/env bash
# posteriordb's reference posteriors (posteriordb/): NUTS with each metric (Stan's diagonal and
# dense, and fisher-diag and fisher-lowrank from draws and gradients; 4 chains x 1000 warm-up +
# 1000 draws, float64) against the learned sampler with the defaults of `nmcmc train --module`
# (Note [Training budget]) sampled the same way; moment checks against the reference, bulk-ESS
# per gradient and per second sampling only and all-in (warm-up, preconditioner, training), the
# cost of 10,000 effective draws and the break-even against the best NUTS. Prints the BENCHMARKS
# tables: NUTS's metrics against Stan's diagonal one, NUTS through the flow transport (--transport
# flow) against the best NUTS without it, and the learned sampler against the best NUTS.
# With --stan, the same on all 46 posteriors from their Stan programs (docs/stan.md).
# Usage: bash bench/posteriordb.sh [OUT] [--stan] [--only P ...]   (hours on a 2-vCPU machine: the
# correlated regressions run NUTS with a diagonal metric at its tree-depth limit). Runs one
# process at a time (two side by side on 2 vCPUs share the cores with OpenBLAS's own threads: a
# run's seconds then depend on what runs beside it); a JSON already in OUT is kept (delete it to
# run again). The wall-time yardstick of issue #35 is bench/posteriordb_pairs.sh (pair by pair: this
# machine's speed drifts between whole-suite runs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/posteriordb}
shift || true
mkdir -p "$OUT"
export PYTHONPATH=build/python OMP_NUM_THREADS=1
check() {  # NAME ARGS...: one check run into OUT/NAME.json unless it is there
  local name=$1
  shift
  [ -f "$OUT/$name.json" ] || /usr/bin/python3 scripts/posteriordb.py check --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1 || true
}
check learned --sampler learned "$@"
check nuts_diag --sampler nuts --metric diag "$@"
check nuts_fisher-lowrank --sampler nuts --metric fisher-lowrank "$@"
check nuts_dense --sampler nuts --metric dense "$@"
check nuts_fisher-diag --sampler nuts --metric fisher-diag "$@"
check nuts_flow --sampler nuts --metric diag --transport flow "$@"
echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -qw amx_bf16 /proc/cpuinfo && echo AMX || echo 'no AMX')"
echo "## NUTS's metrics"
/usr/bin/python3 scripts/posteriordb.py metrics "$OUT/nuts_diag.json" "$OUT/nuts_fisher-diag.json" "$OUT/nuts_fisher-lowrank.json" "$OUT/nuts_dense.json"
echo "## NUTS through the flow transport against the best NUTS without it"
/usr/bin/python3 scripts/posteriordb.py transport "$OUT/nuts_flow.json" "$OUT/nuts_diag.json" "$OUT/nuts_fisher-diag.json" \
  "$OUT/nuts_fisher-lowrank.json" "$OUT/nuts_dense.json"
echo "## The learned sampler against the best NUTS"
/usr/bin/python3 scripts/posteriordb.py table "$OUT/nuts_diag.json" "$OUT/learned.json" "$OUT/nuts_fisher-diag.json" \
  "$OUT/nuts_fisher-lowrank.json" "$OUT/nuts_dense.json"
