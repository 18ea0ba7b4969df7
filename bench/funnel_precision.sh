#!/usr/bin/env bash
# How much of a change in Funnel-3's (or Funnel-1's) learned ESS is noise, and does training with
# bfloat16 GEMMs cost efficiency? For each training seed and each training precision in
# TRAIN_MATMULS, trains the `cpu` profile's Funnel-3 (6000 steps, batch 128, width 512), then
# evaluates every model (and MODEL, e.g. a profile run's own, if given) as the profile does (256
# chains from exact draws, 1000 burn-in + 1000 draws, the paper's ESS with true moments, bulk-ESS)
# with each evaluation seed and each sampling precision in SAMPLE_MATMULS.
# Prints one JSON line per evaluation; each run's full text output stays in bench/out/precision_*/.
# Usage: bash bench/funnel_precision.sh [BUILD_DIR]
#   TRAIN_SEEDS="2 3 5" TRAIN_MATMULS="bfloat16 native" EVAL_SEEDS="1 2"
#   SAMPLE_MATMULS="bfloat16 native" EXPERIMENT=funnel3 MODEL=bench/out/cpu/funnel3/model.pt
#   TRAIN_ONLY=1 trains and stops; a model already trained is not trained again; TRAIN_SEEDS=""
#   with MODEL evaluates MODEL only.
#   (The spread between trainings at the shipped default: TRAIN_MATMULS=auto SAMPLE_MATMULS=auto.)
# (a pair of trainings takes ~18 minutes on a 2-vCPU Sapphire Rapids machine)
set -euo pipefail
build=${1:-build}
exp=${EXPERIMENT:-funnel3}
out=bench/out/precision_$exp
mkdir -p "$out"
case $exp in
  funnel3) train_args=(--batch 128 --steps 6000 --set model.hidden=512) ;;
  funnel1) train_args=(--batch 128 --steps 5000) ;;
  *) echo "EXPERIMENT must be funnel1 or funnel3" >&2; exit 64 ;;
esac
date -u +"# %Y-%m-%d %H:%M UTC, commit $(git rev-parse --short HEAD), $exp, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

# evaluate NAME MODEL TRAIN_SEED TRAIN_MATMUL TRAIN_SECONDS: one JSON line per sampling precision
# and evaluation seed.
evaluate() {
  local name=$1 model=$2 seed=$3 tm=$4 secs=$5 sm e f paper bulk rhat
  for sm in ${SAMPLE_MATMULS:-bfloat16 native}; do
    for e in ${EVAL_SEEDS:-1 2}; do
      f=$out/$name.sample_$sm.eval$e.txt
      "$build/nmcmc" sample --sampler learned --model "$model" --matmul "$sm" --chains 256 --warmup 1000 \
        --draws 1000 --init exact --seed "$e" -q > "$f" 2>&1
      paper=$(sed -n 's/^paper ESS (true moments): min \([0-9.e+-]*\)\/MH step, \([0-9.e+-]*\)\/grad; x.1 \([0-9.e+-]*\)\/step.*/\1 \2 \3/p' "$f")
      bulk=$(sed -n 's/^min bulk-ESS [0-9]* of [0-9]* draws (\([0-9.e+-]*\)\/MH step.*/\1/p' "$f")
      rhat=$(sed -n 's/.*max R-hat \([0-9.]*\).*/\1/p' "$f")
      set -- $paper
      printf '{"experiment": "%s", "model": "%s", "train_seed": %s, "train_matmul": "%s", "train_seconds": %s, "sample_matmul": "%s", "eval_seed": %s, "ess_per_mh_min": %s, "ess_per_grad_min": %s, "neck_ess_per_mh": %s, "bulk_ess_per_mh_min": %s, "max_rhat": %s}\n' \
        "$exp" "$name" "$seed" "$tm" "$secs" "$sm" "$e" "${1:-null}" "${2:-null}" "${3:-null}" "${bulk:-null}" "${rhat:-null}"
    done
  done
}

[ -n "${MODEL:-}" ] && [ -z "${TRAIN_ONLY:-}" ] && evaluate given "$MODEL" null "?" null
for s in ${TRAIN_SEEDS-2 3 5}; do
  for tm in ${TRAIN_MATMULS:-bfloat16 native}; do
    model=$out/seed$s.$tm.pt
    if [ ! -s "$model" ]; then
      "$build/nmcmc" train --config "configs/$exp.json" "${train_args[@]}" --set train.seed="$s" \
        --set model.matmul="$tm" --set train.checkpoint_every=100000 -o "$model" -q > "$out/seed$s.$tm.train.txt"
    fi
    [ -n "${TRAIN_ONLY:-}" ] && continue
    secs=$(sed -n 's/^trained [0-9]* steps in \([0-9.]*\) s.*/\1/p' "$out/seed$s.$tm.train.txt" 2>/dev/null || true)
    evaluate "seed$s.$tm" "$model" "$s" "$tm" "${secs:-null}"
  done
done
