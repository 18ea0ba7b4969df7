"""Funnel-3's x1 in its tails: the fraction of draws beyond +-6, +-7.5 and +-9 against the truth
(x1 ~ N(0, 3^2)), per run directory (Stan CSVs). Usage: funnel3_tails.py RUN_DIR..."""
import glob
import math
import os
import sys


def x1_draws(run_dir):
    xs = []
    for f in sorted(glob.glob(os.path.join(run_dir, "chain_*.csv"))):
        rows = [l for l in open(f) if not l.startswith("#")]
        i = rows[0].strip().split(",").index("x.1")
        xs += [float(r.split(",")[i]) for r in rows[1:]]
    return xs


def main(dirs):
    cuts = [-9, -7.5, -6, 6, 7.5, 9]
    phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))
    truth = [phi(c / 3) if c < 0 else 1 - phi(c / 3) for c in cuts]
    print("| run | draws | " + " | ".join(f"x1 {'<' if c < 0 else '>'} {c:+g}" for c in cuts) + " |")
    print("|---|---|" + "---|" * len(cuts))
    print("| truth | | " + " | ".join(f"{t:.4f}" for t in truth) + " |")
    for d in dirs:
        x = x1_draws(d)
        fr = [sum(v < c for v in x) / len(x) if c < 0 else sum(v > c for v in x) / len(x) for c in cuts]
        print(f"| {os.path.basename(d.rstrip('/'))} | {len(x)} | " + " | ".join(f"{f:.4f}" for f in fr) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
