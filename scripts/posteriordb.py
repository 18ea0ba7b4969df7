#!/usr/bin/python3
"""posteriordb's reference posteriors (posteriordb/, ports of stan-dev/posteriordb) as nmcmc targets.

    scripts/posteriordb.py list
        the ported posteriors: dimension, kind
    scripts/posteriordb.py export DIR [POSTERIOR ...]
        DIR/POSTERIOR.pt: TorchScript energies on the unconstrained scale, with their parameter
        names and the reference posterior's mean and sd as attributes (names, ref_mean, ref_sd),
        for `nmcmc sample --module DIR/POSTERIOR.pt`, `nmcmc train --module ...` and Python
    scripts/posteriordb.py gradients [POSTERIOR ...]
        E[grad U] = 0 on the reference draws (checks each port, Jacobians included)
    scripts/posteriordb.py table NUTS.json LEARNED.json
        the benchmark table of two `check --json` runs (ratios: >1 means the learned sampler wins)
    scripts/posteriordb.py check [--sampler nuts|learned] [--only P ...] [--json FILE] [...]
        samples each posterior as a user would (NUTS with Stan's settings, or the learned sampler
        trained with `nmcmc train --module`'s defaults) and checks the moments against the
        reference: every mean within 5 MCSE (the run's and the reference's combined), every sd
        within 10 %; prints a row per posterior (exit 1 if any fails)

The moment checks' false-fail rate: a mean off by more than 5 combined MCSE has probability about
6e-7 per parameter for a correct sampler (normal approximation), about 6e-5 over the suite's ~110
parameters; an sd off by 10 % is over 4 standard errors at the 1,000 effective draws the runs
require (else the row fails as "ESS too low", which is not a moment failure).
"""
import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
import ports  # noqa: E402


def scripted(posterior: str) -> torch.jit.ScriptModule:
    m = ports.module(posterior)
    ref = ports.reference(posterior)
    m.dim = len(ref["names"])
    m.names = list(ref["names"])
    m.ref_mean = torch.tensor(ref["mean"], dtype=torch.float64)
    m.ref_sd = torch.tensor(ref["sd"], dtype=torch.float64)
    return torch.jit.script(m)


def export(directory: str, only) -> None:
    os.makedirs(directory, exist_ok=True)
    for p in only or ports.PORTS:
        torch.jit.save(scripted(p), os.path.join(directory, p + ".pt"))
        print(os.path.join(directory, p + ".pt"))


def gradient_z(posterior: str, module=None) -> torch.Tensor:
    """z-scores of the mean of grad U over the reference draws, per coordinate."""
    m = module if module is not None else ports.module(posterior)
    x = torch.tensor(ports.reference(posterior)["draws"], dtype=torch.float64).requires_grad_(True)
    g, = torch.autograd.grad(m(x).sum(), x)
    return g.mean(0) / (g.std(0) / math.sqrt(x.shape[0]))


def moments_check(summary: dict, ref: dict, mcse_z: float = 5.0, sd_tol: float = 0.10):
    """The moment checks on a run's summary.json: (passes, worst mean z, worst sd ratio, why)."""
    worst_z, worst_sd, why = 0.0, 1.0, []
    for k, p in enumerate(summary["parameters"]):
        ref_mcse = ref["sd"][k] / math.sqrt(ref["n"])
        z = abs(p["mean"] - ref["mean"][k]) / math.sqrt(p["mcse_mean"] ** 2 + ref_mcse ** 2)
        r = p["sd"] / ref["sd"][k]
        if z > worst_z:
            worst_z = z
        if abs(r - 1) > abs(worst_sd - 1):
            worst_sd = r
        if z > mcse_z:
            why.append(f"{ref['names'][k]} mean {p['mean']:.4g} vs {ref['mean'][k]:.4g} ({z:.1f} MCSE)")
        if abs(r - 1) > sd_tol:
            why.append(f"{ref['names'][k]} sd {p['sd']:.4g} vs {ref['sd'][k]:.4g}")
    return not why, worst_z, worst_sd, why


