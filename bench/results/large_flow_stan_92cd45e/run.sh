#!/bin/bash
# NUTS through the flow and the best NUTS, re-measured on one machine after the Stan-program accounting mend
export PYTHONPATH=/work/main/build/python NMCMC_STAN_CACHE=/work/main/build/stan-cache
S=/work/main/scripts/posteriordb.py
for job in "diamonds-diamonds flow" "diamonds-diamonds dense" "german_credit_sparse_logistic_regression flow" "german_credit_sparse_logistic_regression diag" "radon_contextual_effects_minnesota flow"; do
  set -- $job
  if [ $2 = flow ]; then args="--transport flow"; else args="--metric $2"; fi
  /usr/bin/time -v timeout 1800 /usr/bin/python3 $S check --suite large --sampler nuts $args --only $1 --json ${1}_$2.json > ${1}_$2.log 2>&1
done
echo done > DONE
