"""The table of bench/transport.sh: sampling-only and all-in efficiency per run (summary.json)."""
import glob
import json
import math
import os
import sys

def x1_sd_mcse(run_dir):
    """x1's sd and its MCSE from the Stan CSVs: batch means (20 per chain) of x1^2, delta method."""
    xs = []
    for f in sorted(glob.glob(os.path.join(run_dir, "chain_*.csv"))):
        rows = [l for l in open(f) if not l.startswith("#")]
        i = rows[0].strip().split(",").index("x.1")
        xs.append([float(r.split(",")[i]) for r in rows[1:]])
    n = min(len(x) for x in xs) // 20 * 20
    sq = [[v * v for v in x[:n]] for x in xs]
    batches = [sum(x[k:k + n // 20]) / (n // 20) for x in sq for k in range(0, n, n // 20)]
    mean_b = sum(batches) / len(batches)
    se = math.sqrt(sum((b - mean_b) ** 2 for b in batches) / (len(batches) - 1) / len(batches))
    flat = [v for x in xs for v in x[:n]]
    mu = sum(flat) / len(flat)
    sd = math.sqrt(sum((v - mu) ** 2 for v in flat) / len(flat))
    return sd, se / (2 * sd)
def sd_cell(run_dir, sigma):
    sd, mcse = x1_sd_mcse(run_dir)
    return f"{sd:.3f} ({sigma:g}; {(sd - sigma) / mcse:+.1f})"


def main(out):
    print("| target | sampler | seed | max R-hat | x1 mean (in MCSE) | x1 sd (true; off by, in MCSE) | min bulk-ESS | x1 bulk-ESS "
          "| sampling: min ESS/grad | all-in: grads | min ESS/grad | x1 ESS/grad | seconds | min ESS/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(out, "*", "summary.json"))):
        j = json.load(open(path))
        name = os.path.basename(os.path.dirname(path))
        target, sampler, seed = name.split("_")[0], "_".join(name.split("_")[1:-1]), name.split("_")[-1][1:]
        sigma = j["target"]["sigma"]
        x1 = j["parameters"][0]
        steps = j["draws"] * j["chains"]
        sampling_grads = j["grads_per_step"] * steps
        total = j["grads_warmup_per_chain"] * j["chains"] + sampling_grads
        seconds = j["seconds_warmup"] + j["seconds_sampling"]
        ok = j["max_rhat"] <= 1.01
        na = "n/a (R-hat)"
        row = [target, sampler, seed, f"{j['max_rhat']:.3f}",
               f"{x1['mean']:+.3f} ({x1['mean'] / x1['mcse_mean']:+.1f})", sd_cell(os.path.dirname(path), sigma),
               f"{j['min_ess_bulk']:.0f}", f"{x1['ess_bulk']:.0f}",
               f"{j['min_ess_bulk'] / sampling_grads:.4g}" if ok else na, f"{total:.3g}",
               f"{j['min_ess_bulk'] / total:.4g}" if ok else na, f"{x1['ess_bulk'] / total:.4g}" if ok else na,
               f"{seconds:.0f}", f"{j['min_ess_bulk'] / seconds:.3g}" if ok else na]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
