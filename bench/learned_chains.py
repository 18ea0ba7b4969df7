#!/usr/bin/python3
"""Does the learned sampler gain per second from more chains? (issue #65)

    bench/learned_chains.py [POSTERIOR] [PREVIOUS]      (default nes1976-nes from nes1972-nes)

Trains the learned sampler on PREVIOUS (train's defaults, float64, seed 1), trains from it on
POSTERIOR (`from_model=`, Note [Training from a previous model]), then samples POSTERIOR with 4,
16, 64 and 256 chains (100 burn-in steps, 1,000 draws each) and prints min bulk-ESS per sampling
second, R-hat and the moment checks against posteriordb's reference; last, NUTS with a dense
metric (4 chains, 1,000 + 1,000) for scale. The learned step's networks run batched over chains;
a Stan program's gradient runs chain by chain, so the gain from more chains is the networks'
share of a step.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import nmcmc  # noqa: E402  (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402,F401
from posteriordb import moments_check_named, stan_reference  # noqa: E402


def main() -> int:
    post = sys.argv[1] if len(sys.argv) > 1 else "nes1976-nes"
    prev = sys.argv[2] if len(sys.argv) > 2 else "nes1972-nes"
    ref0, ref = stan_reference(prev), stan_reference(post)
    t0 = nmcmc.stan_model(ref0["program"], ref0["data_file"], dtype="float64")
    t = nmcmc.stan_model(ref["program"], ref["data_file"], dtype="float64")
    s = time.time()
    m0 = nmcmc.train(t0, progress=False, dtype="float64", options={"seed": 1})
    print("cold train", time.time() - s, flush=True)
    s = time.time()
    m = nmcmc.train(t, progress=False, dtype="float64", options={"seed": 1}, from_model=m0)
    print("from train", time.time() - s, m.training.get("stopped"), flush=True)
    for chains in [4, 16, 64, 256]:
        s = time.time()
        r = nmcmc.sample(sampler="learned", model=m, chains=chains, warmup=100, draws=1000, seed=1, progress=False)
        sm = r.summary
        ok, _, _, why, _ = moments_check_named(sm, ref, r.draws)
        print(f"C={chains} draws=1000 wall {time.time() - s:.2f} samp {sm['seconds_sampling']:.2f} "
              f"warm {sm['seconds_warmup']:.2f} ess {sm['min_ess_bulk']:.0f} rhat {sm['max_rhat']:.4f} "
              f"ess/s {sm['min_ess_bulk'] / sm['seconds_sampling']:.0f} ok {ok} {why}", flush=True)
    r = nmcmc.sample(t, "nuts", chains=4, warmup=1000, draws=1000, seed=1, progress=False, metric="dense")
    sm = r.summary
    print(f"NUTS dense C=4 samp {sm['seconds_sampling']:.2f} warm {sm['seconds_warmup']:.2f} "
          f"ess {sm['min_ess_bulk']:.0f} ess/s {sm['min_ess_bulk'] / sm['seconds_sampling']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
