"""The native engine against LibTorch (Note [Native engine]): one batched call of energy and
gradient on every posteriordb port, in microseconds, both engines in the same process, alternating
(rounds of `--calls` calls each, the median round kept), one thread.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/module_engine.py [--rows 4 64] [--rounds 5] [--only P ...]
Prints a markdown table; `--json FILE` also writes the figures.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import nmcmc  # noqa: E402  (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402
import ports  # noqa: E402
import posteriordb  # noqa: E402


def per_call_us(target, x, calls):
    target.energy_and_grad(x)
    t0 = time.perf_counter()
    for _ in range(calls):
        target.energy_and_grad(x)
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.2, help="seconds per round and engine (sets the calls)")
    ap.add_argument("--only", nargs="+", help="these posteriors only")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = []
    print("| posterior | D | engine (auto) | " + " | ".join(
        f"{r} rows: LibTorch us | {r} rows: native us | {r} rows: LibTorch / native" for r in args.rows) + " |")
    print("|---|---|---|" + "---|---|---|" * len(args.rows))
    for p in ports.PORTS:
        if args.only and p not in args.only:
            continue
        module = posteriordb.scripted(p)
        native = nmcmc.from_module(module, dtype="float64")
        libtorch = nmcmc.from_module(module, dtype="float64", engine="libtorch")
        draws = torch.tensor(ports.reference(p)["draws"], dtype=torch.float64)
        row = {"posterior": p, "dim": native.dim, "engine": native.engine, "note": native.engine_note}
        cells = []
        for r in args.rows:
            x = draws[:r].contiguous()
            calls = max(3, int(args.budget / (per_call_us(libtorch, x, 3) * 1e-6)))
            lt, nt = [], []
            for _ in range(args.rounds):
                lt.append(per_call_us(libtorch, x, calls))
                nt.append(per_call_us(native, x, calls))
            lm, nm = statistics.median(lt), statistics.median(nt)
            row[f"libtorch_us_{r}"], row[f"native_us_{r}"] = lm, nm
            cells.append(f"{lm:.1f} | {nm:.1f} | {lm / nm:.1f}")
        out.append(row)
        print(f"| {p} | {native.dim} | {native.engine} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
