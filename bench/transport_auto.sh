#!/usr/bin/env bash
# `--transport auto` for NUTS (Note [Choosing the transport]) against NUTS with Stan's settings
# (--metric diag, no transport) on posteriordb's posteriors, and against `--transport flow` on
# Funnel-1 (100-d, sigma 1) and Funnel-3 (20-d, sigma 3); 4 chains, 1000 warm-up + 1000 draws,
# float64. Per posterior and seed: what auto measured and which ran, the moment checks, bulk-ESS
# per sampling gradient and all-in (every warm-up, fitting-round and sampling gradient), and the
# seconds to 10,000 effective draws. One process at a time.
# METRIC=fisher-lowrank (default diag) runs the posteriordb part with that metric on both sides
# (its files pdb_nuts_METRIC_..., funnels left out): auto against the best NUTS's metric.
# Usage: bash bench/transport_auto.sh OUT "SEEDS" [FUNNEL_SEEDS]   (e.g. OUT "1 2" "1 2 3"; about
# 25 minutes on a 2-vCPU machine; posteriordb's diamonds is left out: NUTS with Stan's diagonal
# metric takes 10-15 minutes on it at its tree-depth limit)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash bench/transport_auto.sh OUT "SEEDS" [FUNNEL_SEEDS]}
SEEDS=${2:-1}
FUNNEL_SEEDS=${3:-1}
NMCMC=${NMCMC:-build/nmcmc}
METRIC=${METRIC:-diag}
PREFIX=pdb_nuts
[ "$METRIC" = diag ] || PREFIX=pdb_nuts_$METRIC
mkdir -p "$OUT"
export PYTHONPATH=build/python OMP_NUM_THREADS=1
ONLY=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, 'posteriordb'); import ports; print(' '.join(p for p in ports.PORTS if not p.startswith('diamonds')))")
for seed in $SEEDS; do
  for s in diag auto; do
    f="$OUT/${PREFIX}_${s}_s$seed.json"
    [ -f "$f" ] && continue
    extra=""
    [ "$s" = auto ] && extra="--transport auto"
    # shellcheck disable=SC2086
    /usr/bin/python3 scripts/posteriordb.py check --sampler nuts --metric "$METRIC" $extra --seed "$seed" --json "$f" \
      --only $ONLY > "${f%.json}.log" 2>&1 || true
  done
done
if [ "$METRIC" != diag ]; then
  echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), NUTS --metric $METRIC"
  PREFIX=$PREFIX /usr/bin/python3 bench/transport_auto.py "$OUT" $SEEDS
  exit 0
fi
declare -A T=([funnel1]="--target funnel --dim 100 --sigma 1" [funnel3]="--target funnel --dim 20 --sigma 3")
for name in funnel3 funnel1; do
  seeds=$FUNNEL_SEEDS
  [ "$name" = funnel1 ] && seeds=1
  for s in flow auto; do
    for seed in $seeds; do
      dir="$OUT/funnels/${name}_nuts_${s}_s$seed"
      [ -f "$dir/summary.json" ] && continue
      mkdir -p "$OUT/funnels"
      # shellcheck disable=SC2086
      "$NMCMC" sample ${T[$name]} --sampler nuts --metric diag --transport "$s" --chains 4 --warmup 1000 --draws 1000 \
        --seed "$seed" --dtype float64 --quiet --format csv --output "$dir" > "$dir.log"
    done
  done
done
echo "# $(date -u +%F) commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -qw amx_bf16 /proc/cpuinfo && echo AMX || echo 'no AMX')"
/usr/bin/python3 bench/transport_auto.py "$OUT" $SEEDS
/usr/bin/python3 bench/transport_table.py "$OUT/funnels"
