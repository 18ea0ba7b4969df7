"""The posteriordb table of bench/transport_auto.sh: NUTS with `--transport auto` against NUTS with
Stan's settings (no transport), the same seed, per posterior.
Usage: [PREFIX=pdb_nuts_fisher-lowrank] /usr/bin/python3 bench/transport_auto.py OUT SEED [SEED ...]
(PREFIX: the files' prefix, pdb_nuts for Stan's diagonal metric; "diag" in the table is then the
run without a transport at that metric)"""
import json
import os
import sys


def rows(path):
    return {r["posterior"]: r for r in json.load(open(path))} if os.path.exists(path) else {}


def ratio(a, b):
    return a / b if a and b else float("nan")


def main(out, seeds):
    print("| posterior | seed | auto measured (Fisher per dim) | ran | passes: diag / auto | bulk-ESS per sampling "
          "gradient: diag / auto | ratio | all-in ESS per gradient: diag / auto | ratio | seconds to 10k ESS: "
          "diag / auto | ratio (diag's / auto's) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {"none": [], "flow": []}
    for seed in seeds:
        prefix = os.environ.get("PREFIX", "pdb_nuts")
        diag = rows(os.path.join(out, f"{prefix}_diag_s{seed}.json"))
        auto = rows(os.path.join(out, f"{prefix}_auto_s{seed}.json"))
        for p in sorted(set(diag) | set(auto)):
            d, a = diag.get(p, {}), auto.get(p, {})
            ran = a.get("transport", "?").replace("auto:", "")
            both = d.get("passes") and a.get("passes")
            ess = ratio(a.get("ess_bulk_per_grad"), d.get("ess_bulk_per_grad")) if both else float("nan")
            allin = ratio(a.get("allin_ess_per_grad"), d.get("allin_ess_per_grad")) if both else float("nan")
            secs = ratio(d.get("seconds_for_10000"), a.get("seconds_for_10000")) if both else float("nan")
            if both and ran in summary:
                summary[ran].append((p, seed, ess, allin, secs))
            f = a.get("fisher_per_dim")
            print(f"| {p} | {seed} | {f if f is None else f'{f:.3f}'} | {ran} | {d.get('passes')} / {a.get('passes')} "
                  f"| {d.get('ess_bulk_per_grad', float('nan')):.3f} / {a.get('ess_bulk_per_grad', float('nan')):.3f} | {ess:.2f} "
                  f"| {d.get('allin_ess_per_grad', float('nan')):.3f} / {a.get('allin_ess_per_grad', float('nan')):.3f} | {allin:.2f} "
                  f"| {d.get('seconds_for_10000', float('nan')):.1f} / {a.get('seconds_for_10000', float('nan')):.1f} | {secs:.2f} |")
    for ran, xs in summary.items():
        if xs:
            print(f"\n{ran}: {len(xs)} runs; sampling ratio {min(x[2] for x in xs):.3f}-{max(x[2] for x in xs):.3f}, "
                  f"all-in {min(x[3] for x in xs):.3f}-{max(x[3] for x in xs):.3f}, "
                  f"seconds {min(x[4] for x in xs):.3f}-{max(x[4] for x in xs):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