def check(args) -> int:
    sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
    import nmcmc
    rows, failed = [], 0
    for p in args.only or ports.PORTS:
        ref = ports.reference(p)
        t0 = time.time()
        row = {"posterior": p, "dim": len(ref["names"]), "kind": ref["kind"], "sampler": args.sampler}
        try:
            ok, why = one(nmcmc, p, ref, row, args, t0)
        except Exception as e:  # a run that fails is a failed row, not the end of the suite
            ok, why = False, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
            row.update({"seconds": time.time() - t0})
            print(f"FAIL {p:42s} {why[0]}", flush=True)
        row["passes"], row["why"] = ok, why
        failed += 0 if ok else 1
        rows.append(row)
        if args.json:  # after each posterior: a long run that is stopped keeps what it measured
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(f"{len(rows) - failed} of {len(rows)} posteriors pass")
    return 1 if failed else 0


def one(nmcmc, p, ref, row, args, t0):
    """Samples one posterior as `check` says; fills `row`; returns (passes, why)."""
    target = nmcmc.from_module(scripted(p), dtype=args.dtype)
    fixed_grads = fixed_seconds = 0.0  # warm-up, preconditioner and training: paid before sampling
    if args.sampler == "nuts":
        run = nmcmc.sample(target, "nuts", chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed,
                           metric=args.metric, progress=False)
    else:
        batch = json.loads(nmcmc._C.default_train_config())["train"]["batch"]
        model = nmcmc.train(target, progress=False, steps=args.steps, dtype=args.dtype)
        tr = model.training
        pre = tr.get("preconditioner") or {}
        row.update({"training_seconds": time.time() - t0, "training_steps": tr["steps"], "stopped": tr.get("stopped"),
                    "preconditioner_grads": pre.get("grads", 0), "preconditioner_seconds": pre.get("seconds", 0.0),
                    "training_grads": tr["grads"] * batch, "training_loop_seconds": tr["seconds"]})
        fixed_grads += pre.get("grads", 0) + tr["grads"] * batch
        fixed_seconds += pre.get("seconds", 0.0) + tr["seconds"]
        run = nmcmc.sample(sampler="learned", model=model, chains=args.chains, warmup=args.warmup,
                           draws=args.draws, seed=args.seed, progress=False)
    s = run.summary
    chains = s["chains"]
    sampling_grads = s["grads_per_step"] * s["draws"] * chains
    fixed_grads += s["grads_warmup_per_chain"] * chains
    fixed_seconds += s["seconds_warmup"]
    ess = s["min_ess_bulk"]
    row.update({"fixed_grads": fixed_grads, "fixed_seconds": fixed_seconds, "sampling_grads": sampling_grads,
                "sampling_seconds": s["seconds_sampling"],
                "ess_bulk_per_second": ess / s["seconds_sampling"],
                "allin_ess_per_grad": ess / (fixed_grads + sampling_grads),
                "allin_ess_per_second": ess / (fixed_seconds + s["seconds_sampling"])})
    for goal in (1000, 10000):  # the cost of `goal` effective draws: the fixed part + goal at the sampling rate
        row[f"grads_for_{goal}"] = fixed_grads + goal * sampling_grads / ess
        row[f"seconds_for_{goal}"] = fixed_seconds + goal * s["seconds_sampling"] / ess
    ok, z, sd, why = moments_check(s, ref)
    row.update({"seconds": time.time() - t0, "max_rhat": s["max_rhat"], "min_ess_bulk": s["min_ess_bulk"],
                "ess_bulk_per_grad": s.get("ess_bulk_per_grad"), "divergences": s["divergences"],
                "density_failures": s.get("density_failures", 0), "worst_mean_mcse": z, "worst_sd_ratio": sd})
    if s["max_rhat"] > 1.01:
        ok, why = False, why + [f"R-hat {s['max_rhat']:.3f}"]
    if s["min_ess_bulk"] < 400:
        ok, why = False, why + [f"ESS too low ({s['min_ess_bulk']:.0f})"]
    print(f"{'ok  ' if ok else 'FAIL'} {p:42s} D={row['dim']:2d} {row['seconds']:7.1f} s  R-hat {s['max_rhat']:.3f}  "
          f"ESS {s['min_ess_bulk']:6.0f}  /grad {row['ess_bulk_per_grad'] or float('nan'):.3g}  "
          f"mean {z:4.1f} MCSE  sd x{sd:.3f}  {'; '.join(why)}", flush=True)
    return ok, why


