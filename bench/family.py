#!/usr/bin/python3
"""The family benchmark (issue #65): one Stan program, data set after data set, as a user fits it.

    bench/family.py [--family nes|sblr] [--json OUT] [--md OUT] [--seed S]

Along the family in order (posteriordb's nes1972 ... nes2000: one survey regression on eight
election years; sblrc, sblri: one Bayesian linear regression on two data sets), for each data set k:

- learned, cold: `nmcmc.train` with its defaults, then the learned sampler (4 chains x 1,000 draws
  after 100 burn-in steps from its own chains);
- learned, from k-1: `nmcmc.train(from_model=...)` starting from data set k-1's model (the
  previous "from" model; the cold one at k = 2): Note [Training from a previous model];
- NUTS, cold, each of four metrics (diag, dense, fisher-diag, fisher-lowrank): Stan's settings,
  4 chains x 1,000 warm-up + 1,000 draws;
- NUTS, warm-started from k-1's run with the same metric (the warm-started one from k = 3 on; Note
  [Warm starts]): 150 warm-up iterations from where it ended, its step size and metric kept; and, as
  a second variant, the metric estimated again over the short warm-up's windows.

Each run is checked against posteriordb's reference draws (scripts/posteriordb.py's moment checks:
means and sds within 5 standard errors, R-hat <= 1.01, min bulk-ESS >= 400). Its all-in cost to
10,000 effective draws counts every gradient and second before sampling (warm-up, preconditioner,
training, the mixing check, burn-in) plus 10,000 / min bulk-ESS of the sampling's; a run with
R-hat > 1.01 has no ratio. The yardstick for "learned, from k-1" is the best warm-started NUTS that
passes; for "learned, cold" the best cold NUTS that passes.
"""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import nmcmc  # noqa: E402  (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402,F401
from posteriordb import moments_check_named, stan_reference  # noqa: E402

FAMILIES = {
    "nes": [f"nes{y}-nes" for y in range(1972, 2001, 4)],
    "sblr": ["sblrc-blr", "sblri-blr"],
}
METRICS = ["diag", "dense", "fisher-diag", "fisher-lowrank"]
GOAL = 10000
CHAINS, DRAWS, WARMUP, WARM_WARMUP, BURN_IN = 4, 1000, 1000, 150, 100


def cost_row(name, summary, fixed_grads, fixed_seconds, ref, draws, extra=None):
    """A run's figures, its moment checks and its all-in cost to GOAL effective draws."""
    s = summary
    chains = s["chains"]
    fixed_grads += s["grads_warmup_per_chain"] * chains
    fixed_seconds += s["seconds_warmup"]
    sampling_grads = s["grads_per_step"] * s["draws"] * chains
    ess = s["min_ess_bulk"]
    ok, z, sd, why, zs = moments_check_named(s, ref, draws)
    if s["max_rhat"] > 1.01:
        ok, why = False, why + [f"R-hat {s['max_rhat']:.3f}"]
    if ess < 400:
        ok, why = False, why + [f"ESS {ess:.0f} < 400"]
    row = {"method": name, "passes": ok, "why": why, "max_rhat": s["max_rhat"], "min_ess_bulk": ess,
           "fixed_grads": fixed_grads, "fixed_seconds": fixed_seconds, "sampling_grads": sampling_grads,
           "sampling_seconds": s["seconds_sampling"], "worst_mean_z": z, "worst_sd_z": zs,
           "converged": s["max_rhat"] <= 1.01,
           "grads_to_goal": fixed_grads + GOAL * sampling_grads / ess if ess > 0 else math.inf,
           "seconds_to_goal": fixed_seconds + GOAL * s["seconds_sampling"] / ess if ess > 0 else math.inf}
    if extra:
        row.update(extra)
    print(f"  {'ok  ' if ok else 'FAIL'} {name:28s} all-in {row['seconds_to_goal']:7.1f} s "
          f"({row['fixed_seconds']:5.1f} s fixed)  {row['grads_to_goal']:10.3g} grads  R-hat {s['max_rhat']:.3f}  "
          f"ESS {ess:6.0f}  {'; '.join(why)}", flush=True)
    return row


def learned(target, ref, seed, from_model=None):
    t0 = time.time()
    model = nmcmc.train(target, progress=False, dtype="float64", options={"seed": seed}, from_model=from_model)
    wall = time.time() - t0
    tr = model.training
    batch = model.meta["train"]["batch"]
    pre = tr.get("preconditioner") or {}
    check = tr.get("check") or {}
    frm = tr.get("from") or {}
    extra_checks = [frm.get(k) or {} for k in ("first_check", "check_before_training")]  # where not the final one
    fixed_grads = (pre.get("grads", 0) + tr["grads"] * batch + check.get("grads", 0) + sum(c.get("grads", 0) for c in extra_checks)
                   + sum(c.get("grads", 0) for c in tr.get("time_extensions", [])))
    fixed_grads += sum(p.get("grads", 0) for p in tr.get("probes", []))  # Note [Training stops when it no longer pays]
    # (the checks and probes inside training's loop are in tr["seconds"]; the one before it is not)
    fixed_seconds = (pre.get("seconds", 0.0) + tr["seconds"] + check.get("seconds", 0.0)
                     + (frm.get("check_before_training") or {}).get("seconds", 0.0))
    run = nmcmc.sample(sampler="learned", model=model, chains=CHAINS, warmup=BURN_IN, draws=DRAWS, seed=seed,
                       progress=False)
    name = "learned, from k-1" if from_model is not None else "learned, cold"
    row = cost_row(name, run.summary, fixed_grads, fixed_seconds, ref, run.draws,
                   {"training_steps": tr["steps"], "stopped": tr.get("stopped"), "train_wall_seconds": wall,
                    "preconditioner_seconds": pre.get("seconds", 0.0), "preconditioner_warmup": pre.get("warmup"),
                    "fisher_per_dim": pre.get("fisher_per_dim"), "mixing_check": check.get("passes"),
                    "fits": frm.get("fits"), "ess_of_previous": frm.get("ess_of_previous")})
    return row, model


