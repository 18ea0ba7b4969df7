#!/bin/bash
# The GPU checks (issue #37) as one command that ends within LIMIT seconds (default 560): on a
# machine with an NVIDIA GPU and a PyTorch installation, no Debian packages and no network:
#   1. builds nmcmc against PyTorch's LibTorch (scripts/build_with_pytorch.sh DEPS build-gpu),
#      unless build-gpu/nmcmc is already there (a rerun on the same machine);
#   2. runs the device-taking tests on CUDA (NMCMC_TEST_DEVICE=cuda: the baseline and NUTS
#      invariance tests and their power checks) and, beside them, the unit suite on the CPU;
#   3. runs `nmcmc reproduce --profile paper --only funnel1 --device cuda` (the paper's batch
#      8192 and 5000 steps) until the time is up, resuming from RESUME/model.pt.part-* (a
#      previous command's OUT) if given; a stop checkpoints the training (SIGINT), so the next
#      command resumes it.
# Everything it reports lands in OUT (default /tmp/gpu_out): machine.txt, build.log, unit.log,
# statistical_cuda.log, paper.log, and the run's model.pt (in two parts), training_log.csv and
# results.json. Environment: LIMIT, TAIL_SECONDS (kept back from the build), TEST_SECONDS,
# MARGIN (kept back at the end), TARGETS (what to build), BUILD_UNIT=1 (the unit suite too).
#   bench/gpu_checks.sh DEPS [RESUME]      (DEPS: see scripts/build_with_pytorch.sh)
set -uo pipefail
deps=$1; resume=${2:-}
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
limit=${LIMIT:-560}; t0=$SECONDS
left() { echo $(( limit - (SECONDS - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "cores $(nproc)";
  c++ --version | head -1; cmake --version | head -1; } 2>&1 | tee "$out/machine.txt"
if [ ! -x build-gpu/nmcmc ]; then
  KEEP_GOING=1 timeout $(( $(left) - ${TAIL_SECONDS:-150} )) scripts/build_with_pytorch.sh "$deps" build-gpu \
    ${TARGETS:-nmcmc_cli nmcmc_statistical_tests ${BUILD_UNIT:+nmcmc_unit_tests}} > "$out/build.log" 2>&1
  echo "build: rc $? after $((SECONDS - t0)) s" | tee -a "$out/machine.txt"
  grep -E "error|FAILED|^LibTorch|^C\+\+" "$out/build.log" | head -60
fi
[ -x build-gpu/nmcmc ] || exit 1
build-gpu/nmcmc info 2>&1 | tee -a "$out/machine.txt"
t=${TEST_SECONDS:-90}
if [ -x build-gpu/tests/nmcmc_unit_tests ]; then
  (OMP_NUM_THREADS=6 timeout "$t" build-gpu/tests/nmcmc_unit_tests --gtest_brief=1 > "$out/unit.log" 2>&1
   echo "unit: rc $?" >> "$out/unit.log") &
fi
if [ ! -x build-gpu/tests/nmcmc_statistical_tests ]; then
  echo "statistical tests: not built" | tee "$out/statistical_cuda.log"
else
  NMCMC_TEST_DEVICE=cuda timeout "$t" build-gpu/tests/nmcmc_statistical_tests \
  --gtest_filter='Invariance.RandomWalk:Invariance.Mala:Invariance.Hmc*:Invariance.NutsUnit*:Invariance.NutsWithUniform*:InvariancePower.Mala*:InvariancePower.Hmc*:InvariancePower.Nuts*:InvariancePower.FrozenKernelFails' \
  > "$out/statistical_cuda.log" 2>&1
  echo "statistical on cuda: rc $?" | tee -a "$out/statistical_cuda.log"
fi
wait
grep -hE "(PASSED|FAILED|SKIPPED|OK) \]|\[==========\]|rc " "$out/statistical_cuda.log" "$out/unit.log" 2>/dev/null | head -60
mkdir -p /tmp/paper/funnel1
if [ -n "$resume" ] && [ -f "$resume/model.pt.part-00" ]; then
  cat "$resume"/model.pt.part-* > /tmp/paper/funnel1/model.pt && cp "$resume/training_log.csv" /tmp/paper/funnel1/
fi
echo "paper profile: $(left) s left"
timeout -s INT -k 20 $(( $(left) - ${MARGIN:-40} )) build-gpu/nmcmc reproduce --profile paper --only funnel1 --device cuda \
  --no-figures -o /tmp/paper > "$out/paper.log" 2>&1
echo "reproduce: rc $?" | tee -a "$out/paper.log"
tr '\r' '\n' < "$out/paper.log" | grep -v "^\s*$" | awk 'NR % 20 == 1 || /==|nuts|mala|hmc|learned|interrupt|rc|rror/' | tail -40
# The checkpoint (over 16 MiB at the paper's width and batch: the device tool's limit per file)
# comes back in two parts: cat model.pt.part-* > model.pt.
[ -f /tmp/paper/funnel1/model.pt ] && split -n 2 -d /tmp/paper/funnel1/model.pt "$out/model.pt.part-"
cp /tmp/paper/funnel1/training_log.csv "$out/" 2>/dev/null
cp /tmp/paper/results.json "$out/" 2>/dev/null
true