def table(nuts_json: str, learned_json: str) -> str:
    """The BENCHMARKS table: NUTS against the learned sampler with its defaults, per posterior."""
    nuts = {r["posterior"]: r for r in json.load(open(nuts_json))}
    learned = {r["posterior"]: r for r in json.load(open(learned_json))}
    # every ratio is NUTS's cost over the learned sampler's: above 1 the learned sampler wins
    out = ["| posterior | D | moments NUTS / learned | sampling only: bulk-ESS per grad, learned / NUTS | "
           "all-in, 10k ESS: gradients NUTS / learned | all-in, 10k ESS: seconds NUTS / learned | "
           "learned: warm-up + training s (why it stopped) | break-even (effective draws, gradients) |", "|---" * 8 + "|"]
    for p, n in nuts.items():
        if p not in learned:
            continue
        l = learned[p]
        both = n["passes"] and l["passes"]

        def ratio(a, b):
            return f"{a / b:.3g}x" if both and b else "n/a"
        rn = n["sampling_grads"] / n["min_ess_bulk"]  # gradients per effective draw, sampling
        rl = l["sampling_grads"] / l["min_ess_bulk"]
        be = (l["fixed_grads"] - n["fixed_grads"]) / (rn - rl) if both and rl < rn else None
        out.append(f"| {p} | {n['dim']} | {'pass' if n['passes'] else 'FAIL'} / {'pass' if l['passes'] else 'FAIL'} | "
                   f"{ratio(l['ess_bulk_per_grad'] or 0, n['ess_bulk_per_grad'] or 0)} | "
                   f"{ratio(n['grads_for_10000'], l['grads_for_10000'])} | "
                   f"{ratio(n['seconds_for_10000'], l['seconds_for_10000'])} | "
                   f"{l.get('training_seconds', 0):.0f} ({l.get('stopped')}) | "
                   f"{'never' if both and be is None else ('n/a' if be is None else f'{be:.3g}')} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    e = sub.add_parser("export")
    e.add_argument("directory")
    e.add_argument("only", nargs="*")
    g = sub.add_parser("gradients")
    g.add_argument("only", nargs="*")
    c = sub.add_parser("check")
    c.add_argument("--sampler", choices=["nuts", "learned"], default="nuts")
    c.add_argument("--only", nargs="*")
    c.add_argument("--metric", default="diag", help="nuts: diag (Stan's default) or dense")
    c.add_argument("--chains", type=int, default=4)
    c.add_argument("--warmup", type=int, default=1000)
    c.add_argument("--draws", type=int, default=1000)
    c.add_argument("--steps", type=int, default=None, help="learned: training steps (default: nmcmc train's)")
    c.add_argument("--dtype", default="float64")
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--json")
    t = sub.add_parser("table")
    t.add_argument("nuts_json")
    t.add_argument("learned_json")
    a = ap.parse_args()
    if a.cmd == "list":
        for p, (_d, _b, params, kind) in ports.PORTS.items():
            print(f"{p:45s} D = {len(params):2d}  {kind}")
    elif a.cmd == "export":
        export(a.directory, a.only)
    elif a.cmd == "gradients":
        bad = 0
        for p in a.only or ports.PORTS:
            z = gradient_z(p)
            ok = bool(z.abs().max() < 5)
            bad += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'} {p:45s} max |z| of E[grad U] {z.abs().max().item():.2f}")
        return 1 if bad else 0
    elif a.cmd == "check":
        return check(a)
    elif a.cmd == "table":
        print(table(a.nuts_json, a.learned_json), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
