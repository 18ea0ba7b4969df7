#!/bin/bash
# Draws bit for bit between two builds of nmcmc:
#
#     bench/bit_for_bit.sh OLD_NMCMC NEW_NMCMC
#
# Runs the transported samplers (NUTS through the flow, with global moves and set layers and
# rounds, transport auto, the libtorch engine, the learned sampler trained in a flow's latent
# space, compare's nuts_flow row) with each binary and compares the md5 of every chain's Stan CSV
# without its comment lines (they hold the version, the command line and timings) and compare's
# record without its seconds. Same machine, same seeds: a change that keeps behaviour keeps them.
set -e
[ $# -eq 2 ] || { echo "usage: $0 OLD_NMCMC NEW_NMCMC" >&2; exit 64; }

one() {  # one BINARY DIRECTORY
  local b=$1 o=$2
  mkdir -p "$o" && cd "$o"
  "$b" sample --target funnel --dim 10 --sigma 1 --transport flow --chains 4 --warmup 400 --draws 200 --seed 3 -q -o flow --format csv
  "$b" sample --target funnel --dim 10 --sigma 1 --transport flow --global-moves --transport-layers 2 --transport-rounds 3 \
    --chains 4 --warmup 400 --draws 200 --seed 4 -q -o global --format csv
  "$b" sample --target funnel --dim 10 --sigma 3 --transport auto --chains 4 --warmup 400 --draws 200 --seed 5 -q -o auto --format csv
  "$b" sample --target icg --dim 5 --transport flow --engine libtorch --chains 2 --warmup 200 --draws 100 --seed 6 -q -o libtorch --format csv
  "$b" train --target funnel --dim 5 --transport flow --transport-layers 2 --steps 40 --seed 2 -q -o m.pt
  "$b" sample --sampler learned --model m.pt --chains 4 --draws 100 --seed 2 -q -o learned --format csv
  "$b" compare --target funnel --dim 5 --transport flow --nuts-metrics diag --chains 2 --warmup 200 --draws 100 --seed 7 -q -o cmp
  /usr/bin/python3 -c "
import json
d = json.load(open('cmp/compare.json'))['samplers']['nuts_flow']
print(json.dumps({k: v for k, v in d.items() if 'second' not in k and k not in ('transport', 'cost', 'all_in')}, sort_keys=True))" \
    > cmp_nuts_flow.json
  for d in flow global auto libtorch learned; do
    for f in "$d"/chain_*.csv; do echo "$f $(grep -v '^#' "$f" | md5sum | cut -c1-32)"; done
  done > md5.txt
  echo "cmp $(md5sum < cmp_nuts_flow.json | cut -c1-32)" >> md5.txt
}

work=$(mktemp -d)
old=$(readlink -f "$1") new=$(readlink -f "$2")
(one "$old" "$work/old") > "$work/old.log" 2>&1 || { cat "$work/old.log"; exit 1; }
(one "$new" "$work/new") > "$work/new.log" 2>&1 || { cat "$work/new.log"; exit 1; }
if diff "$work/old/md5.txt" "$work/new/md5.txt"; then
  echo "identical: $(wc -l < "$work/new/md5.txt") files ($work)"
else
  echo "DIFFERENT ($work)"
  exit 1
fi
