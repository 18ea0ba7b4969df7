#!/usr/bin/python3
"""Vendors what the posteriordb suite needs from a checkout of stan-dev/posteriordb (BSD-3-Clause):
the data of each ported posterior (posteriordb/data/DATA.json) and its reference posterior on the
unconstrained scale (posteriordb/reference/POSTERIOR.json: the mean and sd over all reference
draws, 1,000 of the draws, the reference's bulk ESS, the source commit).

    /usr/bin/python3 scripts/posteriordb_vendor.py /path/to/posteriordb   (a git checkout or mirror)

Run once by a developer; nothing at build or test time downloads anything.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
import ports  # noqa: E402
from posteriordb_stan_vendor import git, git_dir, show, unzip_json  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    repo = git_dir(sys.argv[1])
    commit = git(repo, "rev-parse", "HEAD").decode().strip()
    out = os.path.join(HERE, "..", "posteriordb")
    db = "posterior_database"
    for posterior, (data_name, _builder, params, kind) in ports.PORTS.items():
        data = unzip_json(show(repo, f"{db}/data/data/{data_name}.json.zip"))
        with open(os.path.join(out, "data", data_name + ".json"), "w") as f:
            json.dump(data, f, separators=(",", ":"))
        chains = unzip_json(show(repo, f"{db}/reference_posteriors/draws/draws/{posterior}.json.zip"))
        info = json.loads(show(repo, f"{db}/reference_posteriors/draws/info/{posterior}.info.json"))
        draws = {name: sum((c[name] for c in chains), []) for name in chains[0]}
        x = ports.unconstrain(posterior, draws)  # [n, D], chain-major
        n = x.shape[0]
        thinned = x[:: max(1, n // 1000)][:1000]
        diag = info["diagnostics"]
        names = diag["diagnostic_information"]["names"]
        ess = {nm: e for nm, e in zip(names, diag["effective_sample_size_bulk"])}
        ref = {
            "posterior": posterior,
            "kind": kind,
            "source": f"stan-dev/posteriordb {commit}, reference_posteriors/draws/draws/{posterior}.json.zip",
            "inference": info["inference"],
            "names": ports.names(posterior),
            "mean": [float(v) for v in x.mean(0)],
            "sd": [float(v) for v in x.std(0)],
            "n": n,
            "ess_bulk_constrained": [ess.get(nm) for nm, _ in params],
            "draws": [[float(f"{v:.9g}") for v in row] for row in thinned.tolist()],
        }
        with open(os.path.join(out, "reference", posterior + ".json"), "w") as f:
            json.dump(ref, f, separators=(",", ":"))
        print(f"{posterior}: D = {x.shape[1]}, {n} draws, {len(ref['draws'])} kept")


if __name__ == "__main__":
    main()
