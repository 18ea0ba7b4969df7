"""The posteriordb suite (posteriordb/, scripts/posteriordb.py): every port is checked against its
reference posterior, and the exported TorchScript modules are what nmcmc samples.

E[grad U] = 0 under the posterior (U vanishing at the boundary of the unconstrained space): over
the 1,000 vendored reference draws (posteriordb's thinned draws, nearly independent) each
coordinate's mean gradient is a z-score; a port passes when every |z| < 5. For a correct port the
false-fail rate is about 6e-7 per coordinate (normal approximation), 7e-5 over the suite's ~115
coordinates. A missing Jacobian or a wrong prior shifts E[grad U] by far more (the power tests).
E[(x - m) grad U^T] = I (integration by parts once more) sees what the first cannot: an energy
scaled or tempered by a constant. Every entry's |z| < 5: about 6e-7 per entry, 7e-4 over the
suite's 1,306 entries (normal approximation; the products are heavier-tailed than normal, the
largest |z| today is 4.3, an off-diagonal entry of diamonds). The energy times 0.7 moves every
port's diagonal by 8.8 standard errors or more (the power test, on every port).
The moment checks of the samplers (NUTS, the learned sampler) run the posteriors and take minutes:
`ctest -L posteriordb` (scripts/posteriordb.py check).
"""
import math
import os
import sys

import pytest

import nmcmc  # before torch: Note [OpenBLAS's kernels]
import torch

