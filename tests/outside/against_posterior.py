#!/usr/bin/python3
"""nmcmc's ESS, R-hat and MCSE against R's posterior package (the reference implementation of
rank-normalised R-hat and bulk/tail ESS, Vehtari et al. 2021; Debian's r-cran-posterior).

    against_posterior.py SOURCE_DIR NMCMC [--broken]

1. Fixed draw sets (well mixed, strongly and negatively autocorrelated, stuck and over-dispersed
   chains, heavy tails, ties, a constant column, an odd number of draws, short and single chains):
   nmcmc.summarise against posterior's summarise_draws, every field of every parameter.
2. A run of `nmcmc sample` written as Stan CSV and NetCDF: posterior's summary of the Stan CSV files
   (read by R) against the run's summary.json, and the NetCDF draws (read by xarray) equal to the
   CSV draws.

The two implementations run the same algorithm in a different order (posterior's FFT
autocovariances against nmcmc's lagged sums), so they agree to rounding: a field passes when it is
within 1e-8 relative (1e-6 for quantities read back from the CSV's 9 significant digits), and
where posterior says NA, nmcmc must say NaN. Deterministic: no false-fail rate. The broken variant
(--broken) summarises each chain without its last draw, an off-by-one that moves every ESS by
about 0.1 %: it must fail (ctest runs it with WILL_FAIL).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

SOURCE, CLI = sys.argv[1], sys.argv[2]
BROKEN = "--broken" in sys.argv[3:]
sys.path.insert(0, os.path.join(os.path.dirname(CLI), "python"))
import nmcmc  # noqa: E402 (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402

R_SCRIPT = os.path.join(SOURCE, "tests", "outside", "posterior_summary.R")
FIELDS = ("mean", "sd", "mcse_mean", "mcse_sd", "q05", "q50", "q95", "ess_bulk", "ess_tail", "rhat")


def ar1(g, s, c, rho):
    """[S, C] AR(1) chains with unit stationary variance, started at stationarity."""
    e = torch.randn(s, c, generator=g, dtype=torch.float64) * math.sqrt(1 - rho * rho)
    x = torch.empty(s, c, dtype=torch.float64)
    x[0] = torch.randn(c, generator=g, dtype=torch.float64)
    for t in range(1, s):
        x[t] = rho * x[t - 1] + e[t]
    return x


def draw_sets():
    g = torch.Generator().manual_seed(20261128)
    n = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    sets = {}
    sets["well_mixed"] = torch.stack([n(1000, 4), ar1(g, 1000, 4, 0.9), ar1(g, 1000, 4, -0.3)], -1)
    stuck = n(500, 4, 2)
    stuck[:, 3, 0] += 3.0                                   # one chain elsewhere
    stuck[:, 0, 1] *= 3.0                                   # one chain over-dispersed
    sets["stuck_chains"] = stuck
    cauchy = n(1000, 4) / n(1000, 4)
    t3 = n(1000, 4) / torch.sqrt((n(1000, 4, 3) ** 2).sum(-1) / 3)
    sets["heavy_tails"] = torch.stack([cauchy, t3], -1)
    ties = torch.round(n(800, 4) * 2) / 2                   # many ties in the ranks
    binary = (n(800, 4) > 0.5).to(torch.float64)
    const = torch.full((800, 4), 2.5, dtype=torch.float64)
    sets["ties_and_constant"] = torch.stack([ties, binary, const], -1)
    sets["odd_draws"] = torch.stack([ar1(g, 251, 3, 0.5), n(251, 3) ** 2], -1)
    sets["short"] = n(12, 2, 2)
    sets["shortest"] = n(9, 3, 2)                          # 4 draws per split chain: no pair of lags
    sets["one_chain"] = torch.stack([ar1(g, 400, 1, 0.7)], -1)
    return sets


def close(a, b, rel):
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or math.isnan(b)
    if b is None or math.isnan(b):
        return False
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def rscript(sets_json: dict, tmp: str) -> dict:
    src, dst = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
    with open(src, "w") as f:
        json.dump(sets_json, f)
    try:
        r = subprocess.run(["Rscript", R_SCRIPT, src, dst], capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        sys.exit("Rscript not found: this check needs R's posterior package (apt-get install r-cran-posterior; "
                 "`make test` installs it)")
    if r.returncode != 0:
        sys.exit(f"Rscript failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
    with open(dst) as f:
        return json.load(f)


WORST = [0.0]


def compare(label, ours: dict, theirs: list, rel: float) -> int:
    bad = 0
    for k, ref in enumerate(theirs):
        for f in FIELDS:
            a = float(ours[f][k])
            if ref[f] is not None and math.isfinite(a) and ref[f] != 0:
                WORST[0] = max(WORST[0], abs(a - ref[f]) / abs(ref[f]))
            if not close(ref[f], a, rel):
                bad += 1
                print(f"FAIL {label} {ref['name']} {f}: nmcmc {a!r}, posterior {ref[f]!r}")
    return bad


def fixed_sets(tmp: str) -> int:
    sets = draw_sets()
    ref = rscript({"sets": {k: {"draws": v.tolist(), "names": [f"{k}[{j}]" for j in range(v.shape[2])]}
                            for k, v in sets.items()}}, tmp)
    print(f"R's posterior {ref['posterior_version']}")
    bad = 0
    for k, v in sets.items():
        ours = nmcmc.summarise(v[:-1] if BROKEN else v)
        b = compare(k, ours, ref["sets"][k], 1e-8)
        print(f"{'ok  ' if b == 0 else 'FAIL'} {k:18s} {v.shape[0]} draws x {v.shape[1]} chains x {v.shape[2]}: "
              f"{len(FIELDS) * v.shape[2] - b} of {len(FIELDS) * v.shape[2]} fields agree")
        bad += b
    return bad


def read_stan_csv(path):
    """[S, K] draws and the column names of one Stan CSV file (comment lines skipped)."""
    rows, header = [], None
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            if header is None:
                header = line.strip().split(",")
            else:
                rows.append([float(v) for v in line.strip().split(",")])
    return header, torch.tensor(rows, dtype=torch.float64)


def written_outputs(tmp: str) -> int:
    out = os.path.join(tmp, "run")
    cmd = [CLI, "sample", "--target", "funnel", "--dim", "3", "--sampler", "nuts", "--chains", "4", "--warmup", "300",
           "--draws", "500", "--seed", "3", "--format", "csv,netcdf", "-q", "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"nmcmc sample failed: {r.stderr.strip()[-2000:]}")
    csvs = sorted(f for f in os.listdir(out) if f.endswith(".csv"))
    chains = [read_stan_csv(os.path.join(out, f)) for f in csvs]
    header = chains[0][0]
    params = [k for k, h in enumerate(header) if not h.endswith("__")]
    draws = torch.stack([c[1][:, params] for c in chains], 1)   # [S, C, D]
    names = [header[k] for k in params]
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    ref = rscript({"sets": {"csv": {"draws": draws.tolist(), "names": names}}}, tmp)["sets"]["csv"]
    ours = {f: [p.get(f, float("nan")) for p in summary["parameters"]] for f in FIELDS}
    if BROKEN:
        ours = nmcmc.summarise(draws[:-1])
    bad = compare("summary.json vs posterior on the CSV", ours, ref, 1e-6)
    print(f"{'ok  ' if bad == 0 else 'FAIL'} summary.json against posterior's summary of the {len(csvs)} Stan CSV files "
          f"({draws.shape[0]} draws x {draws.shape[1]} chains x {draws.shape[2]})")
    import xarray
    nc = xarray.open_dataset(os.path.join(out, "inference_data.nc"), group="posterior")
    nc_draws = torch.stack([torch.as_tensor(nc[v].values, dtype=torch.float64).reshape(len(nc.chain), len(nc.draw), -1)
                            for v in nc.data_vars], -1).reshape(len(nc.chain), len(nc.draw), -1).permute(1, 0, 2)
    diff = float((nc_draws - draws).abs().max()) if nc_draws.shape == draws.shape else float("inf")
    rel = diff / float(draws.abs().max())
    ok = rel < 1e-8
    print(f"{'ok  ' if ok else 'FAIL'} the NetCDF draws (xarray) equal the CSV draws: shape {tuple(nc_draws.shape)}, "
          f"largest difference {rel:.1e} relative")
    return bad + (0 if ok else 1)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        bad = fixed_sets(tmp) + written_outputs(tmp)
    print(("all agree" if bad == 0 else f"{bad} disagreements") + f"; largest relative difference {WORST[0]:.1e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
