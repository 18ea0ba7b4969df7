#!/usr/bin/python3
"""Vendors posteriordb's reference posteriors as Stan programs (stan-dev/posteriordb, BSD-3-Clause)
from a checkout of stan-dev/posteriordb: for every posterior with reference draws, its Stan program
(posteriordb/stan/MODEL.stan, unchanged), its data (posteriordb/data/DATA.json, unchanged) and its
reference on the constrained scale under Stan's output names (posteriordb/stan_reference/POSTERIOR.json:
names as Stan CSV writes them, theta.1; the mean and sd over all reference draws; their bulk ESS;
where they came from).

    /usr/bin/python3 scripts/posteriordb_stan_vendor.py /path/to/posteriordb   (a git checkout or mirror)

Run once by a developer; nothing at build or test time downloads anything.
"""
import io
import json
import math
import os
import re
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "posteriordb")
DB = "posterior_database"


def git_dir(path: str) -> str:
    """The git directory of a checkout, or the path itself (a bare mirror)."""
    return os.path.join(path, ".git") if os.path.isdir(os.path.join(path, ".git")) else path


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True).stdout


def show(repo: str, path: str) -> bytes:
    return git(repo, "show", "HEAD:" + path)


def unzip_json(blob: bytes):
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return json.loads(z.read(z.namelist()[0]))


def stan_name(name: str) -> str:
    """posteriordb's theta[1] or L[1,2] as Stan CSV's theta.1 and L.1.2."""
    m = re.fullmatch(r"([^\[]+)\[([0-9, ]+)\]", name)
    return name if not m else m.group(1) + "." + ".".join(i.strip() for i in m.group(2).split(","))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    repo = git_dir(sys.argv[1])
    commit = git(repo, "rev-parse", "HEAD").decode().strip()
    listing = git(repo, "ls-tree", "--name-only", "HEAD", f"{DB}/reference_posteriors/draws/draws/").decode().split()
    posteriors = sorted(os.path.basename(p)[: -len(".json.zip")] for p in listing if p.endswith(".json.zip"))
    for d in ("stan", "data", "stan_reference"):
        os.makedirs(os.path.join(OUT, d), exist_ok=True)
    for posterior in posteriors:
        meta = json.loads(show(repo, f"{DB}/posteriors/{posterior}.json"))
        model, data_name = meta["model_name"], meta["data_name"]
        with open(os.path.join(OUT, "stan", model + ".stan"), "wb") as f:
            f.write(show(repo, f"{DB}/models/stan/{model}.stan"))
        data = unzip_json(show(repo, f"{DB}/data/data/{data_name}.json.zip"))
        with open(os.path.join(OUT, "data", data_name + ".json"), "w") as f:
            json.dump(data, f, separators=(",", ":"))
        info = json.loads(show(repo, f"{DB}/reference_posteriors/draws/info/{posterior}.info.json"))
        diag = info["diagnostics"]
        ess = dict(zip(diag["diagnostic_information"]["names"], diag["effective_sample_size_bulk"]))
        names, means, sds, esss = [], [], [], []
        source = f"{DB}/reference_posteriors/draws/draws/{posterior}.json.zip"
        try:
            chains = unzip_json(show(repo, source))
        except subprocess.CalledProcessError:  # a draws file too large for the mirror: its summaries
            chains = None
        if chains is not None:
            for name in chains[0]:
                values = [v for c in chains for v in c[name]]
                n = len(values)
                m = sum(values) / n
                s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
                names.append(stan_name(name))
                means.append(m)
                sds.append(s)
                esss.append(ess.get(name))
        else:
            stats = f"{DB}/reference_posteriors/summary_statistics"
            mv = json.loads(show(repo, f"{stats}/mean_value/mean_value/{posterior}.json"))
            msq = json.loads(show(repo, f"{stats}/mean_squared_value/mean_squared_value/{posterior}.json"))
            n = diag["ndraws"]
            source = f"{stats}/mean_value and mean_squared_value/{posterior}.json (the draws file is not in the mirror)"
            for name, m, m2 in zip(mv["names"], mv["mean_value"], msq["mean_squared_value"]):
                names.append(stan_name(name))
                means.append(m)
                sds.append(math.sqrt(max(m2 - m * m, 0.0) * n / (n - 1)))
                esss.append(ess.get(name))
        ref = {
            "posterior": posterior,
            "model": model,
            "data": data_name,
            "source": f"stan-dev/posteriordb {commit}, {source}",
            "inference": info["inference"],
            "names": names,
            "mean": means,
            "sd": sds,
            "n": n,
            "ess_bulk": esss,
        }
        with open(os.path.join(OUT, "stan_reference", posterior + ".json"), "w") as f:
            json.dump(ref, f, indent=None, separators=(",", ":"))
        print(f"{posterior}: {model}.stan, {data_name}.json, {len(names)} reference quantities x {n} draws")


if __name__ == "__main__":
    main()