ROOT = os.environ.get("NMCMC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "posteriordb"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ports  # noqa: E402
import posteriordb  # noqa: E402

POSTERIORS = list(ports.PORTS)


def test_the_suite_spans_the_kinds_users_bring():
    kinds = " ".join(ports.PORTS[p][3] for p in POSTERIORS)
    assert len(POSTERIORS) >= 15
    for kind in ("hierarchical", "correlated regression", "time series", "Gaussian process", "Poisson", "mixture"):
        assert kind in kinds, kind


@pytest.mark.parametrize("posterior", POSTERIORS)
def test_port_has_zero_mean_gradient_on_the_reference_draws(posterior):
    ref = ports.reference(posterior)
    assert len(ref["names"]) == len(ref["mean"]) == len(ref["sd"]) == len(ref["draws"][0])
    z = posteriordb.gradient_z(posterior)
    assert torch.isfinite(z).all()
    assert z.abs().max() < 5, f"{posterior}: max |z| {z.abs().max():.1f} at {ref['names'][int(z.abs().argmax())]}"


@pytest.mark.parametrize("posterior", POSTERIORS)
def test_port_satisfies_the_second_moment_identity(posterior):
    z = posteriordb.second_moment_z(posterior)
    assert torch.isfinite(z).all()
    assert z.abs().max() < 5, f"{posterior}: max |z| {z.abs().max():.1f} of E[(x - m) grad U^T] - I"


class _Tempered(torch.nn.Module):
    """The port's energy times 0.7 (a tempered posterior): E[grad U] is still 0 on the reference draws."""

    def __init__(self, posterior):
        super().__init__()
        self.inner = ports.module(posterior)

    def forward(self, x):
        return 0.7 * self.inner(x)


@pytest.mark.parametrize("posterior", POSTERIORS)
def test_second_moment_identity_catches_a_tempered_energy_the_mean_gradient_misses(posterior):
    broken = _Tempered(posterior).double()
    assert posteriordb.gradient_z(posterior, broken).abs().max() < 5  # the first identity cannot see it
    assert posteriordb.second_moment_z(posterior, broken).diagonal().abs().max() > 5


class _WithoutJacobian(torch.nn.Module):
    """eight schools without the log Jacobian of tau = exp(x[9]) (a classic porting error). (Where
    the likelihood dwarfs it, as in kilpisjarvi's 62 points, 1,000 draws see a missing Jacobian at
    only 2-3 standard errors: the check catches what is large against the gradient's noise.)"""

    def __init__(self):
        super().__init__()
        self.inner = ports.module("eight_schools-eight_schools_noncentered")

    def forward(self, x):
        return self.inner(x) + x[:, 9]


class _WrongPrior(torch.nn.Module):
    """eight schools with tau ~ cauchy(0, 25) instead of cauchy(0, 5)."""

    def __init__(self):
        super().__init__()
        self.inner = ports.module("eight_schools-eight_schools_noncentered")

    def forward(self, x):
        tau = torch.exp(x[:, 9])
        return self.inner(x) - torch.log1p((tau / 5.0) ** 2) + torch.log1p((tau / 25.0) ** 2)


@pytest.mark.parametrize("broken,posterior", [(_WithoutJacobian, "eight_schools-eight_schools_noncentered"),
                                              (_WrongPrior, "eight_schools-eight_schools_noncentered")])
def test_gradient_check_catches_a_wrong_port(broken, posterior):
    z = posteriordb.gradient_z(posterior, broken().double())
    assert z.abs().max() > 5


def test_exported_modules_are_the_ports(tmp_path):
    posteriordb.export(str(tmp_path), None)
    for p in POSTERIORS:
        ref = ports.reference(p)
        t = nmcmc.from_module(str(tmp_path / (p + ".pt")), dtype="float64")
        # Note [Native engine]: every port runs on nmcmc's evaluator (the Gaussian processes'
        # Cholesky factorisations and triangular solves too: Note [Native linear algebra]), and
        # agrees with the port's autograd below
        assert t.engine == "native", (p, t.engine_note)
        assert t.engine_note == "", (p, t.engine_note)
        assert t.dim == len(ref["names"]) and t.names == ref["names"]
        mean, sd = t.reference_moments
        assert torch.allclose(mean, torch.tensor(ref["mean"], dtype=torch.float64))
        x = torch.tensor(ref["draws"][:64], dtype=torch.float64)
        u, g = t.energy_and_grad(x)
        xr = x.clone().requires_grad_(True)
        u_py = ports.module(p)(xr)
        g_py, = torch.autograd.grad(u_py.sum(), xr)
        assert torch.allclose(u, u_py.detach(), rtol=1e-10, atol=1e-8), p
        # The latent GP's kernel matrix (jitter 1e-10) has condition numbers near 1e10 at these
        # draws: float64 fixes its gradient only to ~1e-6 relative (LibTorch's own, through two
        # equivalent formulas of the kernel, differs by 7e-7; the evaluator's by 1.6e-7).
        tol = 1e-6 if p == "gp_pois_regr-gp_pois_regr" else 1e-8
        assert torch.allclose(g, g_py, rtol=tol, atol=tol), p


def test_gaussian_process_raises_where_its_kernel_matrix_fails_and_nmcmc_rejects_there():
    # Note [A density may fail]: at a huge length scale the kernel matrix is singular to rounding
    # and the port's Cholesky factorisation raises, as Stan's does; nmcmc evaluates that row as NaN.
    m = posteriordb.scripted("gp_pois_regr-gp_regr")
    bad = torch.tensor([[12.0, 3.0, -30.0]], dtype=torch.float64)
    with pytest.raises(Exception):
        m(bad)
    t = nmcmc.from_module(m, dtype="float64")
    x = torch.cat([bad, torch.tensor([ports.reference("gp_pois_regr-gp_regr")["mean"]], dtype=torch.float64)])
    u, g = t.energy_and_grad(x)
    assert math.isnan(u[0]) and torch.isfinite(u[1])
    assert torch.isnan(g[0]).all() and torch.isfinite(g[1]).all()


def test_nuts_warm_up_restarts_chains_that_cannot_move():
    # Note [Stuck chains in warm-up]: on kidiq's regression 3 of these 16 uniform(-2, 2) starts
    # could not move at the pooled step size; they stayed put through the warm-up (every draw
    # divergent), the dense metric was estimated from them too, and the step size fell to 0.0098.
    # Restarted from moving chains, every chain samples and the step size is about 1.
    t = nmcmc.from_module(posteriordb.scripted("kidiq-kidscore_momiq"), dtype="float64")
    r = nmcmc.sample(t, "nuts", chains=16, warmup=500, draws=100, metric="dense", seed=1, progress=False)
    assert int(r.divergent.sum(0).max()) < 10, r.divergent.sum(0).tolist()
    assert r.step_size > 0.3
    assert r.summary["max_rhat"] < 1.05


def test_training_through_the_flow_starts_its_rounds_again_where_the_chains_arrived():
    # Note [The transported warm-up starts at the posterior]: on kilpisjarvi (a correlation near -1,
    # the posterior far from the uniform box) `train --transport flow`'s rounds from the box end
    # with 16 chains far out (the last fit's loss at the clip, 1e4 per coordinate), and training
    # then met a non-finite energy at every proposal ("learned nothing"). They now run again from
    # where a warm-up of the chains alone left them: the last fit describes the chains' states
    # (below 1 per coordinate: Note [Transport warm-up]'s transient threshold) and the proposal
    # moves; the record keeps what the first attempt cost.
    t = nmcmc.from_module(posteriordb.scripted("kilpisjarvi_mod-kilpisjarvi"), dtype="float64")
    model = nmcmc.train(t, transport="flow", steps=30, options={"seed": 1, "patience": 0}, progress=False)
    pre = model.training["preconditioner"]
    assert pre["from_the_box"]["last_fit_loss"] > 1.0, pre["from_the_box"]["last_fit_loss"]
    assert pre["arrival"]["warmup"] == 500
    assert pre["grads"] > pre["from_the_box"]["grads"] + pre["arrival"]["grads"]
    assert pre["transport"]["rounds"][-1]["fit"]["loss_end"] < 1.0, pre["transport"]["rounds"]
    r = nmcmc.sample(sampler="learned", model=model, chains=4, warmup=50, draws=200, seed=1, progress=False)
    assert r.summary["accept_rate"] > 0.1, r.summary["accept_rate"]


def test_transport_drops_transient_states_from_the_fits_pool():
    # Note [Transient states in the pool] (services/transport.cpp): on earnings the base estimated
    # from all the pool's states can fit them 100-900x worse than the base from the last two rounds'
    # states fits theirs (above 100x: the older rounds leave the pool), and the last fit then ends
    # near the affine map's loss (it ended at 0.14 per coordinate when they stayed). Which seeds
    # drop a round depends on the GEMM kernels and LibTorch's thread count (their sums' order; Note
    # [OpenBLAS's kernels]), so four seeds run: under OpenBLAS's SkylakeX, Haswell and SSE3 kernels,
    # with one thread or two, at least one of them drops a round (measured at e407e67: seeds 1, 5
    # and 22 on SkylakeX, 1 or 22 on Haswell, 1, 5 or 23 on SSE3), and wherever the rule was
    # checked it acted exactly when the ratio was above 100.
    t = nmcmc.from_module(posteriordb.scripted("earnings-logearn_height"), dtype="float64")
    dropping = []
    for seed in (1, 5, 22, 23):
        r = nmcmc.sample(t, "nuts", transport="flow", seed=seed, progress=False)
        rounds = r.summary["transport"]["rounds"]
        dropped = [x for x in rounds if "dropped_rounds" in x.get("drift", {})]
        for x in dropped:
            assert x["drift"]["affine_all"] > 100 * x["drift"]["affine_recent"], (seed, x["drift"])
        for x in rounds:  # where it did not act, the ratio was at most 100
            if "drift" in x and "dropped_rounds" not in x["drift"]:
                assert x["drift"]["affine_all"] <= 100 * x["drift"]["affine_recent"], (seed, x["drift"])
        if dropped:
            dropping.append(seed)
            assert rounds[-1]["fit"]["loss_end"] < 0.02, (seed, rounds[-1]["fit"])
            assert r.summary["max_rhat"] < 1.01, seed
    assert dropping, "no seed dropped a round"


def test_the_worst_mixing_quantity_skips_constants():
    # A correlation matrix's diagonal is constant: its R-hat is null, and it is never the worst;
    # a quantity whose chains never moved has a null R-hat too, and is.
    q = [{"name": "a", "rhat": 1.001, "sd": 1.0}, {"name": "Omega.1.1", "rhat": None, "sd": 0.0},
         {"name": "b", "rhat": 1.02, "sd": 2.0}]
    assert posteriordb.worst_rhat_quantity(q) == "b"
    assert posteriordb.worst_rhat_quantity(q + [{"name": "stuck", "rhat": None, "sd": 0.5}]) == "stuck"
    assert posteriordb.worst_rhat_quantity([]) is None


def test_a_widened_spread_fails_the_moment_checks_where_the_run_passes():
    # check --widened-must-fail: the same run with every quantity 1.118x as far from its mean (as the
    # energy tempered by 0.8 widens a Gaussian) must fail the sd check at 4,000 effective draws,
    # where the run itself passes; a factor of 1 leaves it passing (the variant is the only change).
    n, ess = 100000, 4000.0
    torch.manual_seed(0)  # reference draws for the reference sd's error (their kurtosis, about 3)
    ref = {"names": ["a", "b"], "mean": [0.0, 3.0], "sd": [1.0, 2.0], "n": n,
           "draws": (torch.randn(1000, 2, dtype=torch.float64) * torch.tensor([1.0, 2.0])).tolist()}
    summary = {"parameters": [{"name": nm, "mean": m, "sd": sd, "mcse_mean": sd / ess ** 0.5,
                               "mcse_sd": sd / (2 * ess) ** 0.5} for nm, m, sd in zip("ab", [0.01, 3.02], [1.01, 1.99])]}
    assert posteriordb.moments_check(summary, ref)[0]
    assert posteriordb.moments_check(posteriordb.widened(summary, 1.0), ref)[0]
    ok, _z, sd_ratio, why, _zs = posteriordb.moments_check(posteriordb.widened(summary, 1.118), ref)
    assert not ok and abs(sd_ratio - 1.129) < 0.01 and all(" sd " in w for w in why)
    assert summary["parameters"][0]["sd"] == 1.01  # the run's own summary is left as it was


def _heavy_reference(n=200000, seed=1):
    """A reference as scripts/large_reference.R writes one, from n independent draws of Student's t
    with 5 degrees of freedom (density ~ |x|^-6, kurtosis 9) beside a normal quantity."""
    g = torch.Generator().manual_seed(seed)
    x = torch.stack([torch.distributions.StudentT(5.0).sample((n,)), torch.randn(n, generator=g, dtype=torch.float64)], 1)
    x = x.to(torch.float64).unsqueeze(1)  # [n, 1, 2]
    flat = x[:, 0, :]
    c = flat - flat.mean(0)
    ref = {"names": ["t", "z"], "mean": flat.mean(0).tolist(), "sd": flat.std(0).tolist(), "n": n,
           "ess_bulk": [float(n)] * 2, "kurtosis": ((c ** 4).mean(0) / (c ** 2).mean(0) ** 2).tolist()}
    for key, prob in posteriordb.QUANTILES:
        q, mcse = posteriordb.quantiles_and_mcse(x, prob)
        ref[key], ref["mcse_" + key] = q.tolist(), mcse.tolist()
    return ref


def _run(draws):
    """A run's summary parameters (as nmcmc's summary writes them) and its draws [S, C, K]."""
    s = nmcmc.summarise(draws)
    params = [{"name": nm, **{f: float(s[f][k]) for f in ("mean", "sd", "mcse_mean", "mcse_sd")}}
              for k, nm in enumerate(["t", "z"])]
    return {"parameters": params}, draws


def test_a_quantiles_mcse_is_the_sampling_error_of_the_quantile(monkeypatch):
    # For n independent normal draws the p quantile's standard error is sqrt(p (1 - p) / n) / phi(z_p):
    # 0.0198 for the median at n = 4,000, 0.0335 for the 5 % quantile. Over 200 quantities the estimate
    # (Note [Heavy tails]) scatters by 7-10 %: its mean within 10 % of the truth, every one within 35 %.
    torch.manual_seed(3)
    x = torch.randn(1000, 4, 200, dtype=torch.float64)
    for prob, z in ((0.5, 0.0), (0.05, -1.6448536)):
        expected = math.sqrt(prob * (1 - prob) / 4000) / (math.exp(-z * z / 2) / math.sqrt(2 * math.pi))
        q, mcse = posteriordb.quantiles_and_mcse(x, prob)
        ratio = mcse / expected
        assert abs(float(ratio.mean()) - 1) < 0.1 and float((ratio - 1).abs().max()) < 0.35, (prob, ratio)
        assert float(((q - z) / expected).std()) < 1.2  # the quantiles themselves scatter by their MCSE
        monkeypatch.setattr(posteriordb, "QUANTILE_ELEMENTS", 4000 * 30)  # blocks of 30 quantities: the same
        q2, mcse2 = posteriordb.quantiles_and_mcse(x, prob)
        monkeypatch.undo()
        assert torch.equal(q, q2) and torch.equal(mcse, mcse2)


def test_heavy_tails_are_checked_by_their_quantiles_and_a_narrow_run_still_fails():
    # Note [Heavy tails]: 4 x 1,000 independent draws of t_5 against a 200,000-draw reference pass
    # (the sd's standard error with the reference's kurtosis, the quantiles within 5 MCSEs: a
    # false-fail rate of about 6e-7 per check, normal approximation); the same draws 0.8x as far
    # from their mean (a sampler too narrow) fail on the quantiles, and 1.25x (too wide) too.
    ref = _heavy_reference()
    torch.manual_seed(7)
    draws = torch.stack([torch.distributions.StudentT(5.0).sample((1000, 4)), torch.randn(1000, 4)], -1).to(torch.float64)
    summary, d = _run(draws)
    ok, _z, _sd, why, _zs = posteriordb.moments_check_named(summary, ref, d)
    assert ok, why
    for factor in (0.8, 1.25):
        wide = posteriordb.widened_draws(d, factor)
        ok, _z, _sd, why, _zs = posteriordb.moments_check_named(posteriordb.widened(summary, factor), ref, wide)
        assert not ok and any(" q05 " in w or " q95 " in w for w in why), (factor, why)
    # a reference without quantiles and kurtosis (those made before them) is checked as before
    plain = {k: v for k, v in ref.items() if k in ("names", "mean", "sd", "n", "ess_bulk")}
    ok, _z, _sd, why, _zs = posteriordb.moments_check_named(summary, plain, d)
    assert ok and not any(" q" in w for w in why)


def test_above_the_heavy_kurtosis_the_sd_is_left_to_the_quantiles():
    # Note [Heavy tails]: a run whose sd alone is off (the summary's sd 0.8x, its draws as they are):
    # where the reference's kurtosis is above HEAVY_KURTOSIS its quantiles decide and it passes;
    # below it the sd check fails it.
    ref = _heavy_reference()
    torch.manual_seed(7)
    draws = torch.stack([torch.distributions.StudentT(5.0).sample((1000, 4)), torch.randn(1000, 4)], -1).to(torch.float64)
    summary, d = _run(draws)
    summary["parameters"][0]["sd"] *= 0.8
    ref["kurtosis"][0] = posteriordb.HEAVY_KURTOSIS + 3
    ok, _z, _sd, why, _zs = posteriordb.moments_check_named(summary, ref, d)
    assert ok, why
    ref["kurtosis"][0] = posteriordb.HEAVY_KURTOSIS - 3
    ok, _z, _sd, why, _zs = posteriordb.moments_check_named(summary, ref, d)
    assert not ok and any(w.startswith("t sd ") for w in why), why
