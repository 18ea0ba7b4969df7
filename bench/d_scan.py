#!/usr/bin/python3
"""The learned sampler against the dimension: memory and seconds of warm-up, training and sampling
for D = 10 ... 3,000, `nmcmc train`'s defaults as a user runs them (issue #64).

    bench/d_scan.py OUT [--dims 10 30 100 300 1000 3000] [--target icg] [--draws 1000] [--ess N]

For each D: `nmcmc train --target TARGET --dim D` then `nmcmc sample --sampler learned` (4 chains x
DRAWS), each a process of its own under GNU time, whose maximum resident set size is the peak
memory; the summary's and the checkpoint's records give the phases' seconds, the preconditioner
and width the defaults chose, the training steps and why training stopped, bulk-ESS per gradient
and R-hat. The target is the ill-conditioned diagonal Gaussian (variances 1e-2 to 1e2) by default:
its gradient costs next to nothing, so what grows with D is the sampler's own cost. Writes
OUT/d_scan.json, OUT/d_scan.md (the table) and OUT/d_scan.png (seconds and memory against D).
One process at a time; the machine's CPU is in the table's header.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("NMCMC_CLI", os.path.join(HERE, "..", "build", "nmcmc"))


def timed(cmd, log):
    """Runs cmd under GNU time -v: (seconds, peak RSS in MiB); its output to log."""
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(["/usr/bin/time", "-v"] + cmd, stdout=f, stderr=subprocess.STDOUT)
    text = open(log).read()
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}); see {log}")
    return time.time() - t0, int(peak.group(1)) / 1024 if peak else float("nan")


def one(out, target, dim, draws, seed, ess=None):
    d = os.path.join(out, f"{target}_{dim}")
    os.makedirs(d, exist_ok=True)
    model = os.path.join(d, "model.pt")
    train_s, train_mib = timed([CLI, "train", "--target", target, "--dim", str(dim), "--output", model,
                                "--seed", str(seed), "--quiet"] + ([] if ess is None else ["--ess", str(ess)]),
                               os.path.join(d, "train.log"))
    run = os.path.join(d, "run")
    # --init exact: the chains start in the typical set, as from a posterior's training buffer (a
    # target with an exact sampler trains on exact draws and keeps no buffer: its chains would start
    # in the box U(-2, 2), a transient the learned proposal was not trained for)
    sample_s, sample_mib = timed([CLI, "sample", "--sampler", "learned", "--model", model, "--chains", "4",
                                  "--draws", str(draws), "--seed", str(seed), "--init", "exact", "--output", run, "--quiet"],
                                 os.path.join(d, "sample.log"))
    s = json.load(open(os.path.join(run, "summary.json")))
    sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
    import nmcmc
    meta = nmcmc.Model.load(model).meta  # the checkpoint's record of its training
    pre, check = meta.get("preconditioner") or {}, meta.get("check") or {}
    log = open(os.path.join(d, "train.log")).read()
    stopped = re.search(r"^stopped at step \d+ of \d+: (.*)$", log, re.M)
    why = stopped.group(1) if stopped else "all steps"
    why = ("plateau" if "entropy" in why else "time" if "time budget" in why else "cost" if "pays" in why else why)
    return {"dim": dim, "target": target, "train_process_seconds": train_s, "train_peak_mib": train_mib,
            "sample_process_seconds": sample_s, "sample_peak_mib": sample_mib,
            "preconditioner": pre.get("kind"), "transport": (pre.get("auto") or {}).get("chose"),
            "hidden": meta["model"].get("hidden"), "warmup_seconds": pre.get("seconds"), "warmup_grads": pre.get("grads"),
            "training_steps": meta.get("step"), "training_seconds": meta.get("elapsed"),
            "stopped": why, "check_passed": check.get("passes"),
            "check_rhat": check.get("max_rhat"),
            "sampling_seconds": s["seconds_sampling"], "sampling_warmup_seconds": s["seconds_warmup"],
            "ess_bulk_per_grad": s.get("ess_bulk_per_grad"), "min_ess_bulk": s["min_ess_bulk"],
            "max_rhat": s["max_rhat"], "accept": s.get("accept_rate")}


def table(rows, header):
    lines = [header, "",
             "| D | preconditioner | width | warm-up s | training steps (stop) | training s | train peak MiB | "
             "sampling s (4 x draws) | sample peak MiB | bulk-ESS / grad | max R-hat |",
             "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else "?"
        lines.append(f"| {r['dim']} | {r['preconditioner'] or '?'} | {r['hidden'] or '?'} | {f(r['warmup_seconds'], '.1f')} | "
                     f"{r['training_steps']} ({r['stopped']}) | {f(r['training_seconds'], '.1f')} | {r['train_peak_mib']:.0f} | "
                     f"{r['sampling_seconds']:.1f} | {r['sample_peak_mib']:.0f} | {f(r['ess_bulk_per_grad'], '.3f')} | "
                     f"{r['max_rhat']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = [r["dim"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("warmup_seconds", "warm-up"), ("training_seconds", "training"), ("sampling_seconds", "sampling")):
        a.plot(dims, [r[key] or float("nan") for r in rows], "o-", label=label)
    a.set(xscale="log", yscale="log", xlabel="D", ylabel="seconds", title="seconds against D")
    a.legend()
    b.plot(dims, [r["train_peak_mib"] for r in rows], "o-", label="nmcmc train")
    b.plot(dims, [r["sample_peak_mib"] for r in rows], "o-", label="nmcmc sample")
    b.axhline(4096, color="grey", ls="--", label="4 GiB")
    b.set(xscale="log", yscale="log", xlabel="D", ylabel="peak resident MiB", title="memory against D")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dims", type=int, nargs="+", default=[10, 30, 100, 300, 1000, 3000])
    ap.add_argument("--target", default="icg")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ess", type=float, default=None, help="nmcmc train --ess (default: train's own; 0: off)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    commit = os.environ.get("NMCMC_COMMIT") or subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                                               capture_output=True, text=True).stdout.strip()
    header = (f"{time.strftime('%Y-%m-%d')} commit {commit}, {cpu}, {os.cpu_count()} vCPUs; target {args.target}"
              + ("" if args.ess is None else f"; train --ess {args.ess:g}"))
    rows = []
    for dim in args.dims:
        rows.append(one(args.out, args.target, dim, args.draws, args.seed, args.ess))
        r = rows[-1]
        print(f"D={dim}: train {r['train_process_seconds']:.0f} s ({r['train_peak_mib']:.0f} MiB), sample "
              f"{r['sample_process_seconds']:.0f} s ({r['sample_peak_mib']:.0f} MiB), R-hat {r['max_rhat']:.3f}", flush=True)
        json.dump(rows, open(os.path.join(args.out, "d_scan.json"), "w"), indent=1)
    open(os.path.join(args.out, "d_scan.md"), "w").write(table(rows, header))
    plot(rows, os.path.join(args.out, "d_scan.png"))
    print(table(rows, header))


if __name__ == "__main__":
    main()
