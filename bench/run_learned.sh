#!/usr/bin/env bash
# Seconds per training and sampling step of the learned sampler, the paper's four configurations
# at batch 128, 256, 1024, 8192; one process per measurement (so peak memory is per setting).
# Usage: bash bench/run_learned.sh [build dir] > bench/results/learned.jsonl
set -euo pipefail
B=${1:-build}
for cfg in scg icg funnel1 funnel3; do
  for batch in 128 256 1024 8192; do
    reps=5; [ "$batch" = 8192 ] && reps=2
    "$B/bench/nmcmc_bench" learned --config configs/$cfg.json --batch $batch --mode sample --reps $reps --threads 1
    "$B/bench/nmcmc_bench" learned --config configs/$cfg.json --batch $batch --mode train --reps $reps --threads 1
  done
done
for th in 2; do
  "$B/bench/nmcmc_bench" learned --config configs/funnel1.json --batch 1024 --mode train --reps 3 --threads $th
  "$B/bench/nmcmc_bench" learned --config configs/funnel1.json --batch 256 --mode sample --reps 3 --threads $th
done
