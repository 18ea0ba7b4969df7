#!/usr/bin/env bash
# The collectives' share of a data-parallel training step (issue #12): Funnel-1 (width 512, 3
# sub-steps, D = 100) at a global batch of 8192, 2 ranks on loopback with one thread each, against
# 1 process at the same batch. Each line of the output is one JSON result.
#   bash bench/distributed.sh [reps] > bench/results/distributed.jsonl
set -euo pipefail
BENCH=${BENCH:-build/bench/nmcmc_bench}
REPS=${1:-5}
CONFIG=${CONFIG:-configs/funnel1.json}
BATCH=${BATCH:-8192}
# One process, the whole batch.
$BENCH distributed --config "$CONFIG" --batch "$BATCH" --reps "$REPS" --threads 1
# Two ranks: the torchrun variables, one process each.
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 1 0; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
    $BENCH distributed --config "$CONFIG" --batch "$BATCH" --reps "$REPS" --threads 1 &
done
wait
