"""The Python package as a user meets it: targets from names, modules and functions; every sampler;
training, saving and loading a model; compare; one clear ValueError for each bad input.
Run by CTest (label python) with PYTHONPATH=build/python; fixed seeds throughout."""
import json
import math
import os
import subprocess
import warnings
from typing import List

import pytest

import nmcmc  # before torch: Note [OpenBLAS's kernels]
import torch

CLI = os.environ.get("NMCMC_CLI", "build/nmcmc")


def gaussian_energy(x: torch.Tensor) -> torch.Tensor:
    scale = torch.tensor([1.0, 2.0, 0.5], dtype=x.dtype)
    return 0.5 * ((x / scale) ** 2).sum(-1)


def half_lognormal(x: torch.Tensor) -> torch.Tensor:
    # NaN for x0 <= 0: a density with a support boundary.
    l = torch.log(x[:, 0])
    return l + 0.5 * l * l + 0.5 * (x[:, 1:] ** 2).sum(-1)


def sums_everything(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum()


class Banana(torch.nn.Module):
    dim: int
    names: List[str]

    def __init__(self):
        super().__init__()
        self.dim = 2
        self.names = ["a", "b"]
        self.ref_mean = torch.tensor([0.0, -3.0])
        self.ref_sd = torch.tensor([1.0, math.sqrt(3.0)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x[:, 0] ** 2 + 0.5 * (x[:, 1] - x[:, 0] ** 2 + 4.0) ** 2


def test_version_and_catalogue():
    assert nmcmc.__version__
    names = [t["name"] for t in nmcmc.targets()]
    for n in ("icg", "funnel", "logistic", "torchscript"):
        assert n in names


def test_builtin_target_every_baseline_sampler_returns_tensors():
    t = nmcmc.target("icg", dim=5)
    assert t.dim == 5 and t.names[0] == "x.1" and t.reference_moments is not None
    for sampler in ("rwm", "mala", "hmc", "nuts"):
        run = nmcmc.sample(t, sampler, chains=3, warmup=100, draws=50, seed=4, progress=False)
        assert isinstance(run.draws, torch.Tensor)
        assert run.draws.shape == (50, 3, 5) and run.draws.dtype == torch.float64
        assert run.lp.shape == (50, 3) and run.divergent.dtype == torch.bool
        assert run.n_grad.shape == (50, 3)
        assert run.summary["chains"] == 3 and len(run.summary["parameters"]) == 5
        assert run.config["sampler"] == sampler
    assert run.tree_depth is not None and run.energy is not None  # NUTS's statistics


def test_same_seed_same_draws_and_init_x_is_used():
    t = nmcmc.target("gaussian", dim=2)
    a = nmcmc.sample(t, "mala", chains=2, warmup=20, draws=20, seed=9, progress=False)
    b = nmcmc.sample(t, "mala", chains=2, warmup=20, draws=20, seed=9, progress=False)
    assert torch.equal(a.draws, b.draws)
    x0 = torch.full((2, 2), 7.0)
    c = nmcmc.sample(t, "rwm", chains=2, warmup=0, draws=1, seed=1, init_x=x0, step_size=1e-6, adapt_step=False,
                     progress=False)
    assert torch.allclose(c.draws[0], x0.double(), atol=1e-4)


def moments_within(summary: dict, mean, sd, z: float = 5.0) -> list:
    """Each parameter's mean and sd against the true ones, each within z of its own MCSE (the
    summary's mcse_mean and mcse_sd, as R's posterior package computes them): about 6e-7 false
    fails per check at z = 5. Returns what failed."""
    why = []
    for p, m, s in zip(summary["parameters"], mean, sd):
        if not abs(p["mean"] - m) <= z * p["mcse_mean"]:
            why.append(f"{p['name']} mean {p['mean']:.4g} vs {m} (MCSE {p['mcse_mean']:.3g})")
        if not abs(p["sd"] - s) <= z * p["mcse_sd"]:
            why.append(f"{p['name']} sd {p['sd']:.4g} vs {s} (MCSE {p['mcse_sd']:.3g})")
    return why


def test_function_target_with_names_matches_its_moments():
    t = nmcmc.from_function(gaussian_energy, dim=3, names=["mu", "log_tau", "theta"], dtype="float64")
    assert t.names == ["mu", "log_tau", "theta"] and t.dtype == torch.float64
    e, g = t.energy_and_grad(torch.ones(2, 3, dtype=torch.float64))
    assert torch.allclose(g[0], torch.tensor([1.0, 0.25, 4.0], dtype=torch.float64))
    run = nmcmc.sample(t, "nuts", chains=4, warmup=500, draws=1000, seed=2, progress=False)
    assert [p["name"] for p in run.summary["parameters"]] == ["mu", "log_tau", "theta"]
    assert moments_within(run.summary, [0.0, 0.0, 0.0], [1.0, 2.0, 0.5]) == []


def test_transport_flow_on_a_python_function_and_its_bad_input():
    # A Python density through the flow transport: the draws come back in x with their names and the
    # target's sds; the summary reports the fits. Bad combinations are one clear ValueError.
    t = nmcmc.from_function(gaussian_energy, dim=3, names=["mu", "log_tau", "theta"], dtype="float64")
    run = nmcmc.sample(t, "nuts", transport="flow", transport_layers=2, transport_rounds=2, chains=4, warmup=200,
                       draws=500, seed=3, progress=False)
    assert [p["name"] for p in run.summary["parameters"]] == ["mu", "log_tau", "theta"]
    assert len(run.summary["transport"]["rounds"]) == 2 and run.summary["max_rhat"] < 1.05
    assert moments_within(run.summary, [0.0, 0.0, 0.0], [1.0, 2.0, 0.5]) == []
    for kwargs, says in [({"global_moves": True}, "go with --transport flow"),
                         ({"transport": "teleport"}, "transport"),
                         ({"transport": "flow", "warmup": 50}, "at least 100")]:
        with pytest.raises(ValueError, match=says):
            nmcmc.sample(t, "nuts", progress=False, **kwargs)


def test_progress_lines_say_what_each_phase_does(capsys, monkeypatch):
    # The progress line of a run through the flow: warm-up and sampling with their accept rate and
    # step size, each fit with its held-out Fisher loss (the binding passes it in place of an
    # accept rate), never "accept 0.000  step 0" for a phase that has neither. Every update is
    # printed here (a log's lines are otherwise 10 s apart).
    monkeypatch.setattr(nmcmc._Progress, "interval_log", 0.0)
    t = nmcmc.from_function(gaussian_energy, dim=3, dtype="float64")
    nmcmc.sample(t, "nuts", chains=2, warmup=200, draws=100, seed=1, transport="flow", transport_layers=2,
                 transport_rounds=2, progress=True)
    lines = capsys.readouterr().err.splitlines()
    fits = [l for l in lines if l.startswith("[fit]")]
    assert fits and all("held-out Fisher loss" in l and "accept" not in l for l in fits), lines
    assert any(l.startswith("[sampling]") and "accept" in l and "step" in l for l in lines), lines
    assert not any("step 0 " in l for l in lines), lines


def test_compare_takes_the_transports_options_as_sample_does(tmp_path):
    # Note [The transport's options]: compare's NUTS through the flow takes layers and rounds too.
    t = nmcmc.from_function(gaussian_energy, dim=3, names=["mu", "log_tau", "theta"], dtype="float64")
    res = nmcmc.compare(t, chains=2, warmup=200, draws=100, nuts_metrics=["diag"], transport="flow",
                        transport_layers=2, transport_rounds=2, output=str(tmp_path), progress=False)
    report = res["samplers"]["nuts_flow"]["transport"]
    assert report["layers"] == 2 and len(report["rounds"]) == 2
    with pytest.raises(ValueError, match="go with --transport flow or auto"):
        nmcmc.compare(t, chains=2, warmup=200, draws=100, transport_rounds=2, output=str(tmp_path), progress=False)


def test_transport_auto_on_a_gaussian_samples_as_without_one():
    # Note [Choosing the transport]: on a Gaussian auto measures a small divergence in the first
    # quarter of the warm-up and goes on as a run without a transport: the same draws.
    t = nmcmc.from_function(gaussian_energy, dim=3, names=["mu", "log_tau", "theta"], dtype="float64")
    plain = nmcmc.sample(t, "nuts", chains=2, warmup=200, draws=100, seed=4, progress=False)
    auto = nmcmc.sample(t, "nuts", transport="auto", chains=2, warmup=200, draws=100, seed=4, progress=False)
    assert torch.equal(plain.draws, auto.draws)
    record = auto.summary["transport"]["auto"]
    assert record["chose"] == "none" and record["fisher_per_dim"] < record["threshold"] == 0.15
    with pytest.raises(ValueError, match="at least 100"):
        nmcmc.sample(t, "nuts", transport="auto", warmup=50, progress=False)


def test_train_with_a_flow_transport_and_sample_in_its_latent_space(tmp_path):
    # Note [Learned proposal in a flow's latent space]: the flow is fitted in the training's
    # warm-up and saved with the model; sampling runs in its latent space and returns x with
    # lp = -U(x). Bad combinations are one clear ValueError.
    t = nmcmc.from_module(Banana())
    m = nmcmc.train(t, transport="flow", transport_layers=2, transport_rounds=2, steps=20, batch=64, dtype="float64",
                    options={"precondition_warmup": 150, "precondition_chains": 4, "seed": 3},
                    output=str(tmp_path / "m.pt"), progress=False)
    assert m.training["preconditioner"]["kind"] == "flow"
    assert len(m.training["preconditioner"]["transport"]["rounds"]) == 2
    run = nmcmc.sample(t, "learned", model=m, chains=2, warmup=10, draws=40, seed=2, progress=False)
    assert run.config["model"]["transport"]["flow"]["layers"] == 2
    x = run.draws.reshape(-1, 2)
    assert torch.allclose(run.lp.reshape(-1), -Banana()(x), atol=1e-8)
    # (the defaults' transport is auto, which takes them; with none they are an error)
    with pytest.raises(ValueError, match="go with --transport flow or auto"):
        nmcmc.train(t, transport="none", transport_layers=2, steps=1, progress=False)
    with pytest.raises(ValueError, match="transport"):
        nmcmc.train(t, transport="spline", steps=1, progress=False)


def test_module_target_attributes_and_paper_ess():
    t = nmcmc.from_module(Banana())
    assert t.dim == 2 and t.names == ["a", "b"]
    run = nmcmc.sample(t, "hmc", chains=4, warmup=200, draws=200, seed=1, progress=False)
    assert "paper_ess" in run.summary  # the module's reference moments


def test_module_file_on_the_command_line(tmp_path):
    path = tmp_path / "banana.pt"
    torch.jit.save(torch.jit.script(Banana()), str(path))
    t = nmcmc.from_module(str(path))
    assert t.spec["module"] == str(path)
    out = tmp_path / "run"
    r = subprocess.run([CLI, "sample", "--module", str(path), "--sampler", "nuts", "--chains", "2", "--warmup", "50",
                        "--draws", "20", "-q", "--output", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    header = [l for l in open(out / "chain_1.csv") if not l.startswith("#")][0].strip().split(",")
    assert header[-2:] == ["a", "b"]


def test_nan_regions_are_rejected_not_sampled():
    t = nmcmc.from_function(half_lognormal, dim=2)
    run = nmcmc.sample(t, "mala", chains=4, warmup=200, draws=500, seed=3, progress=False)
    assert torch.isfinite(run.draws).all() and (run.draws[..., 0] > 0).all()
    assert run.divergent.sum() > 0 and run.summary["divergences"] > 0


def test_bad_input_gets_one_clear_value_error(tmp_path):
    with pytest.raises(ValueError, match="must be at least 2"):
        nmcmc.target("funnel", dim=0)
    with pytest.raises(ValueError, match="finite"):
        nmcmc.target("funnel", sigma=float("nan"))
    with pytest.raises(ValueError, match="unknown target"):
        nmcmc.target("nope")
    with pytest.raises(ValueError, match="TorchScript cannot compile"):
        nmcmc.from_function(lambda x: x.numpy().sum(), dim=2)
    with pytest.raises(ValueError, match=r"shape \[C\]"):
        nmcmc.from_function(sums_everything, dim=2)
    with pytest.raises(ValueError, match="does not exist"):
        nmcmc.from_module(str(tmp_path / "absent.pt"))
    with pytest.raises(ValueError, match="dtype must be"):
        nmcmc.target("icg", dtype="float16")
    t = nmcmc.target("icg", dim=3)
    with pytest.raises(ValueError, match="unknown sampler|sampler"):
        nmcmc.sample(t, "gibbs", progress=False)
    with pytest.raises(ValueError, match="needs model"):
        nmcmc.sample(t, "learned", progress=False)
    with pytest.raises(ValueError, match="chains"):
        nmcmc.sample(t, "mala", chains=0, progress=False)
    with pytest.raises(ValueError, match="not a|cannot|checkpoint"):
        junk = tmp_path / "junk.pt"
        junk.write_text("junk")
        nmcmc.Model.load(str(junk))


def test_train_save_load_sample_and_compare(tmp_path):
    t = nmcmc.from_function(gaussian_energy, dim=3)
    model = nmcmc.train(t, steps=60, batch=64, model={"hidden": 16}, progress=False)
    assert model.steps == 60 and model.training["steps"] == 60 and not model.training["interrupted"]
    # Your own target gets the affine preconditioner by default (dense at D = 3), from a NUTS warm-up.
    assert model.training["preconditioner"]["kind"] == "dense"
    assert model.training["preconditioner"]["grads"] > 0 and model.meta["model"]["precondition"] == "dense"
    assert model.meta["model"]["variant"] == "langevin"
    saved = tmp_path / "model.pt"
    model.save(str(saved))
    again = nmcmc.Model.load(str(saved))
    assert again.target_spec["dim"] == 3
    run = nmcmc.sample(t, "learned", model=again, chains=4, warmup=20, draws=100, seed=5, progress=False)
    assert run.draws.shape == (100, 4, 3)
    assert 0.0 < run.summary["accept_rate"] <= 1.0
    # Note [Persistent noise]: the base draw carried from step to step (0.6 by default), recorded;
    # 0 is the paper's sampler, with other draws
    assert run.config["persistence"] == 0.6
    fresh = nmcmc.sample(t, "learned", model=again, chains=4, warmup=20, draws=100, seed=5, persistence=0,
                         progress=False)
    assert fresh.config["persistence"] == 0.0 and not torch.equal(fresh.draws, run.draws)
    with pytest.raises(ValueError, match=r"--persistence must be in \[0, 1\)"):
        nmcmc.sample(t, "learned", model=again, persistence=1.0, progress=False)
    with pytest.raises(ValueError, match="--persistence goes with --sampler learned"):
        nmcmc.sample(t, "nuts", persistence=0.5, progress=False)
    # Note [The learned sampler's thinning]: one draw kept in about half the steps per effective draw
    # of the training's mixing check (at most 50), unless thin= is given
    check = model.training["check"]
    tau = check["chains"] * check["draws"] / check["min_ess_bulk"]
    assert run.config["thin"] == run.summary["thin"] == min(50, max(1, math.ceil(tau / 2)))
    two = nmcmc.sample(t, "learned", model=again, chains=4, warmup=20, draws=100, seed=5, thin=2, progress=False)
    assert two.draws.shape == (100, 4, 3) and two.summary["thin"] == 2 and two.config["thin"] == 2
    assert nmcmc.sample(t, "mala", chains=2, warmup=20, draws=10, progress=False).summary["thin"] == 1
    with pytest.raises(ValueError, match="--thin must be at least 1"):
        nmcmc.sample(t, "learned", model=again, thin=0, progress=False)
    # A model trained on a function target is not the built-in icg's.
    with pytest.raises(ValueError, match="was trained on"):
        nmcmc.sample(nmcmc.target("icg", dim=3), "learned", model=again, progress=False)
    # Resume continues the same checkpoint.
    more = nmcmc.train(t, steps=80, batch=64, model={"hidden": 16}, output=str(saved), resume=True, progress=False)
    assert more.steps == 80
    result = nmcmc.compare(t, model=more, chains=2, warmup=50, draws=100, output=str(tmp_path / "cmp"),
                           progress=False)
    # NUTS with every metric that applies (the best is the yardstick), HMC, MALA, the learned sampler
    assert set(result["samplers"]) == {"nuts", "nuts_dense", "nuts_fisher_diag", "nuts_fisher_lowrank", "hmc", "mala",
                                       "learned"}
    assert "| learned" in result["table"] and "| nuts fisher-lowrank" in result["table"]
    learned = result["samplers"]["learned"]
    # compare runs it as a user would: from its own chains, never from a box its flow has not seen
    assert learned["start"].startswith("its own chains")
    # all-in: its training and preconditioner are part of its fixed cost
    t = learned["training"]
    assert learned["all_in"]["fixed_grads"] >= t["grads_total"] + t["preconditioner_grads"] > 0
    assert learned["all_in"]["fixed_seconds"] >= t["seconds"] + t["preconditioner_seconds"]
    assert result["samplers"]["nuts"]["all_in"]["fixed_grads"] > 0
    # a run that has not converged gets no ESS ratio and no break-even
    assert isinstance(learned["converged"], bool)
    vs = learned["vs_best_nuts"]
    if not learned["converged"] or not vs["nuts_runs"]:
        assert "Not converged" in result["table"] and "Against the best NUTS" not in result["table"]
        assert "break_even_grads" not in vs
    else:
        assert "Against the best NUTS" in result["table"]
        assert vs["break_even_grads"]["kind"] in ("always", "from", "never", "until")
        assert vs["grads_for_10000"]["nuts"] in vs["nuts_runs"]
    assert json.load(open(tmp_path / "cmp" / "compare.json"))["samplers"]["nuts"]["grads_per_draw"] > 0


def test_training_config_file_with_a_module(tmp_path):
    torch.jit.save(torch.jit.script(Banana()), str(tmp_path / "banana.pt"))
    cfg = {"name": "banana", "target": {"name": "torchscript", "module": "banana.pt"},
           "model": {"hidden": 16}, "train": {"batch": 32, "steps": 20}}
    (tmp_path / "banana.json").write_text(json.dumps(cfg))
    # The module path is relative to the config file, wherever the command runs.
    r = subprocess.run([CLI, "train", "--config", str(tmp_path / "banana.json"), "-q", "--output",
                        str(tmp_path / "m.pt")], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    m = nmcmc.Model.load(str(tmp_path / "m.pt"))
    assert m.target_spec["module"] == str(tmp_path / "banana.pt")


def test_tune_allocator_is_opt_in_and_honours_nmcmc_malloc():
    """nmcmc.tune_allocator() applies the program's malloc policy on request and says what it did;
    NMCMC_MALLOC=default makes it leave glibc's (in child processes: the policy is process-wide)."""
    import subprocess, sys
    code = "import nmcmc\nprint(nmcmc.tune_allocator())\nprint(nmcmc.tune_allocator())\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.strip().splitlines()
    assert first == second  # applied once; later calls report the first outcome
    assert "heap reuse" in first or "not glibc" in first or "refused" in first
    env = dict(os.environ, NMCMC_MALLOC="default")
    q = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert q.returncode == 0, q.stderr
    assert "NMCMC_MALLOC=default" in q.stdout


def test_train_checks_that_its_sampler_mixes(tmp_path):
    # Note [The mixing check]: the record of the short run after training, and a RuntimeWarning
    # where the sampler does not mix (icg, 2 steps, no preconditioner: R-hat about 18).
    t = nmcmc.target("icg", dtype="float64")
    good = nmcmc.train(t, steps=300, progress=False, output=str(tmp_path / "good.pt"))
    assert good.training["check"]["passes"] and good.training["check"]["max_rhat"] <= 1.1
    assert good.training["check"]["grads"] == 64 * good.training["check"]["grads_per_chain"]
    with pytest.warns(RuntimeWarning, match="does not mix"):
        bad = nmcmc.train(t, steps=2, model={"precondition": "none", "learn_precondition": False}, progress=False,
                          output=str(tmp_path / "bad.pt"))
    assert not bad.training["check"]["passes"] and "R-hat" in bad.training["check"]["why"]
    # the parameter that mixed worst, by name, with its R-hat (the check's own maximum: the draws are in x)
    worst = bad.training["check"]["worst"]
    assert worst["name"] in t.names and worst["rhat"] == pytest.approx(bad.training["check"]["max_rhat"])
    assert "worst" not in good.training["check"]
    # sampling with it says so again; with the model that mixed it does not
    with pytest.warns(RuntimeWarning, match="did not mix in its training's check .*slowest: x"):
        run = nmcmc.sample(sampler="learned", model=bad, chains=2, warmup=0, draws=20, progress=False)
    assert run.summary["model_fit"]["training_check"]["passes"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run = nmcmc.sample(sampler="learned", model=good, chains=2, warmup=0, draws=20, progress=False)
    assert run.summary["model_fit"]["training_check"]["passes"] is True


def test_training_budget_stops_early_and_says_why(tmp_path):
    # Note [Training budget]: a plateau (no gain of min_gain nats per dimension in `patience` steps)
    # or the time budget ends training before `steps`, with a checkpoint and the reason.
    t = nmcmc.target("icg", dim=4)
    m = nmcmc.train(t, steps=100000, batch=32, model={"hidden": 16, "precondition": "none", "learn_precondition": False},
                    options={"patience": 5, "min_gain": 1e6, "max_seconds": 0}, progress=False,
                    output=str(tmp_path / "p.pt"))
    # Note [A plateau that does not mix]: at each plateau the mixing check runs; this sampler (no
    # preconditioner on variances 1e-2 .. 1e2) fails it, so training goes on `patience` steps more;
    # Note [An extension that does not pay]: 5 more steps leave its check as it was (R-hat ~9, min
    # bulk-ESS 68 at steps 6 and 11), so it is not extended again and stops at 11, failing
    ext = m.training["time_extensions"]
    assert m.training["stopped"] == "plateau" and m.training["steps"] == 11
    assert [(c["at_step"], c["passes"], c["extends"]) for c in ext] == [(6, False, True)]
    assert m.training["check"]["at_step"] == 11 and m.training["check"]["extends"] is False
    assert not m.training["check"]["passes"]
    assert os.path.exists(tmp_path / "p.pt")
    # with 50 steps between plateaus the check improves at each (R-hat ~8.9, 8.0, 5.3, 2.0): it
    # extends three times, the most, and stops at the fourth plateau
    m = nmcmc.train(t, steps=100000, batch=32, model={"hidden": 16, "precondition": "none", "learn_precondition": False},
                    options={"patience": 50, "min_gain": 1e6, "max_seconds": 0}, progress=False,
                    output=str(tmp_path / "p50.pt"))
    ext = m.training["time_extensions"]
    assert [(c["at_step"], c["extends"]) for c in ext] == [(51, True), (101, True), (151, True)]
    assert all(b["max_rhat"] - 1 <= 0.9 * (a["max_rhat"] - 1) for a, b in zip(ext, ext[1:]))
    assert m.training["stopped"] == "plateau" and m.training["steps"] == 201
    # with the affine preconditioner the sampler mixes at its first plateau: it stops there
    m = nmcmc.train(t, steps=100000, batch=32, model={"hidden": 16}, options={"patience": 5, "min_gain": 1e6, "max_seconds": 0},
                    progress=False, output=str(tmp_path / "q.pt"))
    assert m.training["stopped"] == "plateau" and m.training["steps"] == 6
    # its plateau's check is the final check (run once)
    assert m.training["time_extensions"] == [] and m.training["check"]["passes"] and m.training["check"]["at_step"] == 6
    m = nmcmc.train(t, steps=100000, batch=32, model={"hidden": 16, "precondition": "none", "learn_precondition": False},
                    options={"patience": 0, "max_seconds": 0.5}, ess=0, progress=False, output=str(tmp_path / "t.pt"))
    assert m.training["stopped"] == "time" and 0 < m.training["steps"] < 100000
    # the defaults for your own target are the one definition both front ends use
    d = json.loads(nmcmc._C.default_train_config())
    assert d["train"]["batch"] == 64 and d["train"]["patience"] > 0 and d["train"]["max_seconds"] > 0
    assert d["train"]["ess_goal"] == 10000  # training stops once it no longer pays for 10,000 draws
    with pytest.raises(ValueError, match="patience"):
        nmcmc.train(t, steps=10, options={"patience": -1}, progress=False)


def test_training_stops_when_it_no_longer_pays(tmp_path):
    # Note [Training stops when it no longer pays]: probes project the all-in gradients to ess=N
    # effective draws; two that do not beat the best end training ("cost"), whatever the other
    # budgets (here none: no plateau rule, no time limit, 20,000 steps allowed).
    t = nmcmc.target("icg", dim=4)
    m = nmcmc.train(t, steps=20000, batch=32, ess=10000, model={"hidden": 16},
                    options={"patience": 0, "max_seconds": 0, "probe_every": 50}, progress=False,
                    output=str(tmp_path / "c.pt"))
    tr = m.training
    assert tr["stopped"] == "cost" and tr["steps"] < 20000
    probes = tr["probes"]
    assert len(probes) >= 3 and all(p["step"] % 50 == 0 and p["grads"] > 0 for p in probes)
    projected = [p["projected_grads"] for p in probes if p["projected_grads"] is not None]
    best = min(projected)
    assert probes[-1]["projected_grads"] is not None and probes[-1]["projected_grads"] >= best
    with pytest.raises(ValueError, match="ess_goal"):
        nmcmc.train(t, steps=10, ess=-1, progress=False)


def test_stan_model_samples_in_stans_names_and_says_what_is_missing():
    # Note [Stan programs]: the tests' program, built once per build tree (build/stan-cache).
    src = os.environ.get("NMCMC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    program = os.path.join(src, "tests", "data", "stan", "schools.stan")
    data = {"J": 8, "y": [28, 8, -3, 7, -1, 1, 18, 12], "sigma": [15, 10, 16, 11, 9, 11, 10, 18]}
    t = nmcmc.stan_model(program, data=data)
    assert t.dim == 10 and t.names[9] == "tau" and t.spec["name"] == "stan"
    run = nmcmc.sample(t, "nuts", chains=2, warmup=200, draws=100, seed=1, progress=False)
    names = [p["name"] for p in run.summary["parameters"]]
    assert names[9] == "tau" and names[10] == "theta.1" and names[-1] == "y_rep.8"
    assert tuple(run.draws.shape) == (100, 2, 26)
    assert bool((run.draws[:, :, 9] > 0).all())  # tau, constrained
    x = torch.randn(5, 10, dtype=torch.float64)
    c = t.constrain(x, transformed=False, generated=False)
    assert t.constrained_names(False, False)[9] == "tau" and torch.allclose(c[:, 9], x[:, 9].exp())
    assert torch.allclose(t.unconstrain(c), x, atol=1e-12)
    with pytest.raises(ValueError, match="Stan program"):
        nmcmc.target("icg", dim=2).constrain(x[:, :2])
    # The learned sampler trains on it (second derivatives by differences of Stan's gradients) and
    # reports its draws in Stan's names too.
    model = nmcmc.train(t, steps=20, transport="none", progress=False)
    run = nmcmc.sample(sampler="learned", model=model, chains=2, warmup=20, draws=30, seed=2, progress=False)
    assert tuple(run.draws.shape) == (30, 2, 26) and run.summary["parameters"][25]["name"] == "y_rep.8"
    # The model is the program's on these data whichever build or threads evaluate it (density_of).
    same = nmcmc.Target(dict(t.spec, threads=1), dtype="float64")
    run = nmcmc.sample(same, "learned", model=model, chains=2, warmup=20, draws=30, seed=2, progress=False)
    assert "trained_on" not in run.summary["model_fit"]
    del data["y"]
    with pytest.raises(ValueError, match="variable name=y"):
        nmcmc.stan_model(program, data=data)


def test_import_starts_no_process():
    # Note [OpenBLAS's kernels]: `import nmcmc` decides the BLAS kernels in-process (no child
    # Python); a fresh interpreter whose subprocess and fork end it with status 3 still imports it.
    code = ("import os, subprocess\n"
            "def refuse(*a, **k): os._exit(3)  # even where the caller would catch an exception\n"
            "subprocess.Popen.__init__ = refuse; os.fork = refuse; os.posix_spawn = refuse\n"
            "import nmcmc\n"
            "print(nmcmc.blas_kernels())\n")
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("NMCMC_BLAS_CORE_FROM", None)
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "this CPU runs" not in r.stdout, r.stdout  # the kernels the CPU runs best, or OpenBLAS's own pick


class _Quadratic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x ** 2).sum(-1)


def test_a_scripted_module_is_dropped_when_nothing_made_from_it_is_left():
    import gc
    before = nmcmc._C.registered_modules()
    t = nmcmc.from_module(_Quadratic(), dim=2)
    key = t.spec["module"]
    assert key.startswith("memory:") and nmcmc._C.registered_modules() == before + 1
    model = nmcmc.train(t, steps=3, batch=8, transport="none", progress=False)
    del t
    gc.collect()
    assert nmcmc._C.registered_modules() == before + 1  # the model still needs it
    run = nmcmc.sample(sampler="learned", model=model, chains=2, warmup=5, draws=5, progress=False)
    assert tuple(run.draws.shape) == (5, 2, 2)
    del model, run
    gc.collect()
    assert nmcmc._C.registered_modules() == before
    with pytest.raises(ValueError, match="no module"):
        nmcmc.Target({"name": "torchscript", "module": key})


def test_nuts_step_size_per_chain_is_recorded_and_refused_elsewhere():
    # Note [A step size per chain]: each chain's own, their mean as step_size; one for all by default
    t = nmcmc.target("icg", dim=3)
    run = nmcmc.sample(t, "nuts", step_size_per_chain=True, warmup=150, draws=10, progress=False)
    steps = run.summary["step_sizes"]
    assert len(steps) == 4 and abs(sum(steps) / 4 - run.summary["step_size"]) < 1e-12
    assert "step_sizes" not in nmcmc.sample(t, "nuts", warmup=150, draws=10, progress=False).summary
    with pytest.raises(ValueError, match="--step-size-per-chain goes with --sampler nuts"):
        nmcmc.sample(t, "hmc", step_size_per_chain=True, warmup=10, draws=5, progress=False)


def test_sample_and_compare_take_their_defaults_from_the_cpp_definition(tmp_path):
    s = nmcmc.sample_defaults()
    assert (s["sampler"], s["chains"], s["warmup"], s["draws"], s["seed"]) == ("nuts", 4, 1000, 1000, 1)
    run = nmcmc.sample(nmcmc.target("icg", dim=2), warmup=50, draws=20, progress=False)
    assert tuple(run.draws.shape) == (20, s["chains"], 2)
    d = nmcmc.compare_defaults()
    assert (d["chains"], d["warmup"], d["draws"], d["seed"], d["dtype"]) == (4, 1000, 1000, 1, "float32")
    # what Python passes is read by the C++ definition: a misspelt key is named, not ignored
    with pytest.raises(ValueError, match="'chians' is unknown"):
        nmcmc._C.compare(json.dumps({"output": str(tmp_path), "chians": 4}), None)


def quartic_energy(x):
    return 0.5 * (x * x).sum(-1) + 0.1 * (x * x * x * x).sum(-1)


def test_engine_reaches_a_module_and_is_recorded():
    # Note [Native copies]: engine= runs a TorchScript target on LibTorch alone (or on nmcmc's own
    # evaluator); the draws agree; a spec that names another engine is refused.
    t = nmcmc.from_function(quartic_energy, dim=3, dtype="float64")
    runs = {}
    for e in ("native", "libtorch"):
        runs[e] = nmcmc.sample(t, "nuts", engine=e, warmup=10, draws=20, step_size=0.5, adapt_step=False,
                               progress=False)
        assert runs[e].config["engine"]["kind"] == e and runs[e].config["native_copies"] == e
    assert torch.allclose(runs["native"].draws, runs["libtorch"].draws, rtol=1e-9, atol=1e-9)
    fixed = nmcmc.Target({**t.spec, "engine": "native"}, dtype="float64")
    with pytest.raises(ValueError, match="differ"):
        nmcmc.sample(fixed, "nuts", engine="libtorch", warmup=5, draws=5, progress=False)
    with pytest.raises(ValueError, match="unknown engine"):
        nmcmc.sample(t, "nuts", engine="gpu", warmup=5, draws=5, progress=False)
