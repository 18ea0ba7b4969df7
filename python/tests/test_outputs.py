"""The files `nmcmc sample` writes, read back with the readers users have: xarray over
netCDF4 (what arviz.from_netcdf uses, group by group) and pandas for the Stan CSV.

Run by CTest (python.pytest) with NMCMC_CLI set to the built command-line tool."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr

CLI = os.environ.get("NMCMC_CLI", "build/nmcmc")
SOURCE = os.environ.get("NMCMC_SOURCE_DIR", ".")


def run(*args, check=True):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def groups(path):
    return {g: xr.open_dataset(path, group=g) for g in ("posterior", "sample_stats")}


def csv_chains(directory, chains):
    return [pd.read_csv(directory / f"chain_{k + 1}.csv", comment="#") for k in range(chains)]


def test_nuts_run_netcdf_matches_the_stan_csv(tmp_path):
    out = tmp_path / "nuts"
    run("sample", "--target", "funnel", "--dim", 4, "--sampler", "nuts", "--chains", 3, "--warmup", 150,
        "--draws", 201, "--seed", 3, "-q", "--output", out)
    ds = groups(out / "inference_data.nc")
    post, stats = ds["posterior"], ds["sample_stats"]
    assert post["x"].dims == ("chain", "draw", "x_dim_0")
    assert post["x"].shape == (3, 201, 4)
    assert list(post["draw"].values) == list(range(201)) and list(post["chain"].values) == [0, 1, 2]
    for g in (post, stats):
        assert g.attrs["inference_library"] == "nmcmc"
        assert g.attrs["inference_library_version"]
        assert g.attrs["created_at"].startswith("20")
        assert g.attrs["nmcmc_complete"] == 1 and g.attrs["nmcmc_draws_written"] == 201
        assert g.attrs["nmcmc_sampler"] == "nuts"
    assert set(stats.data_vars) == {"lp", "acceptance_rate", "step_size", "diverging", "n_steps", "tree_depth",
                                    "energy"}
    assert stats["diverging"].dtype == bool
    chains = csv_chains(out, 3)
    for k, c in enumerate(chains):
        assert len(c) == 201
        # The Stan CSV holds 6 significant digits (as CmdStan); the NetCDF the full values.
        np.testing.assert_allclose(c[["x.1", "x.2", "x.3", "x.4"]].values, post["x"].sel(chain=k).values,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c["lp__"].values, stats["lp"].sel(chain=k).values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c["energy__"].values, stats["energy"].sel(chain=k).values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c["accept_stat__"].values, stats["acceptance_rate"].sel(chain=k).values,
                                   rtol=1e-5, atol=1e-6)
        assert (c["treedepth__"].values == stats["tree_depth"].sel(chain=k).values).all()
        assert (c["n_leapfrog__"].values == stats["n_steps"].sel(chain=k).values).all()
        assert (c["divergent__"].values.astype(bool) == stats["diverging"].sel(chain=k).values).all()
    # The summary was computed from the same draws.
    summary = json.load(open(out / "summary.json"))
    means = post["x"].values.reshape(-1, 4).mean(0)
    np.testing.assert_allclose([p["mean"] for p in summary["parameters"]], means, rtol=1e-9, atol=1e-12)


def test_named_parameters_become_variables(tmp_path):
    out = tmp_path / "schools"
    module = tmp_path / "eight_schools.pt"  # built here: a fresh checkout has no .pt (it is not tracked)
    subprocess.run(["/usr/bin/python3", os.path.join(SOURCE, "examples", "torchscript", "eight_schools.py"), str(module)],
                   check=True, capture_output=True, timeout=300)
    run("sample", "--module", module, "--sampler", "hmc", "--chains", 2, "--warmup", 100, "--draws", 50, "-q",
        "--output", out)
    post = xr.open_dataset(out / "inference_data.nc", group="posterior")
    assert set(post.data_vars) == {"mu", "log_tau", "eta"}
    assert post["mu"].dims == ("chain", "draw")
    assert post["eta"].dims == ("chain", "draw", "eta_dim_0") and post["eta"].shape == (2, 50, 8)
    c = pd.read_csv(out / "chain_2.csv", comment="#")
    np.testing.assert_allclose(c["eta.8"].values, post["eta"].sel(chain=1, eta_dim_0=7).values, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(c["mu"].values, post["mu"].sel(chain=1).values, rtol=1e-5, atol=1e-6)
    stats = xr.open_dataset(out / "inference_data.nc", group="sample_stats")
    assert "tree_depth" not in stats and (stats["n_steps"].values == 10).all()  # HMC: 10 leapfrog steps


def test_learned_run_carries_its_training_log(tmp_path):
    model = tmp_path / "m.pt"
    run("train", "--target", "gaussian", "--dim", 2, "--steps", 12, "--batch", 32, "--set", "model.hidden=8",
        "--set", "train.log_every=3",
        "-q", "--output", model)
    out = tmp_path / "learned"
    run("sample", "--sampler", "learned", "--model", model, "--chains", 2, "--warmup", 10, "--draws", 30, "-q",
        "--output", out)
    log = xr.open_dataset(out / "inference_data.nc", group="nmcmc_training")
    assert {"accept", "beta", "entropy", "eps", "loss", "grads"} <= set(log.data_vars)
    assert list(log["step"].values) == [1, 3, 6, 9, 12]  # the coordinate
    csv = pd.read_csv(tmp_path / "m.log.csv")
    np.testing.assert_allclose(log["accept"].values, csv["accept"].values, rtol=1e-5)
    post = xr.open_dataset(out / "inference_data.nc", group="posterior")
    assert post.attrs["nmcmc_sampler"] == "learned"


def test_formats_one_at_a_time_and_a_wrong_one(tmp_path):
    run("sample", "--target", "gaussian", "--dim", 2, "--draws", 20, "--warmup", 20, "-q", "--format", "csv",
        "--output", tmp_path / "csv")
    assert (tmp_path / "csv" / "chain_1.csv").exists() and not (tmp_path / "csv" / "inference_data.nc").exists()
    run("sample", "--target", "gaussian", "--dim", 2, "--draws", 20, "--warmup", 20, "-q", "--format", "netcdf",
        "--output", tmp_path / "nc")
    assert (tmp_path / "nc" / "inference_data.nc").exists() and not (tmp_path / "nc" / "chain_1.csv").exists()
    p = run("sample", "--target", "gaussian", "--dim", 2, "-q", "--format", "csv,hdf5", "--output", tmp_path / "x",
            check=False)
    assert p.returncode == 64 and "'hdf5' is not a format" in p.stderr


def test_interrupted_run_netcdf_is_readable_and_says_so(tmp_path):
    out = tmp_path / "stopped"
    p = subprocess.Popen([CLI, "sample", "--target", "funnel", "--dim", "20", "--sampler", "hmc", "--chains", "8",
                          "--warmup", "50", "--draws", "10000000", "-q", "--output", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the 10M-draw child never outlives the test, whatever fails here
        deadline = time.time() + 120
        part = out / "inference_data.nc.part"
        while time.time() < deadline and not part.exists():
            time.sleep(0.2)
        time.sleep(3)  # past the first flush of rows
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    assert p.returncode == 130, err
    assert not part.exists()
    ds = groups(out / "inference_data.nc")
    written = ds["posterior"].attrs["nmcmc_draws_written"]
    assert ds["posterior"].attrs["nmcmc_complete"] == 0 and 0 < written < 10000000
    assert ds["posterior"]["x"].shape == (8, written, 20) and ds["sample_stats"]["lp"].shape == (8, written)
    c = pd.read_csv(out / "chain_8.csv", comment="#")
    assert len(c) == written
    np.testing.assert_allclose(c["x.20"].values, ds["posterior"]["x"].sel(chain=7).values[:, 19], rtol=1e-5,
                               atol=1e-6)
    assert json.load(open(out / "summary.json"))["complete"] is False


def test_python_sample_writes_netcdf_and_unmatched_names_fall_back_to_one_labelled_variable(tmp_path):
    import torch
    import nmcmc

    def energy(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x * x).sum(-1)

    # "chain" would clash with the dimension: all parameters go into `x` with a string coordinate.
    t = nmcmc.from_function(energy, dim=3, names=["chain", "b.2", "c/d"])
    r = nmcmc.sample(t, "hmc", chains=2, warmup=50, draws=40, output=str(tmp_path / "o"), formats="netcdf",
                     progress=False)
    post = xr.open_dataset(tmp_path / "o" / "inference_data.nc", group="posterior")
    assert post["x"].dims == ("chain", "draw", "parameter")
    assert list(post["parameter"].values) == ["chain", "b.2", "c/d"]
    np.testing.assert_allclose(post["x"].values, r.draws.permute(1, 0, 2).double().numpy(), rtol=1e-12)
    assert not (tmp_path / "o" / "chain_1.csv").exists()
    with pytest.raises(ValueError, match="not a format"):
        nmcmc.sample(t, "hmc", draws=10, warmup=10, output=str(tmp_path / "p"), formats="parquet", progress=False)
    # Names that do map: "b.1", "b.2" -> b[2], "c/d" -> c_d.
    t2 = nmcmc.from_function(energy, dim=3, names=["b.1", "b.2", "c/d"])
    nmcmc.sample(t2, "hmc", chains=1, warmup=20, draws=10, output=str(tmp_path / "q"), progress=False)
    post2 = xr.open_dataset(tmp_path / "q" / "inference_data.nc", group="posterior")
    assert set(post2.data_vars) == {"b", "c_d"} and post2["b"].shape == (1, 10, 2)


def test_python_report_of_a_python_run(tmp_path):
    import nmcmc
    nmcmc.sample(nmcmc.target("icg", dim=3), "nuts", chains=2, warmup=50, draws=60, output=str(tmp_path / "r"),
                 progress=False)
    page = nmcmc.report(tmp_path / "r")
    assert page.endswith("report.html") and "Traces and rank plots" in open(page).read()
    with pytest.raises(ValueError, match="no summary.json"):
        nmcmc.report(tmp_path)


def test_sharded_run_netcdf_holds_every_chain_with_its_own_adaptation(tmp_path):
    # 5 NUTS chains over 2 processes (nmcmc launch): each rank streams its chains' CSV files, rank 0
    # writes one InferenceData file over all 5, each chain with its rank's step size and metric.
    out = tmp_path / "sharded"
    run("launch", "--nproc", 2, "--", "sample", "--target", "funnel", "--dim", 3, "--sampler", "nuts", "--chains", 5,
        "--warmup", 80, "--draws", 30, "--seed", 4, "-q", "--output", out)
    ds = groups(out / "inference_data.nc")
    post, stats = ds["posterior"], ds["sample_stats"]
    assert post["x"].shape == (5, 30, 3)
    for k, c in enumerate(csv_chains(out, 5)):
        np.testing.assert_allclose(c[["x.1", "x.2", "x.3"]].values, post["x"].sel(chain=k).values, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(c["stepsize__"].values, stats["step_size"].sel(chain=k).values, rtol=1e-6)
        np.testing.assert_allclose(c["treedepth__"].values, stats["tree_depth"].sel(chain=k).values)
    eps = stats["step_size"].values[:, 0]
    assert eps[0] == eps[1] == eps[2] and eps[3] == eps[4] and eps[0] != eps[3]  # ranks 0 (3 chains) and 1 (2)
    summary = json.load(open(out / "summary.json"))
    assert summary["config"]["world_size"] == 2 and summary["config"]["chains"] == 5


def test_ctrl_c_in_python_raises_keyboard_interrupt(tmp_path):
    """Ctrl-C during nmcmc.sample reaches Python as KeyboardInterrupt (the C++ run polls for it),
    within a bounded time; the child never outlives the test."""
    import sys
    script = ("import sys, nmcmc\n"
              "t = nmcmc.target('icg', dim=4)\n"
              "print('started', flush=True)\n"
              "try:\n"
              "    nmcmc.sample(t, 'nuts', chains=2, warmup=10, draws=10_000_000, progress=False)\n"
              "except KeyboardInterrupt:\n"
              "    print('KeyboardInterrupt', flush=True)\n"
              "    sys.exit(3)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    try:
        assert p.stdout.readline().strip() == "started"
        time.sleep(2)  # inside the run
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    assert p.returncode == 3, err
    assert "KeyboardInterrupt" in out
