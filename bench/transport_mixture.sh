#!/usr/bin/env bash
# Global moves from the flow transport (issue #36 item 3): a 10-d two-component Gaussian mixture,
# weights 0.3 and 0.7, modes at -2.5 and +2.5 in every coordinate (15.8 sd apart;
# bench/mixture_module.py). NUTS (diag metric), NUTS through the flow, and NUTS through the flow
# with global moves; 8 chains (from Stan's uniform(-2, 2)), 1000 warm-up + 1000 draws, float64,
# seed 1. Prints the weight of the 0.3 mode with its MCSE, per chain, and each run's R-hat. The
# same three on posteriordb's low-dimensional Gaussian mixture without the ordering of its means
# (bench/mixture_unordered.py: two labellings 5.6 apart at posterior sds of 0.04, weights exactly
# 0.5 by symmetry): the weight of mu1 < mu2, and the relabelled draws against the reference.
# Usage: bash bench/transport_mixture.sh [OUT]   (about 5 minutes on a 2-vCPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/transport_mixture}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
/usr/bin/python3 bench/mixture_module.py "$OUT/mix10.pt" 10 0.3 2.5
declare -A S=([nuts]="--metric diag" [flow]="--transport flow" [flow_global]="--transport flow --global-moves")
for s in nuts flow flow_global; do
  [ -f "$OUT/$s/summary.json" ] && continue
  # shellcheck disable=SC2086
  "$NMCMC" sample --module "$OUT/mix10.pt" --sampler nuts ${S[$s]} --chains 8 --warmup 1000 --draws 1000 --dtype float64 \
    --seed 1 --quiet --format csv --output "$OUT/$s" > "$OUT/$s.log"
done
/usr/bin/python3 bench/mixture_weights.py "$OUT/nuts" "$OUT/flow" "$OUT/flow_global"
# posteriordb's low-dimensional Gaussian mixture without its ordering: two labellings, equal weights
/usr/bin/python3 bench/mixture_unordered.py module "$OUT/ldgm_unordered.pt"
for s in nuts flow flow_global; do
  [ -f "$OUT/ldgm_$s/summary.json" ] && continue
  # shellcheck disable=SC2086
  "$NMCMC" sample --module "$OUT/ldgm_unordered.pt" --sampler nuts ${S[$s]} --chains 8 --warmup 1000 --draws 1000 \
    --dtype float64 --seed 1 --quiet --format csv --output "$OUT/ldgm_$s" > "$OUT/ldgm_$s.log"
done
/usr/bin/python3 bench/mixture_unordered.py weights "$OUT/ldgm_nuts" "$OUT/ldgm_flow" "$OUT/ldgm_flow_global"
for s in ldgm_nuts ldgm_flow ldgm_flow_global; do
  /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'max R-hat', round(j['max_rhat'], 3), 'global accept', j.get('transport', {}).get('global_accept'))" "$OUT/$s/summary.json" "$s"
done
for s in nuts flow flow_global; do
  /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'max R-hat', round(j['max_rhat'], 3), 'global accept', j.get('transport', {}).get('global_accept'))" "$OUT/$s/summary.json" "$s"
done
