#!/usr/bin/env bash
# nmcmc's NUTS against Stan 2.21 on small models (issue #34 item 3), as a user brings them:
# posteriordb's eight schools (non-centred, 10 parameters) and kilpisjarvi (3 parameters, the two
# coefficients correlated near -1), ported as TorchScript modules (scripts/posteriordb.py export)
# for nmcmc, and as Stan programs (bench/stan/) for rstan. One protocol: 4 chains, 1000 warm-up +
# 1000 draws, diagonal metric, target accept 0.8, one thread (Stan: the chains one after another on
# one core), seed 1. Seconds: nmcmc's warm-up + sampling (summary.json); Stan's per-chain elapsed
# warm-up + sampling summed (get_elapsed_time; compilation not counted).
# Needs: apt-get install r-cran-rstan r-cran-jsonlite (Debian's rstan looks for Boost under
# BH/include, which Debian's r-cran-bh does not ship: this script links it to /usr/include).
# Usage: bash bench/nuts_small_vs_stan.sh [OUT]   (about 10 minutes: two Stan compilations)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/nuts_small_vs_stan}
NMCMC=${NMCMC:-build/nmcmc}
mkdir -p "$OUT"
. bench/stan/ready.sh
/usr/bin/python3 scripts/posteriordb.py export "$OUT/modules" eight_schools-eight_schools_noncentered \
  kilpisjarvi_mod-kilpisjarvi > /dev/null
declare -A STAN=([eight_schools-eight_schools_noncentered]="eight_schools_noncentered eight_schools"
                 [kilpisjarvi_mod-kilpisjarvi]="kilpisjarvi kilpisjarvi_mod")
for p in eight_schools-eight_schools_noncentered kilpisjarvi_mod-kilpisjarvi; do
  read -r model data <<< "${STAN[$p]}"
  [ -f "$OUT/stan_$p.json" ] || Rscript bench/stan/run_stan.R "bench/stan/$model.stan" "posteriordb/data/$data.json" \
    4 1000 1000 1 "$OUT/stan_$p.json" > "$OUT/stan_$p.log" 2>&1
  [ -f "$OUT/nmcmc_$p/summary.json" ] || "$NMCMC" sample --module "$OUT/modules/$p.pt" --sampler nuts --metric diag \
    --chains 4 --warmup 1000 --draws 1000 --seed 1 --threads 1 --quiet --output "$OUT/nmcmc_$p" > "$OUT/nmcmc_$p.log"
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("| posterior | D | nmcmc s (warm-up + sampling) | Stan s | nmcmc / Stan, seconds | gradients per chain: nmcmc / Stan | "
      "bulk-ESS min: nmcmc / Stan | R-hat max: nmcmc / Stan | nmcmc us per batched gradient call |")
print("|---|---|---|---|---|---|---|---|---|")
for p in ("eight_schools-eight_schools_noncentered", "kilpisjarvi_mod-kilpisjarvi"):
    s = json.load(open(os.path.join(out, f"stan_{p}.json")))
    n = json.load(open(os.path.join(out, f"nmcmc_{p}", "summary.json")))
    ns = n["seconds_warmup"] + n["seconds_sampling"]
    ss = s["seconds_warmup"] + s["seconds_sampling"]
    ng = n["grads_warmup_per_chain"] + n["grads_per_step"] * n["draws"]
    sg = s["grads_total"] / s["chains"]
    call_us = 1e6 * n["seconds_sampling"] / (n["batch_grads_per_step"] * n["draws"])
    print(f"| {p} | {n['dim']} | {ns:.2f} | {ss:.3f} | {ns / ss:.1f} | {ng:.0f} / {sg:.0f} | "
          f"{n['min_ess_bulk']:.0f} / {s['min_ess_bulk']:.0f} | {n['max_rhat']:.3f} / {s['max_rhat']:.3f} | {call_us:.0f} |")
PY
