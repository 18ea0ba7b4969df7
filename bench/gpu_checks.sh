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
# Everything it reports lands in OUT (default /tmp/gpu_out), as logs.tar.gz (machine.txt, build.log, unit.log,
# statistical_cuda.log, paper.log, training_log.csv, entry[.partial].json, results.json) and the run's model.pt
# (in 15 MiB parts). Environment: LIMIT, TAIL_SECONDS (kept back from the build), TEST_SECONDS,
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
t=${TEST_SECONDS:-120}
# The tests run beside the paper's training (16 cores; the training is one GPU stream): they
# share the GPU with it for their first t seconds at most.
if [ -x build-gpu/tests/nmcmc_unit_tests ]; then
  (OMP_NUM_THREADS=6 timeout "$t" build-gpu/tests/nmcmc_unit_tests --gtest_brief=1 > "$out/unit.log" 2>&1
   echo "unit: rc $?" >> "$out/unit.log") &
fi
if [ ! -x build-gpu/tests/nmcmc_statistical_tests ]; then
  echo "statistical tests: not built" | tee "$out/statistical_cuda.log"
else
  (OMP_NUM_THREADS=6 NMCMC_TEST_DEVICE=cuda timeout "$t" build-gpu/tests/nmcmc_statistical_tests \
   --gtest_filter='Invariance.RandomWalk:Invariance.Mala:Invariance.Hmc*:Invariance.NutsUnit*:Invariance.NutsWithUniform*:InvariancePower.Mala*:InvariancePower.Hmc*:InvariancePower.Nuts*:InvariancePower.FrozenKernelFails' \
   > "$out/statistical_cuda.log" 2>&1
   echo "statistical on cuda: rc $?" >> "$out/statistical_cuda.log") &
fi
# The run's folder stays in the build folder, which a rerun on the same machine keeps.
paper=build-gpu/paper
mkdir -p $paper/funnel1
if [ -n "$resume" ] && [ -f "$resume/model.pt.part-00" ] && [ ! -f $paper/funnel1/model.pt ]; then
  cat "$resume"/model.pt.part-* > $paper/funnel1/model.pt && cp "$resume/training_log.csv" $paper/funnel1/
fi
echo "paper profile: $(left) s left"
timeout -s INT -k 20 $(( $(left) - ${MARGIN:-45} )) build-gpu/nmcmc reproduce --profile paper --only funnel1 --device cuda \
  --no-figures -o $paper > "$out/paper.log" 2>&1
echo "reproduce: rc $?" | tee -a "$out/paper.log"
wait
grep -hE "(PASSED|FAILED|SKIPPED|OK) \]|\[==========\]|rc " "$out/statistical_cuda.log" "$out/unit.log" 2>/dev/null | head -60
tr '\r' '\n' < "$out/paper.log" | grep -v "^\s*$" | awk 'NR % 25 == 1 || /==|nuts|mala|hmc|learned|interrupt|rc|rror/' | tail -40
# At most 8 files come back from the device tool, 16 MiB each: the logs and the run's small files
# in one archive, the checkpoint (over 16 MiB at the paper's width and batch) in 15 MiB parts
# (cat model.pt.part-* > model.pt).
for f in funnel1/training_log.csv funnel1/entry.json funnel1/entry.partial.json results.json; do
  [ -f $paper/$f ] && cp $paper/$f "$out/"
done
(cd "$out" && tar czf logs.tar.gz --remove-files $(ls | grep -v '^model\.pt'))
[ -f $paper/funnel1/model.pt ] && split -b 15M -d $paper/funnel1/model.pt "$out/model.pt.part-"
ls -la "$out"
true
