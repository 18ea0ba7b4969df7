#!/usr/bin/env bash
# The issue-#11 run (larger than memory): samples, streams Stan CSV and NetCDF, summarises, and
# records the peak anonymous memory (RssAnon, sampled every 2 s), the phases' times and the files'
# sizes. Usage: bench/large_run.sh [OUT_DIR] [DRAWS] [FORMAT]   (defaults: bench/out/large_run 200000 csv,netcdf)
set -euo pipefail
OUT=${1:-bench/out/large_run}
DRAWS=${2:-200000}
FORMAT=${3:-csv,netcdf}
NMCMC=${NMCMC:-build/nmcmc}
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
start=$(date +%s.%N)
"$NMCMC" sample --target funnel --dim 100 --sigma 1 --sampler hmc --chains 64 --warmup 200 --draws "$DRAWS" \
  --format "$FORMAT" --output "$OUT" > "$OUT.log" 2> "$OUT.err" &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
  kb=$(awk '/RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  [ -n "$kb" ] && [ "$kb" -gt "$peak" ] && peak=$kb
  sleep 2
done
wait "$pid"
end=$(date +%s.%N)
/usr/bin/python3 - "$OUT" "$start" "$end" "$peak" "$FORMAT" "$DRAWS" <<'PY'
import json, os, sys
out, start, end, peak, fmt, draws = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
s = json.load(open(os.path.join(out, "summary.json")))
total = end - start
size = lambda f: sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out) if f(x))
print(f"draws {draws} x 64 chains x 100, format {fmt}")
print(f"wall {total:.0f} s: warm-up {s['seconds_warmup']:.0f} s, sampling {s['seconds_sampling']:.0f} s "
      f"({int(draws) / s['seconds_sampling']:.0f} draws/s), summary and the rest {total - s['seconds_warmup'] - s['seconds_sampling']:.0f} s")
print(f"peak RssAnon {peak / 1024 / 1024:.2f} GiB")
print(f"Stan CSV {size(lambda x: x.endswith('.csv')) / 1e9:.1f} GB, NetCDF {size(lambda x: x.endswith('.nc')) / 1e9:.1f} GB")
print(f"min bulk ESS {s['min_ess_bulk']:.0f}, max R-hat {s['max_rhat']:.4f}")
PY
