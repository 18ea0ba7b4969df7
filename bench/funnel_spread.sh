#!/usr/bin/env bash
# How much of a change in Funnel-3's (or Funnel-1's) learned ESS is noise? Trains the `cpu`
# profile's Funnel-3 (6000 steps, batch 128, width 512) with other training seeds, and evaluates
# each model, the profile's own (MODEL) included, as the profile does (256 chains from exact draws,
# 2000 steps, the paper's ESS on the last 1000) with several evaluation seeds.
# Usage: bash bench/funnel_spread.sh [BUILD_DIR]
#   EXPERIMENT=funnel3 TRAIN_SEEDS="2 3" EVAL_SEEDS="1 2 3" MODEL=bench/out/cpu_s9/funnel3/model.pt
set -euo pipefail
build=${1:-build}
exp=${EXPERIMENT:-funnel3}
out=bench/out/spread_$exp
mkdir -p "$out"
case $exp in
  funnel3) train_args=(--batch 128 --steps 6000 --set model.hidden=512) ;;
  funnel1) train_args=(--batch 128 --steps 5000) ;;
  *) echo "EXPERIMENT must be funnel1 or funnel3" >&2; exit 64 ;;
esac
date -u +"# %Y-%m-%d %H:%M UTC, commit $(git rev-parse --short HEAD), $exp"
models=()
[ -n "${MODEL:-}" ] && models+=("profile:$MODEL")
for s in ${TRAIN_SEEDS:-2}; do
  "$build/nmcmc" train --config "configs/$exp.json" "${train_args[@]}" --set train.seed="$s" \
    --set train.checkpoint_every=100000 -o "$out/seed$s.pt" -q > "$out/seed$s.train.txt"
  models+=("seed$s:$out/seed$s.pt")
done
for m in "${models[@]}"; do
  name=${m%%:*} path=${m#*:}
  for e in ${EVAL_SEEDS:-1 2 3}; do
    "$build/nmcmc" sample --sampler learned --model "$path" --chains 256 --warmup 1000 --draws 1000 \
      --init exact --seed "$e" -q > "$out/$name.eval$e.txt" 2>&1
    ess=$(sed -n 's/^paper ESS (true moments): min \([0-9.e+-]*\)\/MH step, \([0-9.e+-]*\)\/grad.*/\1 \2/p' "$out/$name.eval$e.txt")
    rhat=$(sed -n 's/.*max R-hat \([0-9.]*\).*/\1/p' "$out/$name.eval$e.txt")
    set -- $ess
    printf '{"experiment": "%s", "model": "%s", "eval_seed": %s, "ess_per_mh_min": %s, "ess_per_grad_min": %s, "max_rhat": %s}\n' \
      "$exp" "$name" "$e" "${1:-nan}" "${2:-nan}" "${rhat:-nan}"
  done
done
