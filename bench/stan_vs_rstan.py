#!/usr/bin/python3
"""The table of bench/stan_vs_rstan.sh: nmcmc's NUTS on a Stan program against rstan's, per model
(medians over seeds). Wall: nmcmc's whole process (from the cache: its compile is not counted) against
rstan's sampling call (its compile apart); warm-up and sampling seconds as each reports them."""
import glob
import json
import os
import statistics
import sys


def main(out: str) -> None:
    first = json.load(open(os.path.join(out, "first_draw.json")))
    print(f"compile + first draw of eight schools: {first['cold_seconds']:.1f} s with an empty cache, "
          f"{first['cached_seconds']:.2f} s from the cache\n")
    print("| model | nmcmc wall s (process) | rstan wall s (sampling call) | ratio | nmcmc warm-up + sampling s | "
          "rstan warm-up + sampling s | ratio | nmcmc min bulk-ESS | rstan min bulk-ESS | nmcmc ESS/s (sampling) | "
          "rstan ESS/s (sampling) | nmcmc max R-hat | rstan max R-hat |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    models = sorted({os.path.basename(p)[len("rstan_"):].rsplit("_s", 1)[0]
                     for p in glob.glob(os.path.join(out, "rstan_*.json"))})
    for m in models:
        n_wall, r_wall, n_run, r_run, n_ess, r_ess, n_rate, r_rate, n_rhat, r_rhat = ([] for _ in range(10))
        for path in sorted(glob.glob(os.path.join(out, f"rstan_{m}_s*.json"))):
            seed = path.rsplit("_s", 1)[1][:-5]
            r = json.load(open(path))
            d = os.path.join(out, f"nmcmc_{m}_s{seed}")
            s = json.load(open(os.path.join(d, "summary.json")))
            n_wall.append(json.load(open(d + ".wall.json"))["wall_seconds"])
            r_wall.append(r["wall_seconds"])
            n_run.append(s["seconds_warmup"] + s["seconds_sampling"])
            r_run.append(r["seconds_warmup"] + r["seconds_sampling"])
            n_ess.append(s["min_ess_bulk"])
            r_ess.append(r["min_ess_bulk"])
            n_rate.append(s["min_ess_bulk"] / s["seconds_sampling"])
            r_rate.append(r["min_ess_bulk"] / r["seconds_sampling"])
            n_rhat.append(s["max_rhat"])
            r_rhat.append(r["max_rhat"])
        med = statistics.median
        print(f"| {m} | {med(n_wall):.2f} | {med(r_wall):.2f} | {med(n_wall) / med(r_wall):.2f} | {med(n_run):.2f} | "
              f"{med(r_run):.2f} | {med(n_run) / med(r_run):.2f} | {med(n_ess):.0f} | "
              f"{med(r_ess):.0f} | {med(n_rate):.0f} | {med(r_rate):.0f} | {max(n_rhat):.3f} | {max(r_rhat):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/stan_vs_rstan")
