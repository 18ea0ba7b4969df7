#!/usr/bin/env bash
# Sample efficiency and speed of the baseline samplers on every paper target.
# ESS: 64 chains, 1000 warm-up (step size and diagonal mass matrix adapted), 2000 draws, float32,
# 1 thread; steps/s: the same kernels at 1, 64 and 1024 chains (no draws kept).
# Usage: bash bench/run_baselines.sh [build dir]   (prints a markdown table; ~15 minutes)
set -euo pipefail
B=${1:-build}
tmp=$(mktemp -d)
targets=('{"name":"icg"}' '{"name":"scg"}' '{"name":"funnel","dim":100,"sigma":1}' '{"name":"funnel","dim":20,"sigma":3}'
         '{"name":"logistic","dataset":"german"}' '{"name":"logistic","dataset":"australian"}' '{"name":"logistic","dataset":"heart"}')
echo "| target | sampler | accept | grads/step | paper ESS/step (min) | paper ESS/grad (min) | bulk-ESS/step (min) | min bulk-ESS/s | max R-hat | steps/s @1 | @64 | @1024 chains |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  for s in rwm mala hmc; do
    extra=""; [ "$s" = hmc ] && extra="--leapfrog 10 --jitter 0.2"
    "$B/nmcmc" sample --target-json "$t" --sampler $s $extra --adapt-mass --chains 64 --warmup 1000 --draws 2000 \
      --seed 1 --quiet --output "$tmp/run" > /dev/null
    speeds=""
    for c in 1 64 1024; do
      lf=""; [ "$s" = hmc ] && lf="--leapfrog 10"
      sp=$("$B/bench/nmcmc_bench" baseline --target-json "$t" --sampler $s $lf --chains $c --steps 300 --threads 1 |
           python3 -c "import json,sys; print('%.0f' % json.load(sys.stdin)['steps_per_second'])")
      speeds="$speeds | $sp"
    done
    python3 - "$tmp/run/summary.json" "$t" "$s" "$speeds" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); p = j.get("paper_ess", {})
f = lambda k: ("%.4g" % p[k]) if k in p else "n/a"
print("| %s | %s | %.3f | %.0f | %s | %s | %.4f | %.1f | %.3f %s |" % (sys.argv[2], sys.argv[3], j["accept_rate"], j["grads_per_step"],
      f("ess_per_step_min"), f("ess_per_grad_min"), j["ess_bulk_per_step"], j["ess_bulk_per_second"], j["max_rhat"], sys.argv[4]))
PY
  done
done
rm -rf "$tmp"
