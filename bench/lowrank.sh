#!/usr/bin/env bash
# Issue #16: does the low-rank preconditioner pay on a large correlated target? NeuTra's
# ill-conditioned Gaussian (rotated_icg: Gamma(0.5, 1) precision eigenvalues, random rotation) at
# DIM dimensions, whose spectrum spreads over orders of magnitude in every direction (measured: no
# 16-factor fit helps there), or (TARGET=spiked) a Gaussian with a few wide directions over unit
# variance, the case a low-rank factor is built for.
# Trains the learned sampler (Langevin variant, learned L) with precondition = lowrank (what
# `auto` picks above 1000 dimensions), diag and dense for the same steps and batch, samples 64
# chains x 1000 draws from exact draws, and prints one JSON line per run with the training time,
# the paper's ESS per gradient (true moments, minimum over dimensions) and the accept rate; then
# NUTS with a diagonal and a dense metric for reference.
# spiked: 8 wide directions (sd 30) in random orientation and unit variance elsewhere.
# Usage: bash bench/lowrank.sh [BUILD_DIR]   (TARGET = rotated_icg | spiked, DIM, STEPS, BATCH,
# PRECONDITIONS="lowrank diag dense", NUTS_METRICS="diag dense", OUT (the output directory) from the
# environment; quiet machine.
# A diagonal metric runs NUTS at its tree-depth limit on rotated_icg.)
set -euo pipefail
build=${1:-build}
target=${TARGET:-rotated_icg}
case "$target" in
  rotated_icg | spiked) ;;
  *) echo "lowrank.sh: TARGET must be rotated_icg or spiked, not '$target'" >&2; exit 64 ;;
esac
dim=${DIM:-1200}
steps=${STEPS:-1500}
batch=${BATCH:-256}
spec="{\"name\": \"$target\", \"dim\": $dim}"
out=${OUT:-bench/out/lowrank_${target}_$dim}
mkdir -p "$out"
date -u +"# %Y-%m-%d %H:%M UTC, commit $(git rev-parse --short HEAD), target $target, dim $dim, steps $steps, batch $batch"
ess_of() {  # sample.txt -> "ess_per_grad accept"
  local e a
  e=$(sed -n 's/^paper ESS (true moments): min [0-9.e+-]*\/MH step, \([0-9.e+-]*\)\/grad.*/\1/p' "$1")
  a=$(sed -n 's/^chains .* accept \([0-9.]*\) .*/\1/p' "$1")
  echo "${e:-nan} ${a:-nan}"
}
for pre in ${PRECONDITIONS-lowrank diag dense}; do
  start=$(date +%s.%N)
  "$build/nmcmc" train --target-json "$spec" --steps "$steps" --batch "$batch" \
    --set model.precondition="$pre" --set train.checkpoint_every=100000 -o "$out/$pre.pt" -q > "$out/$pre.train.txt"
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  "$build/nmcmc" sample --sampler learned --model "$out/$pre.pt" --chains 64 --warmup 500 --draws 1000 \
    --init exact -q > "$out/$pre.sample.txt" 2>&1
  read -r ess acc < <(ess_of "$out/$pre.sample.txt")
  printf '{"target": "%s", "sampler": "learned", "precondition": "%s", "dim": %s, "steps": %s, "batch": %s, "train_seconds": %.1f, "ess_per_grad_min": %s, "accept": %s}\n' \
    "$target" "$pre" "$dim" "$steps" "$batch" "$secs" "$ess" "$acc"
done
for metric in ${NUTS_METRICS-diag dense}; do
  "$build/nmcmc" sample --target-json "$spec" --sampler nuts --metric "$metric" --chains 16 \
    --warmup 1000 --draws 1000 --init exact -q > "$out/nuts_$metric.sample.txt" 2>&1 || true
  read -r ess acc < <(ess_of "$out/nuts_$metric.sample.txt")
  printf '{"target": "%s", "sampler": "nuts", "metric": "%s", "dim": %s, "ess_per_grad_min": %s, "accept": %s}\n' "$target" "$metric" "$dim" "$ess" "$acc"
done
