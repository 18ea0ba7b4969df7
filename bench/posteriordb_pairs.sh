#!/usr/bin/env bash
# The issue #35 yardstick in wall time, taken in pairs: for each posteriordb posterior, the learned
# sampler with `nmcmc train --module`'s defaults and NUTS with Stan's settings (diagonal metric),
# back to back on the same machine (one process at a time, nothing else running), their order
# alternating from round to round; the ratio of their all-in seconds to 10,000 effective draws is
# taken pair by pair and its median over the rounds reported (this 2-vCPU machine's speed drifts
# by 20-40 % over minutes: two whole-suite runs minutes apart are not a same-run comparison).
# Same seed in every round: the same draws, so only the seconds vary.
# Usage: bash bench/posteriordb_pairs.sh OUT [ROUNDS=3] [SEED=1] [--only P ...]
#   (diamonds-diamonds is left out unless named: NUTS with Stan's settings takes 10-15 minutes there)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?give an output directory}
ROUNDS=${2:-3}
SEED=${3:-1}
shift 3 || shift $#
mkdir -p "$OUT"
export PYTHONPATH=build/python OMP_NUM_THREADS=1
if [ "${1:-}" = "--only" ]; then
  shift
  POSTERIORS="$*"
else
  POSTERIORS=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, 'posteriordb'); import ports
print(' '.join(p for p in ports.PORTS if p != 'diamonds-diamonds'))")
fi
one() {  # SAMPLER POSTERIOR ROUND
  local args=(--sampler "$1" --seed "$SEED" --only "$2" --json "$OUT/$1_$2_r$3.json")
  [ "$1" = nuts ] && args+=(--metric diag)
  [ -f "$OUT/$1_$2_r$3.json" ] || /usr/bin/python3 scripts/posteriordb.py check "${args[@]}" >> "$OUT/log.txt" 2>&1 || true
}
for round in $(seq 1 "$ROUNDS"); do
  for p in $POSTERIORS; do
    if [ $((round % 2)) = 1 ]; then one learned "$p" "$round"; one nuts "$p" "$round"
    else one nuts "$p" "$round"; one learned "$p" "$round"; fi
  done
  echo "round $round of $ROUNDS done ($(date -u +%T))" >&2
done
/usr/bin/python3 scripts/posteriordb.py pairs "$OUT"