def nuts(target, ref, seed, metric, warm=None, adapt_metric=False):
    kw = {"metric": metric} if (warm is None or adapt_metric) else {}
    run = nmcmc.sample(target, "nuts", chains=CHAINS, warmup=WARMUP if warm is None else WARM_WARMUP, draws=DRAWS,
                       seed=seed, warm_start=warm, progress=False, **kw)
    name = f"nuts {metric}" + ("" if warm is None else ", warm" + (" (metric re-estimated)" if adapt_metric else ""))
    return cost_row(name, run.summary, 0, 0.0, ref, run.draws, {"metric": metric, "warm": warm is not None}), run


def best(rows, pred):
    ok = [r for r in rows if pred(r) and r["passes"]]
    return min(ok, key=lambda r: r["seconds_to_goal"]) if ok else None


def family(name, seed):
    """Along the family: each method carries its own previous state (the learned model it trained
    last, each metric's last NUTS run), as a user refitting each new data set would."""
    results = []
    prev_from = None
    prev_runs = {}
    for k, posterior in enumerate(FAMILIES[name], start=1):
        ref = stan_reference(posterior)
        target = nmcmc.stan_model(ref["program"], ref["data_file"], dtype="float64")
        print(f"{posterior} (k = {k}, D = {target.dim})", flush=True)
        rows, runs = [], {}
        row, cold_model = learned(target, ref, seed)
        rows.append(row)
        from_model = cold_model
        if k > 1:
            row, from_model = learned(target, ref, seed, from_model=prev_from)
            rows.append(row)
        for metric in METRICS:
            row, runs[metric] = nuts(target, ref, seed, metric)
            rows.append(row)
            if k > 1:
                row, warm_run = nuts(target, ref, seed, metric, warm=prev_runs[metric])
                rows.append(row)
                # the same with the metric estimated again over the short warm-up's windows
                rows.append(nuts(target, ref, seed, metric, warm=prev_runs[metric], adapt_metric=True)[0])
                runs[metric] = warm_run  # the next data set starts from this one
        results.append({"posterior": posterior, "k": k, "dim": target.dim, "rows": rows})
        prev_runs, prev_from = runs, from_model
    return results


def ratio(a, b):
    if a is None or b is None or not a["converged"]:
        return None
    return b["seconds_to_goal"] / a["seconds_to_goal"]


def markdown(all_results, meta):
    out = [f"Family benchmark (`bench/family.py`), {meta['date']}, commit {meta['commit']}, {meta['cpu']}; "
           f"all-in seconds (and gradients) to {GOAL:,} effective draws (min bulk-ESS); ratio > 1: the learned "
           "sampler is ahead.", ""]
    out.append("| data set | k | learned from k-1 | best warm NUTS | ratio | learned cold | best cold NUTS | ratio |")
    out.append("|---|---|---|---|---|---|---|---|")
    wins = {}
    for fam, results in all_results.items():
        wins[fam] = [0, 0]
        for r in results:
            rows = r["rows"]
            lf = next((x for x in rows if x["method"] == "learned, from k-1"), None)
            lc = next(x for x in rows if x["method"] == "learned, cold")
            bw = best(rows, lambda x: x["method"].startswith("nuts") and x["warm"])
            bc = best(rows, lambda x: x["method"].startswith("nuts") and not x["warm"])

            def cell(x):
                if x is None:
                    return "-"
                mark = "" if x["passes"] else " **fails**"
                return f"{x['seconds_to_goal']:.1f} s ({x['grads_to_goal']:.3g}){mark} {x['method']}"

            rw, rc = ratio(lf, bw), ratio(lc, bc)
            if lf is not None and bw is not None:
                wins[fam][1] += 1
                if rw is not None and rw > 1 and lf["passes"]:
                    wins[fam][0] += 1
            f = (lambda v: "-" if v is None else f"{v:.2f}x")
            out.append(f"| {r['posterior']} | {r['k']} | {cell(lf)} | {cell(bw)} | {f(rw)} | {cell(lc)} | {cell(bc)} | "
                       f"{f(rc)} |")
    out.append("")
    for fam, (w, n) in wins.items():
        out.append(f"{fam}: learned from k-1 ahead of the best warm-started NUTS on {w} of {n}.")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", nargs="*", choices=sorted(FAMILIES), default=["nes", "sblr"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    commit = (os.environ.get("NMCMC_COMMIT") or  # a copy of the tree outside git says which commit it is
              subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip())
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    meta = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "cpu": cpu, "seed": args.seed}
    results = {}
    for fam in args.family:
        results[fam] = family(fam, args.seed)
        if args.json:  # after each family: an interrupted run keeps what finished
            with open(args.json + ".tmp", "w") as f:
                json.dump({"meta": meta, "results": results}, f, indent=1)
            os.replace(args.json + ".tmp", args.json)
    md = markdown(results, meta)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
