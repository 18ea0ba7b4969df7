#!/usr/bin/env bash
# nmcmc against the authors' PyTorch code (NEM-MC/Entropy-NeuralMC), alternately in one run on one
# machine: Funnel-1 (512/3), training steps at batch 128 and 1024, sampling steps of 256 chains;
# one thread each (OPENBLAS_NUM_THREADS=1), median of 10 steps after warm-up, three rounds.
# Twice: float32 GEMMs on both sides (the authors' code as published, nmcmc with matmul = native),
# and bfloat16 GEMMs on both sides (the authors' code under PyTorch's CPU autocast to bfloat16,
# nmcmc with matmul = bfloat16; Note [Bfloat16 matmul]); on a CPU without AMX-BF16 the bfloat16
# rows measure a slow path and mean little. A fifth run per case: the authors' float32 code under
# the malloc policy that nmcmc sets for itself (Note [Allocator policy], through GLIBC_TUNABLES),
# so that the table can say how much of the ratio that policy alone is.
# Usage: bench/side_by_side.sh AUTHORS_CHECKOUT [OUT.jsonl]
#   (AUTHORS_CHECKOUT: e.g. `git archive` of github.com/NEM-MC/Entropy-NeuralMC into a folder;
#    it is never copied into this project)
set -euo pipefail
AUTHORS=${1:?give a checkout of NEM-MC/Entropy-NeuralMC}
OUT=${2:-bench/out/side_by_side.jsonl}
BENCH=${BENCH:-build/bench/nmcmc_bench}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# The same OpenBLAS kernels on both sides: the ones nmcmc runs with (Note [OpenBLAS's kernels]: it
# chooses better ones where OpenBLAS fell back to SSE3 kernels; the authors' Python does not).
OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$(build/nmcmc --version | sed -n 's/^OpenBLAS kernels: \([A-Za-z0-9]*\).*/\1/p')}
export OPENBLAS_CORETYPE
echo "OpenBLAS kernels on both sides: ${OPENBLAS_CORETYPE:-as OpenBLAS picks them}" >&2
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
for round in 1 2 3; do
  for case in "train 128" "train 1024" "sample 256"; do
    set -- $case
    /usr/bin/python3 bench/authors_step.py "$AUTHORS" --mode "$1" --batch "$2" --reps 10 | sed "s/^{/{\"round\": $round, /" >> "$OUT"
    "$BENCH" learned --config configs/funnel1.json --mode "$1" --batch "$2" --reps 10 --threads 1 --matmul native |
      sed "s/^{/{\"round\": $round, \"who\": \"nmcmc\", /" >> "$OUT"
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=536870912 \
      /usr/bin/python3 bench/authors_step.py "$AUTHORS" --mode "$1" --batch "$2" --reps 10 | sed "s/^{/{\"round\": $round, /" >> "$OUT"
    /usr/bin/python3 bench/authors_step.py "$AUTHORS" --mode "$1" --batch "$2" --reps 10 --autocast | sed "s/^{/{\"round\": $round, /" >> "$OUT"
    "$BENCH" learned --config configs/funnel1.json --mode "$1" --batch "$2" --reps 10 --threads 1 --matmul bfloat16 |
      sed "s/^{/{\"round\": $round, \"who\": \"nmcmc\", /" >> "$OUT"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| case | GEMMs | authors (s/step) | nmcmc (s/step) | nmcmc / authors |")
print("|---|---|---|---|---|")
for gemm, autocast, matmul in (("float32", False, "native"), ("bfloat16", True, "bfloat16")):
    for mode, batch in (("train", 128), ("train", 1024), ("sample", 256)):
        a = [r["seconds_per_step"] for r in rows if r.get("bench") == "authors" and r["mode"] == mode
             and r["batch"] == batch and r.get("autocast", False) == autocast and r.get("malloc", "default") == "default"]
        n = [r["seconds_per_step"] for r in rows if r.get("who") == "nmcmc" and r.get("mode") == mode
             and r.get("batch") == batch and r.get("matmul", "native") == matmul]
        ratios = [x / y for x, y in zip(n, a)]
        print(f"| {mode} {batch} | {gemm} | {statistics.median(a):.3f} | {statistics.median(n):.3f} | "
              f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)}) |")
# nmcmc as shipped (matmul = auto: float32 training, bfloat16 sampling on a CPU with AMX-BF16)
# against the authors' code as published (float32)
amx = any(r.get("amx_bf16") for r in rows if r.get("who") == "nmcmc")
for mode, batch in (("train", 128), ("train", 1024), ("sample", 256)):
    shipped = "bfloat16" if mode == "sample" and amx else "native"
    a = [r["seconds_per_step"] for r in rows if r.get("bench") == "authors" and r["mode"] == mode
         and r["batch"] == batch and not r.get("autocast", False) and r.get("malloc", "default") == "default"]
    n = [r["seconds_per_step"] for r in rows if r.get("who") == "nmcmc" and r.get("mode") == mode
         and r.get("batch") == batch and r.get("matmul") == shipped]
    ratios = [x / y for x, y in zip(n, a)]
    print(f"| {mode} {batch} | nmcmc as shipped ({shipped}) vs authors float32 | {statistics.median(a):.3f} | "
          f"{statistics.median(n):.3f} | {statistics.median(ratios):.2f}x |")
# float32 both, the authors' code also under nmcmc's malloc policy
for mode, batch in (("train", 128), ("train", 1024), ("sample", 256)):
    a = [r["seconds_per_step"] for r in rows if r.get("bench") == "authors" and r["mode"] == mode
         and r["batch"] == batch and not r.get("autocast", False) and r.get("malloc") == "heap-reuse"]
    n = [r["seconds_per_step"] for r in rows if r.get("who") == "nmcmc" and r.get("mode") == mode
         and r.get("batch") == batch and r.get("matmul") == "native"]
    if not a:
        continue
    ratios = [x / y for x, y in zip(n, a)]
    print(f"| {mode} {batch} | float32 both, authors also with heap reuse | {statistics.median(a):.3f} | "
          f"{statistics.median(n):.3f} | {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)}) |")
PY
