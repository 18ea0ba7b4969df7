#!/bin/bash
export PYTHONPATH=/work/main/build/python NMCMC_STAN_CACHE=/work/main/build/stan-cache
S=/work/main/scripts/posteriordb.py
for p in brownian_motion_unknown_scales mcycle_gp-accel_gp; do
  /usr/bin/time -v timeout 1500 /usr/bin/python3 $S check --suite large --sampler nuts --transport flow --only $p --json ${p}_flow.json > ${p}_flow.log 2>&1
done
echo done > DONE2
