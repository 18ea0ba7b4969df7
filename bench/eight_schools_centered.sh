#!/usr/bin/env bash
# The centred eight schools (bench/eight_schools_centered.py), issue #36's hierarchical goal: NUTS
# with Stan's settings (diag), with --transport auto, with the fisher-lowrank metric, and the
# learned sampler with `nmcmc train`'s defaults (transport auto), at each seed; 4 chains x 1000
# warm-up + 1000 draws, float64; moment checks against the non-centred reference moved to the
# centred coordinates. One process at a time.
# Usage: bash bench/eight_schools_centered.sh OUT "SEEDS"   (a few minutes on a 2-vCPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash bench/eight_schools_centered.sh OUT "SEEDS"}
SEEDS=${2:-1}
mkdir -p "$OUT"
export PYTHONPATH=build/python OMP_NUM_THREADS=1
run() {  # NAME ARGS...
  local f="$OUT/$1.json"
  shift
  [ -f "$f" ] || /usr/bin/python3 bench/eight_schools_centered.py check --json "$f" "$@" > "${f%.json}.log" 2>&1 || true
}
for seed in $SEEDS; do
  run "es_c_diag_s$seed" --sampler nuts --metric diag --seed "$seed"
  run "es_c_auto_s$seed" --sampler nuts --metric diag --transport auto --seed "$seed"
  run "es_c_lowrank_s$seed" --sampler nuts --metric fisher-lowrank --seed "$seed"
  run "es_c_learned_s$seed" --sampler learned --seed "$seed"
done
echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
cat "$OUT"/es_c_*.log | grep -E "^(ok|FAIL)" || true
# shellcheck disable=SC2086
PREFIX=es_c /usr/bin/python3 bench/transport_auto.py "$OUT" $SEEDS
for seed in $SEEDS; do
  for s in lowrank learned; do
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print(sys.argv[2], 'seed', sys.argv[3], 'passes', r['passes'], 'ESS/grad', round(r.get('ess_bulk_per_grad') or float('nan'), 4), 'all-in', round(r.get('allin_ess_per_grad') or float('nan'), 4), 'seconds to 10k', round(r.get('seconds_for_10000') or float('nan'), 1), 'divergences', r.get('divergences'), 'transport', r.get('transport'), r['why'])" "$OUT/es_c_${s}_s$seed.json" "$s" "$seed" || true
  done
done
