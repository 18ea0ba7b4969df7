#!/usr/bin/python3
"""Does the learned sampler gain per second from more chains? (issue #65, #64)

    bench/learned_chains.py [POSTERIOR] [PREVIOUS]      (default nes1976-nes from nes1972-nes)
    bench/learned_chains.py --suite large POSTERIOR [--chains 4 16 64] [--draws N] [--option KEY=VALUE ...]

Trains the learned sampler on PREVIOUS (train's defaults, float64, seed 1), trains from it on
POSTERIOR (`from_model=`, Note [Training from a previous model]), then samples POSTERIOR with 4,
16, 64 and 256 chains (100 burn-in steps, 1,000 draws each) and prints min bulk-ESS per sampling
second, R-hat and the moment checks against posteriordb's reference; last, NUTS with a dense
metric (4 chains, 1,000 + 1,000) for scale. The learned step's networks run batched over chains;
a Stan program's gradient runs chain by chain, so the gain from more chains is the networks'
share of a step. With --suite large it trains on POSTERIOR itself (no PREVIOUS; the large suite's
references), samples with the default thin (Note [The learned sampler's thinning]) and 1,000
warm-up steps, as `posteriordb.py check` does, and skips NUTS (its table has the best NUTS).
`--option KEY=VALUE` sets a `train` option (a JSON value: `--option precondition_chains=8`); the
training's phases are printed (the preconditioner's and transport's warm-ups, the loop, the checks).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import nmcmc  # noqa: E402  (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402,F401
from posteriordb import moments_check_named, stan_reference  # noqa: E402


def print_phases(rec: dict) -> None:
    """The training record's phases: seconds and gradients of each warm-up, the loop, the checks."""
    def walk(part, path):
        if not isinstance(part, dict):
            return
        if "seconds" in part and "grads" in part:
            print(f"  {path}: {part['seconds']:.1f} s, {part['grads']:.3g} gradients", flush=True)
        if "affine_seconds" in part:  # auto's affine warm-up, which chose the flow
            print(f"  {path} (affine): {part['affine_seconds']:.1f} s, {part['affine_grads']:.3g} gradients", flush=True)
        for key, sub in part.items():
            if key != "rounds":
                walk(sub, f"{path}.{key}")
    walk(rec.get("preconditioner"), "preconditioner")
    for c in [rec.get("check")] + list(rec.get("time_extensions") or []):
        if isinstance(c, dict):
            print(f"  check at {c.get('at_step')}: min bulk-ESS {c.get('min_ess_bulk', 0):.0f}, "
                  f"R-hat {c.get('max_rhat', 0):.3f}", flush=True)
    print(f"  steps {rec.get('steps')}, stopped {rec.get('stopped')}", flush=True)


def main() -> int:
    import argparse
    import posteriordb
    ap = argparse.ArgumentParser()
    ap.add_argument("posterior", nargs="?", default="nes1976-nes")
    ap.add_argument("previous", nargs="?", default=None)
    ap.add_argument("--suite", choices=["posteriordb", "large"], default="posteriordb")
    ap.add_argument("--chains", type=int, nargs="+", default=None)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    options = {"seed": 1}
    for kv in args.option:
        key, _, value = kv.partition("=")
        options[key] = json.loads(value)
    posteriordb.SUITE = args.suite
    large = args.suite == "large"
    post = args.posterior
    ref = stan_reference(post)
    t = nmcmc.stan_model(ref["program"], ref["data_file"], dtype="float64")
    s = time.time()
    train_seconds = 0.0
    if large:
        m = nmcmc.train(t, progress=False, dtype="float64", options=options)
        train_seconds = time.time() - s
        print(f"cold train {train_seconds:.1f} s, {m.training.get('stopped')}", flush=True)
        print_phases(m.training)
    else:
        ref0 = stan_reference(args.previous or "nes1972-nes")
        t0 = nmcmc.stan_model(ref0["program"], ref0["data_file"], dtype="float64")
        m0 = nmcmc.train(t0, progress=False, dtype="float64", options={"seed": 1})
        print("cold train", time.time() - s, flush=True)
        s = time.time()
        m = nmcmc.train(t, progress=False, dtype="float64", options={"seed": 1}, from_model=m0)
        print("from train", time.time() - s, m.training.get("stopped"), flush=True)
    for chains in args.chains or ([4, 16, 64] if large else [4, 16, 64, 256]):
        s = time.time()
        r = nmcmc.sample(sampler="learned", model=m, chains=chains, warmup=1000 if large else 100,
                         draws=args.draws, seed=1, progress=False)
        sm = r.summary
        ok, _, _, why, _ = moments_check_named(sm, ref, r.draws)
        steps = sm["draws"] * sm.get("thin", 1)
        print(f"C={chains} draws={sm['draws']} thin={sm.get('thin', 1)} wall {time.time() - s:.2f} "
              f"samp {sm['seconds_sampling']:.2f} warm {sm['seconds_warmup']:.2f} "
              f"ms/batch-step {1e3 * sm['seconds_sampling'] / steps:.3f} "
              f"ms/chain-step {1e3 * sm['seconds_sampling'] / steps / chains:.3f} "
              f"ess {sm['min_ess_bulk']:.0f} rhat {sm['max_rhat']:.4f} "
              f"ess/s {sm['min_ess_bulk'] / sm['seconds_sampling']:.1f} "
              f"ess/grad {sm['min_ess_bulk'] / (steps * chains * sm['grads_per_step'] / sm.get('thin', 1)):.4f} "
              f"ok {ok} {why}", flush=True)
        if large:  # all-in: training, the sampler's warm-up, and sampling at this rate to 10,000
            rate = sm["min_ess_bulk"] / sm["seconds_sampling"]
            print(f"  all-in to 10,000: {train_seconds + sm['seconds_warmup'] + 1e4 / rate:.0f} s", flush=True)
    if large:
        return 0
    r = nmcmc.sample(t, "nuts", chains=4, warmup=1000, draws=1000, seed=1, progress=False, metric="dense")
    sm = r.summary
    print(f"NUTS dense C=4 samp {sm['seconds_sampling']:.2f} warm {sm['seconds_warmup']:.2f} "
          f"ess {sm['min_ess_bulk']:.0f} ess/s {sm['min_ess_bulk'] / sm['seconds_sampling']:.0f}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
