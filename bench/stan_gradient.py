#!/usr/bin/python3
"""A Stan program's energy and gradient under different build flags (Note [Stan's build flags]):
microseconds per row of one batched call, every flag set's library in the same process, the flag
sets alternating round by round (the median round kept).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/stan_gradient.py
           [--flags "-O2" "-O3 -mtls-dialect=gnu2" ...] [--rows 1 64] [--rounds 5] [--only nes ...]
           [--json FILE]

Each flag set builds every program once (NMCMC_STAN_CXXFLAGS in a child process, into the usual
cache); rows of 1 are what NUTS asks for (one chain's point), rows of 64 what the learned sampler
asks for (split over the cores: Note [Stan rows in threads]). Prints a markdown table, and checks
that every flag set gives the same energies and gradients bit for bit at 64 points.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
import nmcmc  # noqa: E402  (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402

PROGRAMS = {  # name: (program, data), posteriordb's
    "nes": ("nes", "nes1976"),
    "diamonds": ("diamonds", "diamonds"),
    "arK": ("arK", "arK"),
    "eight_schools_noncentered": ("eight_schools_noncentered", "eight_schools"),
    "hmm_example": ("hmm_example", "hmm_example"),
    "gp_pois_regr": ("gp_pois_regr", "gp_pois_regr"),
    "blr": ("blr", "sblrc"),
}
DEFAULT_FLAGS = ["-O2", "-O3", "-O3 -mtls-dialect=gnu2"]


def library(program, data, flags):
    """The built library's path for these flags (built in a child process that reads them)."""
    code = ("import sys, json; sys.path.insert(0, %r); import nmcmc; "
            "t = nmcmc.stan_model(%r, %r); print(json.dumps(t.spec['library']))"
            % (os.path.join(ROOT, "build", "python"), program, data))
    env = dict(os.environ, NMCMC_STAN_CXXFLAGS=flags)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_row_us(target, x, budget):
    target.energy_and_grad(x)
    calls, t0 = 0, time.perf_counter()
    while True:
        target.energy_and_grad(x)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            return elapsed / calls / x.shape[0] * 1e6


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name"))
        family = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("cpu family"))
        number = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model\t"))
        flags = next(l for l in info.splitlines() if l.startswith("flags"))
        extras = [f for f in ("avx2", "avx512f", "amx_tile") if f" {f}" in flags]
        return f"{model} family {family} model {number} ({', '.join(extras)}), {os.cpu_count()} vCPUs"
    except (OSError, StopIteration):
        return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", nargs="+", default=DEFAULT_FLAGS)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per round, flag set and rows")
    ap.add_argument("--only", nargs="+", choices=sorted(PROGRAMS))
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.only or list(PROGRAMS)
    pdb = os.path.join(ROOT, "posteriordb")
    results = {}
    for name in names:
        prog, data = PROGRAMS[name]
        program, data_file = os.path.join(pdb, "stan", prog + ".stan"), os.path.join(pdb, "data", data + ".json")
        print(f"{name}: building for {len(args.flags)} flag sets", file=sys.stderr, flush=True)
        targets = []
        for flags in args.flags:
            # the library alone: with a "program" the process's own builder (its flags) would choose
            spec = {"name": "stan", "data": data_file, "library": library(program, data_file, flags)}
            targets.append(nmcmc.Target(spec, dtype="float64"))
        gen = torch.Generator().manual_seed(1)
        points = 0.5 * torch.randn(64, targets[0].dim, dtype=torch.float64, generator=gen)
        first = targets[0].energy_and_grad(points)
        same = all(bool((a == b).all()) for t in targets[1:] for a, b in zip(first, t.energy_and_grad(points)))
        times = {(f, r): [] for f in args.flags for r in args.rows}
        for _ in range(args.rounds):
            for flags, t in zip(args.flags, targets):
                for rows in args.rows:
                    times[(flags, rows)].append(per_row_us(t, points[:rows].contiguous(), args.budget))
        results[name] = {"dim": targets[0].dim, "same_bits": same,
                         "us_per_row": {f: {str(r): statistics.median(times[(f, r)]) for r in args.rows}
                                        for f in args.flags}}
        print(f"{name}: " + "; ".join(f"{f}: " + ", ".join(f"{r} rows {statistics.median(times[(f, r)]):.1f} us"
                                                          for r in args.rows) for f in args.flags)
              + f"; same bits: {same}", file=sys.stderr, flush=True)
    base = args.flags[0]
    head = "| program | D | " + " | ".join(f"`{f}` us/row at {r}" for f in args.flags for r in args.rows)
    head += " | " + " | ".join(f"`{f}` / `{base}` at {r}" for f in args.flags[1:] for r in args.rows) + " | same bits |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, r in results.items():
        u = r["us_per_row"]
        cells = [f"{u[f][str(n)]:.1f}" for f in args.flags for n in args.rows]
        cells += [f"{u[base][str(n)] / u[f][str(n)]:.2f}x" for f in args.flags[1:] for n in args.rows]
        print(f"| {name} | {r['dim']} | " + " | ".join(cells) + f" | {'yes' if r['same_bits'] else 'NO'} |")
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "rounds": args.rounds, "budget_s": args.budget,
            "torch_threads": torch.get_num_threads()}
    print(f"\n{meta['date']}, {meta['cpu']}; medians of {args.rounds} alternating rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
