#!/usr/bin/env bash
# Funnel-3 (20-d, sigma 3), nmcmc's NUTS against Stan 2.21 in one session on one machine (issue #34
# item 4): x0's bulk-ESS per gradient over seeds 1-5, 4 chains x (1000 warm-up + 2000 draws),
# diagonal metric, target accept 0.8; nmcmc also with one chain per adaptation (--chains 1, four
# runs per seed, as Stan adapts each chain on its own).
# Needs r-cran-rstan and r-cran-jsonlite (see bench/nuts_small_vs_stan.sh). Usage:
# bash bench/funnel3_vs_stan.sh [OUT]   (about 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/funnel3_vs_stan}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
. bench/stan/ready.sh
for s in 1 2 3 4 5; do
  [ -f "$OUT/stan_s$s.json" ] || Rscript bench/stan/run_stan.R bench/stan/funnel3.stan bench/stan/empty.json 4 1000 2000 "$s" \
    "$OUT/stan_s$s.json" > "$OUT/stan_s$s.log" 2>&1
  [ -f "$OUT/nmcmc_s$s/summary.json" ] || "$NMCMC" sample --target funnel --dim 20 --sigma 3 --sampler nuts --metric diag \
    --chains 4 --warmup 1000 --draws 2000 --seed "$s" --threads 1 --quiet --output "$OUT/nmcmc_s$s" > "$OUT/nmcmc_s$s.log"
  for c in 1 2 3 4; do
    seed=$((s * 10 + c))
    [ -f "$OUT/nmcmc1_s$seed/summary.json" ] || "$NMCMC" sample --target funnel --dim 20 --sigma 3 --sampler nuts \
      --metric diag --chains 1 --warmup 1000 --draws 2000 --seed "$seed" --threads 1 --quiet --output "$OUT/nmcmc1_s$seed" \
      > "$OUT/nmcmc1_s$seed.log"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def nm(path):
    j = json.load(open(path))
    p = j["parameters"][0]
    grads = j["grads_per_step"] * j["draws"] * j["chains"]
    return p["ess_bulk"], grads, j["max_rhat"], j.get("divergences", 0)
rows, converged = [], []
print("| seed | Stan x0 bulk-ESS/grad | nmcmc 4 chains pooled | nmcmc 1 chain x 4 runs (summed) | Stan R-hat | nmcmc R-hat |")
print("|---|---|---|---|---|---|")
for s in range(1, 6):
    st = json.load(open(os.path.join(out, f"stan_s{s}.json")))
    stan = st["ess_bulk"]["x0"] / st["grads_sampling"]
    e, g, rh, _ = nm(os.path.join(out, f"nmcmc_s{s}", "summary.json"))
    ones = [nm(os.path.join(out, f"nmcmc1_s{s * 10 + c}", "summary.json")) for c in (1, 2, 3, 4)]
    single = sum(o[0] for o in ones) / sum(o[1] for o in ones)
    rows.append((stan, e / g, single))
    converged.append(st["max_rhat"] <= 1.01 and rh <= 1.01)
    print(f"| {s} | {stan:.3g} | {e / g:.3g} | {single:.3g} | {st['max_rhat']:.3f} | {rh:.3f} |")
med = [statistics.median(r[i] for r in rows) for i in range(3)]
print(f"| median | {med[0]:.3g} | {med[1]:.3g} | {med[2]:.3g} | | |")
print("\nAn ESS ratio needs R-hat <= 1.01 in both runs: "
      + ("none here (see the R-hat columns)." if not all(ok for ok in converged) else
         f"nmcmc pooled / Stan {med[1] / med[0]:.2f}x, single-chain adaptation / Stan {med[2] / med[0]:.2f}x."))
PY
