#!/usr/bin/python3
"""posteriordb's reference posteriors (posteriordb/, ports of stan-dev/posteriordb) as nmcmc targets.

    scripts/posteriordb.py list
        the ported posteriors: dimension, kind
    scripts/posteriordb.py export DIR [POSTERIOR ...]
        DIR/POSTERIOR.pt: TorchScript energies on the unconstrained scale, with their parameter
        names and the reference posterior's mean and sd as attributes (names, ref_mean, ref_sd),
        for `nmcmc sample --module DIR/POSTERIOR.pt`, `nmcmc train --module ...` and Python
    scripts/posteriordb.py gradients [POSTERIOR ...]
        E[grad U] = 0 and E[(x - m) grad U^T] = I on the reference draws (checks each port,
        Jacobians included; the second sees a scaled or tempered energy)
    scripts/posteriordb.py ports-vs-stan [POSTERIOR ...]
        each port's energy and gradient against its Stan program's (Note [Stan programs]) at the
        1,000 reference draws: the energies equal up to one constant, the gradients equal
    scripts/posteriordb.py large-table LEARNED.json FLOW.json NUTS.json ...
        the large suite's table (Note [The large suite]): the best NUTS, NUTS through the flow and
        the learned sampler in all-in seconds to 10,000 effective draws, and issue #64's goals
    scripts/posteriordb.py table NUTS.json LEARNED.json [NUTS_OTHER_METRIC.json ...]
        the benchmark table of `check --json` runs: the learned sampler against the best NUTS
        (ratios: >1 means the learned sampler wins)
    scripts/posteriordb.py metrics DIAG.json OTHER.json ...
        NUTS's metrics against Stan's diagonal one: bulk-ESS per gradient and per second, medians
    scripts/posteriordb.py check [--sampler nuts|learned] [--only P ...] [--json FILE] [...]
        samples each posterior as a user would (NUTS with Stan's settings, or the learned sampler
        trained with `nmcmc train --module`'s defaults) and checks the moments against the
        reference: every mean within 5 of its standard error (the run's MCSE and the reference's
        combined), every sd within 5 of its own (the run's mcse_sd, as R's posterior package
        computes it, and the reference's sd sqrt((kurtosis - 1) / (4 n)) combined); max R-hat at
        most 1.01 and min bulk-ESS at least 400; prints a row per posterior (exit 1 if any fails)
        --temper F: the broken variant, the energy times F; exit 0 only if every posterior fails
        --widened-must-fail F: the broken variant beside each run, for any posterior (a Stan
        program's energy cannot be tempered): the same draws with every quantity's spread about its
        mean F times the run's must fail the moment checks
    scripts/posteriordb.py check --stan [...]
        the same from posteriordb's Stan programs (posteriordb/stan, all 46 posteriors with reference
        draws; Note [Stan programs]): the draws are Stan's constrained quantities, checked by name
        against posteriordb/stan_reference with the same rules (the reference's sd error from the
        kurtosis of the run's draws and the reference's bulk-ESS)
    scripts/posteriordb.py check --suite large --only P --program PROGRAM.stan --data DATA.json [...]
        one posterior through another Stan program of the same posterior (a reference program of
        large/reference_stan/, its data by scripts/large_reference_data.R), checked by name against
        P's reference

Note [The large suite]
`check --suite large` (bench/posteriordb.sh OUT --suite large): the posteriors where NUTS takes
long enough for training to pay, each with a reference. posteriordb's diamonds (26) and mcycle_gp's
accel_gp (66) with posteriordb's reference draws; Inference Gym's Brownian motion with unknown
scales (32), German credit's sparse logistic regression (51) and radon contextual effects in
Minnesota (91) with its published ground truth (inference_gym/); posteriordb's larger programs
without reference draws (large/: irt_2pl 144, GLMM_Poisson 45, radon_mn's varying intercepts and
slopes 175, uk_drivers' state space 389, radon_all's hierarchical intercepts 391, sat's
hierarchical 2PL 670, hierarchical_gp 933, election88_full 90, ovarian's regularised horseshoe
logistic regression 3,075) with references made by scripts/large_reference.R: Stan 2.21
through rstan, not nmcmc's samplers, 10 chains, every R-hat at most 1.01 and every bulk-ESS at
least 2,000, each file stating its run. A posterior whose reference is not made yet is left out
of the suite (stan_posteriors). The checks are those below.

The moment checks' false-fail rate: a mean or an sd off by more than 5 standard errors has
probability about 6e-7 per check for a correct sampler (normal approximation, both standard errors
taken as exact), so about 2e-4 over `make test`'s 398 checks (posteriordb.nuts_quick,
learned_quick and large_nuts_flow) and about 3e-4 over the long suite's. An error in the MCSE estimate itself (ESS is
estimated to about 10 % at these lengths) raises that: a standard error 20 % too small makes the
threshold 4 true standard errors, 6e-5 per check. What the checks see: a mean off by 5 MCSE, an sd
off by 5 of its standard errors (about 11 % at 1,000 effective draws, 3.5 % at 10,000 for a
normal-tailed quantity); the energy tempered by 0.8 (every sd 12 % wide) fails on every posterior
tried (posteriordb.tempered_energy_is_caught), and so does a Stan program's run whose spread is taken
1.118x (posteriordb.large_nuts_flow's --widened-must-fail: a Stan program's energy cannot be tempered).

Note [Heavy tails]
The sd check's standard error, sd sqrt((kurtosis - 1) / (4 ESS)), stands on the fourth moment. A
few-group scale has a long right tail: election88_full's region scale sigma_e (5 groups, a uniform
prior to 100) has a posterior density falling about as sigma^-5 (each group's normal density
contributes a factor 1/sigma), so its fourth moment is finite only through the prior's cap, and
4,000 draws rarely reach the tail that sets the sd. Its reference (20,000 draws) has mean 0.885
and sd 0.870; the two NUTS runs that converged on it (4 x 1,000 draws, R-hat 1.005 and 1.007) an
sd of 0.61 and 0.49, and the kurtosis of their draws, which sets their mcse_sd, is as short as
their sd. An sd check there measures how far 4,000 draws reach into the tail, in units that are
too small. So, where a reference made by scripts/large_reference.R carries them: the kurtosis in
both terms of the sd's standard error is the reference's (the run's mcse_sd scaled up by
sqrt((kurtosis_ref - 1) / (kurtosis_run - 1)) where the run's draws show less), and the 5, 25, 50,
75 and 95 % quantiles are checked, each within 5 of its MCSEs combined (quantiles_and_mcse):
quantiles need no moment at all, so a run that is too narrow, too wide or shifted in the body of
the posterior fails there. Where the reference's kurtosis is above HEAVY_KURTOSIS = 9 (Student's
t with 5 degrees of freedom; a normal quantity's is 3) the sd is not checked at all: its standard
error then rests on a kurtosis that 20,000 draws do not pin down (the estimate's own error needs
an eighth moment), and with the reference's kurtosis (17.7) NUTS diag's sigma_e still stood at
5.8 "standard errors" while its five quantiles were each within 5 MCSEs of the reference's. On
election88_full the heavy ones stand apart: 13 to 68 for the few-group scales and effects, 3.2
the median of the 90 quantities. The sd check keeps what the quantiles lack for light tails:
a spread 1.118x too wide moves the sd by 5.3 of its standard errors at 4,000 effective draws and
the 95 % quantile by 1.8 of its MCSEs (python/tests/test_posteriordb.py: t_5 draws 0.8x and 1.25x as far from
their mean fail; the draws themselves pass). The widened variant (--widened-must-fail) widens the
draws the quantiles are taken from as well as the summary. A quantile's MCSE is posterior's
mcse_quantile (the ESS of the indicator x <= q, then the order statistics at the quantile's
Beta(ESS p + 1, ESS (1 - p) + 1) interval) with the order statistics taken at -+ WINDOW = 4 of
the Beta's sds and the spread divided by 8, not at -+ 1 and by 2: at 4,000 draws the +-1 spacing
spans about 60 draws and the MCSE it gives scatters by 13-19 % (sd over 400 normal quantities,
min 0.54 of the true one), which would turn a 5-MCSE check into a 3-MCSE one for some quantities;
at 4 sds the scatter is 7-10 % (min 0.77), 2-4 % on the high side on average.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
try:  # before torch, so that it can choose OpenBLAS's kernels (Note [OpenBLAS's kernels])
    import nmcmc  # noqa: F401
except ImportError:  # `export` needs only torch
    pass
import torch  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
import ports  # noqa: E402
from posteriordb_tables import large_table, metrics_table, pairs_table, table, transport_table  # noqa: E402


class _Tempered(torch.nn.Module):
    """The broken variant the moment checks must catch: the energy times `factor` (a tempered
    posterior: every sd about factor^-1/2 too wide)."""

    def __init__(self, m: torch.nn.Module, factor: float):
        super().__init__()
        self.m = m
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * self.m(x)


def scripted(posterior: str, temper: float = 1.0) -> torch.jit.ScriptModule:
    m = ports.module(posterior)
    if temper != 1.0:
        m = _Tempered(m, temper)
    ref = ports.reference(posterior)
    m.dim = len(ref["names"])
    m.names = list(ref["names"])
    m.ref_mean = torch.tensor(ref["mean"], dtype=torch.float64)
    m.ref_sd = torch.tensor(ref["sd"], dtype=torch.float64)
    return torch.jit.script(m)


def export(directory: str, only) -> None:
    os.makedirs(directory, exist_ok=True)
    for p in only or ports.PORTS:
        torch.jit.save(scripted(p), os.path.join(directory, p + ".pt"))
        print(os.path.join(directory, p + ".pt"))


def gradient_z(posterior: str, module=None) -> torch.Tensor:
    """z-scores of the mean of grad U over the reference draws, per coordinate."""
    m = module if module is not None else ports.module(posterior)
    x = torch.tensor(ports.reference(posterior)["draws"], dtype=torch.float64).requires_grad_(True)
    g, = torch.autograd.grad(m(x).sum(), x)
    return g.mean(0) / (g.std(0) / math.sqrt(x.shape[0]))


def second_moment_z(posterior: str, module=None) -> torch.Tensor:
    """z-scores [D, D] of E[(x - m) grad U^T] - I over the reference draws: integration by parts
    gives E[(x - m) grad U^T] = I under the posterior, which sees what E[grad U] = 0 cannot: an
    energy scaled or tempered by a constant (the diagonal), a wrong covariance term."""
    m = module if module is not None else ports.module(posterior)
    x = torch.tensor(ports.reference(posterior)["draws"], dtype=torch.float64).requires_grad_(True)
    g, = torch.autograd.grad(m(x).sum(), x)
    products = (x - x.mean(0)).detach().unsqueeze(2) * g.unsqueeze(1)  # [n, D, D]
    eye = torch.eye(x.shape[1], dtype=torch.float64)
    return (products.mean(0) - eye) / (products.std(0) / math.sqrt(x.shape[0]))


def _reference_sd_se(ref: dict) -> list:
    """The standard error of each reference sd: sd sqrt((kurtosis - 1) / (4 n)), the kurtosis from
    the stored reference draws (posteriordb's draws are thinned to be about independent)."""
    x = torch.tensor(ref["draws"], dtype=torch.float64)
    c = x - x.mean(0)
    kurt = (c ** 4).mean(0) / (c ** 2).mean(0) ** 2
    return [float(ref["sd"][k] * math.sqrt((kurt[k] - 1) / (4 * ref["n"]))) for k in range(x.shape[1])]


def moments_check(summary: dict, ref: dict, mcse_z: float = 5.0, sd_z: float = 5.0):
    """The moment checks on a run's summary.json: (passes, worst mean z, worst sd ratio, why, worst
    sd z). Each mean within `mcse_z` of its standard error (the run's MCSE and the reference's combined),
    each sd within `sd_z` of its own (the run's mcse_sd and the reference's combined)."""
    worst_z, worst_sd, worst_zs, why = 0.0, 1.0, 0.0, []
    ref_se_sd = _reference_sd_se(ref)
    for k, p in enumerate(summary["parameters"]):
        ref_mcse = ref["sd"][k] / math.sqrt(ref["n"])
        z = abs(p["mean"] - ref["mean"][k]) / math.sqrt(p["mcse_mean"] ** 2 + ref_mcse ** 2)
        zs = abs(p["sd"] - ref["sd"][k]) / math.sqrt(p["mcse_sd"] ** 2 + ref_se_sd[k] ** 2)
        r = p["sd"] / ref["sd"][k]
        worst_z = max(worst_z, z if math.isfinite(z) else math.inf)
        worst_zs = max(worst_zs, zs if math.isfinite(zs) else math.inf)
        if abs(r - 1) > abs(worst_sd - 1) or not math.isfinite(r):
            worst_sd = r
        if not z <= mcse_z:
            why.append(f"{ref['names'][k]} mean {p['mean']:.4g} vs {ref['mean'][k]:.4g} ({z:.1f} MCSE)")
        if not zs <= sd_z:
            why.append(f"{ref['names'][k]} sd {p['sd']:.4g} vs {ref['sd'][k]:.4g} ({zs:.1f} se)")
    return not why, worst_z, worst_sd, why, worst_zs


SUITE = "posteriordb"  # check --suite
# Where a suite's Stan programs are, each directory in posteriordb/'s layout (stan/, data/,
# stan_reference/): posteriordb's with its reference draws, Inference Gym's with its ground truth,
# and posteriordb's larger programs with references made by scripts/large_reference.R
SUITE_DIRS = {"posteriordb": ["posteriordb"], "gym": ["inference_gym"],
              "large": ["posteriordb", "inference_gym", "large"]}
# The large suite (Note [The large suite]), in order of the runs; those without a reference yet are skipped
LARGE = ["diamonds-diamonds", "mcycle_gp-accel_gp", "brownian_motion_unknown_scales",
         "german_credit_sparse_logistic_regression", "radon_contextual_effects_minnesota",
         "irt_2pl-irt_2pl", "GLMM_Poisson_data-GLMM_Poisson_model",
         "radon_mn-radon_variable_intercept_slope_noncentered",
         "uk_drivers-state_space_stochastic_level_stochastic_seasonal",
         "radon_all-radon_hierarchical_intercept_noncentered", "sat-hier_2pl",
         "state_wide_presidential_votes-hierarchical_gp", "election88-election88_full",
         "ovarian-logistic_regression_rhs"]


def stan_dirs():
    return [os.path.join(HERE, "..", d) for d in SUITE_DIRS[SUITE]]


def stan_posteriors():
    if SUITE == "large":  # those whose reference has been made
        return [p for p in LARGE if any(os.path.exists(os.path.join(d, "stan_reference", p + ".json"))
                                        for d in stan_dirs())]
    return sorted(f[:-5] for f in os.listdir(os.path.join(stan_dirs()[0], "stan_reference")) if f.endswith(".json"))


def stan_reference(posterior: str) -> dict:
    for d in stan_dirs():
        path = os.path.join(d, "stan_reference", posterior + ".json")
        if os.path.exists(path):
            break
    else:
        sys.exit(f"{posterior}: no reference in {', '.join(SUITE_DIRS[SUITE])}")
    with open(path) as f:
        ref = json.load(f)
    ref["kind"] = "stan program"
    ref["program"] = os.path.join(d, "stan", ref["model"] + ".stan")
    ref["data_file"] = os.path.join(d, "data", ref["data"] + ".json")
    return ref


QUANTILES = (("q05", 0.05), ("q25", 0.25), ("q50", 0.5), ("q75", 0.75), ("q95", 0.95))
# Note [Heavy tails]: the order statistics at -+ WINDOW sds of the quantile's Beta (posterior: 1)
WINDOW = 4
HEAVY_KURTOSIS = 9.0  # Note [Heavy tails]: above it (t_5's) the sd is not checked where quantiles are
QUANTILE_ELEMENTS = 1 << 24  # the most torch.quantile takes: larger draws go a block of quantities at a time


def quantiles_and_mcse(draws, prob: float):
    """Each quantity's `prob` quantile of draws [S, C, K] (R's type 7, as posterior's quantile2) and
    its MCSE after posterior's mcse_quantile (Note [Heavy tails]): the ESS of the indicator x <= q
    over split chains (nmcmc's bulk-ESS of a two-valued quantity is that ESS: rank normalisation
    maps it affinely), then the spread of the order statistics at the mean -+ WINDOW sds of
    Beta(ESS p + 1, ESS (1 - p) + 1), divided by 2 WINDOW (posterior: its 16 and 84 % points, by 2).
    Returns two [K] tensors."""
    import nmcmc
    block = max(1, QUANTILE_ELEMENTS // max(1, draws[..., 0].numel()))
    if draws.shape[-1] > block:
        parts = [quantiles_and_mcse(draws[..., k:k + block], prob) for k in range(0, draws.shape[-1], block)]
        return torch.cat([q for q, _ in parts]), torch.cat([m for _, m in parts])
    x = draws.to(torch.float64)
    flat = x.reshape(-1, x.shape[-1])  # [S C, K]
    n = flat.shape[0]
    q = torch.quantile(flat, prob, dim=0)  # [K]
    indicator = (x <= q).to(torch.float64)
    ess = torch.as_tensor(nmcmc.summarise(indicator)["ess_bulk"], dtype=torch.float64)
    ess = torch.where(torch.isfinite(ess), ess, torch.full_like(ess, float(n)))  # a constant indicator
    a, b = ess * prob + 1, ess * (1 - prob) + 1
    centre = a / (a + b)
    spread = torch.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    ordered = flat.sort(dim=0).values
    lo = torch.clamp(torch.floor((centre - WINDOW * spread) * n).long(), 1, n) - 1
    hi = torch.clamp(torch.ceil((centre + WINDOW * spread) * n).long(), 1, n) - 1
    cols = torch.arange(x.shape[-1])
    return q, (ordered[hi, cols] - ordered[lo, cols]) / (2 * WINDOW)


def moments_check_named(summary: dict, ref: dict, draws, mcse_z: float = 5.0, sd_z: float = 5.0):
    """The moment checks of a run from a Stan program, by Stan's names: (passes, worst mean z,
    worst sd ratio, why, worst sd z). The sd's standard error: the run's mcse_sd and the
    reference's sd sqrt((kurtosis - 1) / (4 ESS)) combined, the kurtosis the reference's where it
    has one (the run's mcse_sd scaled up to it where the run's draws show less), else the run's
    draws' [S, C, K]; and where the reference has quantiles, each within mcse_z of the MCSEs
    combined (Note [Heavy tails])."""
    index = {p["name"]: k for k, p in enumerate(summary["parameters"])}
    worst_z, worst_sd, worst_zs, why = 0.0, 1.0, 0.0, []
    quantiles = {}  # key -> (the run's quantiles [K], their MCSEs [K]), where the reference has them
    for key, prob in QUANTILES:
        if key in ref and f"mcse_{key}" in ref:
            quantiles[key] = quantiles_and_mcse(draws, prob)
    for j, name in enumerate(ref["names"]):
        if name not in index:
            why.append(f"{name}: not in the run's output")
            continue
        k = index[name]
        p = summary["parameters"][k]
        if ref["sd"][j] == 0:  # a constant (e.g. a fixed element of a matrix)
            if abs(p["mean"] - ref["mean"][j]) > 1e-8 * (1 + abs(ref["mean"][j])):
                why.append(f"{name} {p['mean']:.4g} vs the constant {ref['mean'][j]:.4g}")
            continue
        ref_ess = ref["ess_bulk"][j] or ref["n"]
        z = abs(p["mean"] - ref["mean"][j]) / math.sqrt(p["mcse_mean"] ** 2 + ref["sd"][j] ** 2 / ref_ess)
        x = draws[:, :, k].reshape(-1).to(torch.float64)
        kurt = float(((x - x.mean()) ** 4).mean() / x.var(unbiased=False) ** 2)
        mcse_sd = p["mcse_sd"]
        if ref.get("kurtosis") and ref["kurtosis"][j] > kurt > 1:  # Note [Heavy tails]
            mcse_sd *= math.sqrt((ref["kurtosis"][j] - 1) / (kurt - 1))
            kurt = ref["kurtosis"][j]
        se_sd = math.sqrt(mcse_sd ** 2 + ref["sd"][j] ** 2 * (kurt - 1) / (4 * ref_ess))
        zs = abs(p["sd"] - ref["sd"][j]) / se_sd if se_sd > 0 else float("inf")
        if quantiles and ref.get("kurtosis") and ref["kurtosis"][j] > HEAVY_KURTOSIS:
            zs = 0.0  # Note [Heavy tails]: its quantiles are checked instead
        r = p["sd"] / ref["sd"][j]
        worst_z = max(worst_z, z)
        worst_zs = max(worst_zs, zs)
        if abs(r - 1) > abs(worst_sd - 1):
            worst_sd = r
        if z > mcse_z:
            why.append(f"{name} mean {p['mean']:.4g} vs {ref['mean'][j]:.4g} ({z:.1f} MCSE)")
        if zs > sd_z:
            why.append(f"{name} sd {p['sd']:.4g} vs {ref['sd'][j]:.4g} ({zs:.1f} se)")
        for key, (q, mcse_q) in quantiles.items():
            se = math.sqrt(float(mcse_q[k]) ** 2 + ref[f"mcse_{key}"][j] ** 2)
            zq = abs(float(q[k]) - ref[key][j]) / se if se > 0 else float("inf")
            if not zq <= mcse_z:
                why.append(f"{name} {key} {float(q[k]):.4g} vs {ref[key][j]:.4g} ({zq:.1f} MCSE)")
    return not why, worst_z, worst_sd, why, worst_zs


def widened_draws(draws, factor: float):
    """draws [S, C, K] with every quantity `factor` times as far from its mean: what widened() does
    to the summary, for the checks that read the draws (the quantiles)."""
    mean = draws.to(torch.float64).reshape(-1, draws.shape[-1]).mean(0)
    return mean + factor * (draws.to(torch.float64) - mean)


def widened(summary: dict, factor: float) -> dict:
    """The summary of the same draws with every quantity `factor` times as far from its mean: sd,
    mcse_mean and mcse_sd scaled (ESS, R-hat and the kurtosis do not change with the scale). The
    broken variant of `check --widened-must-fail`."""
    scaled = ("sd", "mcse_mean", "mcse_sd")
    return {**summary, "parameters": [{**q, **{k: q[k] * factor for k in scaled if q.get(k) is not None}}
                                      for q in summary["parameters"]]}


def worst_rhat_quantity(parameters: list):
    """The name of the quantity with the largest R-hat (None for none). R-hat is null (NaN) for a
    constant (sd 0: never the worst) and for a quantity whose chains did not move (the worst)."""
    def rhat_of(q):
        if q["rhat"] is not None and q["rhat"] == q["rhat"]:
            return q["rhat"]
        return float("inf") if q["sd"] > 0 else float("-inf")
    worst = max(parameters, key=rhat_of, default=None)
    return None if worst is None else worst["name"]


def convergence_misses(summary: dict) -> list:
    """What a run's summary misses of the suite's convergence rules: R-hat at most 1.01 and
    bulk-ESS at least 400 for every quantity."""
    misses = []
    if summary["max_rhat"] > 1.01:
        misses.append(f"R-hat {summary['max_rhat']:.3f}")
    if summary["min_ess_bulk"] < 400:
        misses.append(f"ESS too low ({summary['min_ess_bulk']:.0f})")
    return misses


def recheck(saved: list, suite: str) -> int:
    """The moment checks, R-hat and bulk-ESS of runs kept by `check --save-draws`, against each
    posterior's reference as it is now (a Stan program's run by name; exit 1 if any fails)."""
    global SUITE
    SUITE = suite
    failed = 0
    for path in saved:
        kept = torch.load(path)
        p, s, draws = kept["posterior"], kept["summary"], kept["draws"]
        if not kept["stan"]:
            raise SystemExit(f"{path}: recheck takes Stan programs' runs (check --suite ...)")
        ok, z, sd, why, zs = moments_check_named(s, stan_reference(p), draws)
        why = why + convergence_misses(s)
        ok = not why
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {p:42s} R-hat {s['max_rhat']:.3f}  ESS {s['min_ess_bulk']:6.0f}  "
              f"mean {z:4.1f} MCSE  sd x{sd:.3f} ({zs:.1f} se)  {'; '.join(why)}", flush=True)
    return 1 if failed else 0


def ports_vs_stan(only) -> int:
    """Each port against Stan's own density: U_port - U_stan constant and the gradients equal, at
    the reference draws (unconstrained, the port's order, which is Stan's)."""
    import nmcmc
    bad = 0
    for p in only or ports.PORTS:
        sref = stan_reference(p)
        t = nmcmc.stan_model(sref["program"], sref["data_file"], dtype="float64")
        x = torch.tensor(ports.reference(p)["draws"], dtype=torch.float64)
        if t.dim != x.shape[1]:
            print(f"FAIL {p:45s} the port has {x.shape[1]} coordinates, the Stan program {t.dim}")
            bad += 1
            continue
        u_stan, g_stan = t.energy_and_grad(x)
        xr = x.clone().requires_grad_(True)
        u_port = ports.module(p).double()(xr)
        g_port, = torch.autograd.grad(u_port.sum(), xr)
        du = (u_port.detach() - u_stan)
        spread = float((du - du.mean()).abs().max() / (1 + u_stan.abs().max()))
        g_err = float((g_port - g_stan).abs().max() / (1 + g_stan.abs().max()))
        # rounding only (an ill-conditioned GP Cholesky: ~1e-8); a wrong or missing term is O(1)
        ok = spread < 1e-6 and g_err < 1e-6
        bad += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {p:45s} D={t.dim:2d}  energy difference spread {spread:.1e}  "
              f"gradient difference {g_err:.1e}  (relative)")
    return 1 if bad else 0


def check(args) -> int:
    import nmcmc
    global SUITE
    SUITE = args.suite
    if args.suite != "posteriordb":  # Stan programs only
        args.stan = True
    if args.temper != 1.0 and args.stan:
        sys.exit("posteriordb.py: --temper tempers a port's energy (TorchScript); a Stan program's cannot be: "
                 "use --widened-must-fail for the broken variant there")
    if args.temper != 1.0 and args.widened_must_fail:
        sys.exit("posteriordb.py: give one broken variant, --temper or --widened-must-fail")
    if (args.program is None) != (args.data is None):
        sys.exit("posteriordb.py: give --program and --data together")
    if args.program and (not args.stan or not args.only or len(args.only) != 1):
        sys.exit("posteriordb.py: --program samples one posterior of a Stan suite: give --stan (or --suite) and one --only")
    rows, failed = [], 0
    for p in args.only or (stan_posteriors() if args.stan else ports.PORTS):
        ref = stan_reference(p) if args.stan else ports.reference(p)
        if args.program:  # the same posterior through another program: checked by its quantities' names
            for f in (args.program, args.data):
                if not os.path.isfile(f):
                    sys.exit(f"posteriordb.py: {f}: no such file")
            ref["program"], ref["data_file"] = args.program, args.data
        t0 = time.time()
        row = {"posterior": p, "dim": len(ref["names"]), "kind": ref["kind"], "sampler": args.sampler}
        if args.program:
            row["program"] = os.path.relpath(args.program, os.path.join(HERE, ".."))
        row["transport"] = args.transport or ("auto" if args.sampler == "learned" else "none")
        if args.sampler == "nuts":
            row["metric"] = args.metric + ("+" + args.transport if args.transport in ("flow", "auto") else "")
        try:
            ok, why = one(nmcmc, p, ref, row, args, t0)
        except Exception as e:  # a run that fails is a failed row, not the end of the suite
            ok, why = False, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
            row.update({"seconds": time.time() - t0})
            print(f"FAIL {p:42s} {why[0]}", flush=True)
        row["passes"], row["why"] = ok, why
        failed += 0 if ok else 1
        rows.append(row)
        if args.json:  # after each posterior: a long run that is stopped keeps what it measured
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(f"{len(rows) - failed} of {len(rows)} posteriors pass")
    if args.temper != 1.0:  # the broken variant: every posterior must fail on its moments
        caught = [r for r in rows if any(" sd " in w or " mean " in w for w in r["why"])]
        print(f"the tempered energy (x{args.temper}) caught by the moment checks on {len(caught)} of {len(rows)}")
        return 0 if len(caught) == len(rows) else 1
    if args.widened_must_fail:  # the broken variant beside each run: every widened one must fail
        caught = [r for r in rows if r.get("widened_caught")]
        print(f"the spread widened x{args.widened_must_fail} caught by the moment checks on {len(caught)} of {len(rows)}")
        if len(caught) < len(rows):
            return 1
    return 1 if failed else 0


def one(nmcmc, p, ref, row, args, t0):
    """Samples one posterior as `check` says; fills `row`; returns (passes, why)."""
    if args.stan:
        target = nmcmc.stan_model(ref["program"], ref["data_file"], dtype=args.dtype)
        row["dim"] = target.dim
        row["compile_seconds"] = time.time() - t0  # 0 from the cache
        t0 = time.time()
    else:
        target = nmcmc.from_module(scripted(p, args.temper), dtype=args.dtype)
    fixed_grads = fixed_seconds = 0.0  # warm-up, preconditioner and training: paid before sampling
    if args.sampler == "nuts":
        run = nmcmc.sample(target, "nuts", chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed,
                           metric=args.metric, transport=args.transport or "none",
                           transport_rounds=args.transport_rounds, transport_layers=args.transport_layers,
                           target_accept=args.target_accept, step_size_per_chain=args.step_size_per_chain or None,
                           progress=args.progress)
    else:
        batch = json.loads(nmcmc._C.default_train_config())["train"]["batch"]
        # --seed seeds training too (train.seed; 1, nmcmc train's default, at --seed 1)
        model = nmcmc.train(target, progress=args.progress, steps=args.steps, dtype=args.dtype, transport=args.transport,
                            options={"seed": args.seed}, ess=args.ess)
        tr = model.training
        pre = tr.get("preconditioner") or {}
        if "from_the_box" in pre:  # Note [The transported warm-up starts at the posterior]: it ran again
            row["transport_again"] = {"from_the_box_last_fit": pre["from_the_box"].get("last_fit_loss"),
                                      "grads": pre["from_the_box"].get("grads"),
                                      "arrival_grads": (pre.get("arrival") or {}).get("grads", 0)}
        if "auto" in pre:  # Note [Choosing the transport]: what it measured and chose
            row["transport"] = "auto:" + pre["auto"]["chose"]
            row["fisher_per_dim"] = pre["auto"]["fisher_per_dim"]
        row.update({"training_seconds": time.time() - t0, "training_steps": tr["steps"], "stopped": tr.get("stopped"),
                    "preconditioner_grads": pre.get("grads", 0), "preconditioner_seconds": pre.get("seconds", 0.0),
                    "training_grads": tr["grads"] * batch, "training_loop_seconds": tr["seconds"]})
        check = tr.get("check") or {}  # Note [The mixing check]: paid before sampling too
        row["mixing_check"] = check
        row["time_extensions"] = tr.get("time_extensions", [])  # their seconds are in tr["seconds"]
        fixed_grads += pre.get("grads", 0) + tr["grads"] * batch + check.get("grads", 0)
        fixed_grads += sum(c.get("grads", 0) for c in row["time_extensions"])
        fixed_grads += sum(p.get("grads", 0) for p in tr.get("probes", []))  # their seconds are in tr["seconds"]
        fixed_seconds += pre.get("seconds", 0.0) + tr["seconds"] + check.get("seconds", 0.0)
        run = nmcmc.sample(sampler="learned", model=model, chains=args.chains, warmup=args.warmup,
                           draws=args.draws, seed=args.seed, persistence=args.persistence, thin=args.thin,
                           progress=args.progress)
        row["persistence"] = run.config.get("persistence", 0.0)
        row["thin"] = run.summary.get("thin", 1)  # Note [The learned sampler's thinning]
    s = run.summary
    chains = s["chains"]
    sampling_grads = s["grads_per_step"] * s["draws"] * chains
    fixed_grads += s["grads_warmup_per_chain"] * chains
    fixed_seconds += s["seconds_warmup"]
    ess = s["min_ess_bulk"]
    row.update({"fixed_grads": fixed_grads, "fixed_seconds": fixed_seconds, "sampling_grads": sampling_grads,
                "sampling_seconds": s["seconds_sampling"],
                "ess_bulk_per_second": ess / s["seconds_sampling"],
                "allin_ess_per_grad": ess / (fixed_grads + sampling_grads),
                "allin_ess_per_second": ess / (fixed_seconds + s["seconds_sampling"])})
    for goal in (1000, 10000):  # the cost of `goal` effective draws: the fixed part + goal at the sampling rate
        row[f"grads_for_{goal}"] = fixed_grads + goal * sampling_grads / ess
        row[f"seconds_for_{goal}"] = fixed_seconds + goal * s["seconds_sampling"] / ess
    if args.sampler == "nuts" and isinstance(s.get("transport"), dict) and "auto" in s["transport"]:
        auto = s["transport"]["auto"]  # Note [Choosing the transport]: what the warm-up measured, and which ran
        row["transport"] = "auto:" + auto["chose"]
        row["fisher_per_dim"] = auto["fisher_per_dim"]
    if isinstance(s.get("transport"), dict) and "choice" in s["transport"]:
        choice = s["transport"]["choice"]
        row["transport_choice"] = choice.get("chosen")  # flow or affine
        row["transport_final_metric"] = choice.get("final_metric")
        row["transport_latent_residual"] = choice.get("latent_residual")  # Note [A linear residual in the latent space]
        if isinstance(choice.get("flow"), dict) and isinstance(choice.get("affine"), dict):
            row["transport_scores"] = {k: choice[k].get("score") for k in ("flow", "affine")}
            row["transport_trial_divergent"] = {k: choice[k].get("divergent") for k in ("flow", "affine")}
            row["transport_trial_cost"] = {k: choice[k].get("cost") for k in ("flow", "affine")}
            row["transport_affine_loss"] = choice.get("affine_loss")
        row["transport_rounds_detail"] = [{"grads_per_chain": r.get("grads_per_chain"), "step_size": r.get("step_size"),
                                           "loss_start": r.get("fit", {}).get("loss_start"),
                                           "loss_end": r.get("fit", {}).get("loss_end"), "transient": r.get("transient")}
                                          for r in s["transport"].get("rounds", [])]
        if "restarted" in s["transport"]:  # Note [Far out twice]
            row["transport_restarted"] = s["transport"]["restarted"]
    def moments(summary, draws):  # a Stan program's quantities by name, a port's in order
        return moments_check_named(summary, ref, draws) if args.stan else moments_check(summary, ref)
    ok, z, sd, why, zs = moments(s, run.draws)
    if args.save_draws:  # for `recheck` against a reference made again (the check's own inputs)
        os.makedirs(args.save_draws, exist_ok=True)
        torch.save({"posterior": p, "summary": s, "draws": run.draws, "stan": bool(args.stan)},
                   os.path.join(args.save_draws, f"{p}.pt"))
    if args.widened_must_fail:  # the broken variant: the same draws, each quantity F times as far from its mean
        f = args.widened_must_fail
        check_wide = moments(widened(s, f), widened_draws(run.draws, f))
        row["widened_caught"] = not check_wide[0]
        print(f"     {p:42s} its spread widened x{f}: {'caught' if row['widened_caught'] else 'NOT CAUGHT'} "
              f"(sd x{check_wide[2]:.3f}, {check_wide[4]:.1f} se)", flush=True)
    row.update({"seconds": time.time() - t0, "max_rhat": s["max_rhat"], "min_ess_bulk": s["min_ess_bulk"],
                "min_ess_tail": s.get("min_ess_tail"),
                "ess_bulk_per_grad": s.get("ess_bulk_per_grad"), "divergences": s["divergences"],
                "density_failures": s.get("density_failures", 0), "worst_mean_mcse": z, "worst_sd_ratio": sd,
                "worst_sd_se": zs})
    worst = worst_rhat_quantity(s["parameters"])
    if worst is not None:  # which quantity mixes worst: where a sampler that does not converge fails
        row["worst_rhat_quantity"] = worst
    why = why + convergence_misses(s)
    ok = ok and not why
    print(f"{'ok  ' if ok else 'FAIL'} {p:42s} D={row['dim']:2d} {row['seconds']:7.1f} s  R-hat {s['max_rhat']:.3f}  "
          f"ESS {s['min_ess_bulk']:6.0f}  /grad {row['ess_bulk_per_grad'] or float('nan'):.3g}  "
          f"mean {z:4.1f} MCSE  sd x{sd:.3f} ({zs:.1f} se)  {'; '.join(why)}", flush=True)
    return ok, why


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    e = sub.add_parser("export")
    e.add_argument("directory")
    e.add_argument("only", nargs="*")
    g = sub.add_parser("gradients")
    g.add_argument("only", nargs="*")
    c = sub.add_parser("check")
    c.add_argument("--sampler", choices=["nuts", "learned"], default="nuts")
    c.add_argument("--only", nargs="*")
    c.add_argument("--stan", action="store_true", help="posteriordb's Stan programs (all 46) instead of the ports")
    c.add_argument("--program", help="with one --only posterior: sample it through this Stan program (the same "
                   "posterior written another way, e.g. large/reference_stan/'s; its draws checked by name)")
    c.add_argument("--data", help="with --program: its data (JSON; scripts/large_reference_data.R writes a reference "
                   "program's)")
    c.add_argument("--suite", choices=["posteriordb", "gym", "large"], default="posteriordb",
                   help="gym: Inference Gym's posteriors with their published ground truth (inference_gym/; Stan programs); "
                        "large: the large suite, 26-670 parameters with a reference today (Note [The large suite]; Stan programs)")
    c.add_argument("--metric", default="diag",
                   help="nuts: diag (Stan's default), dense, fisher-diag or fisher-lowrank (from draws and gradients)")
    c.add_argument("--transport", choices=["none", "flow", "auto"], default=None,
                   help="nuts: sample through a flow fitted in warm-up (default none); learned: train and sample "
                        "in its latent space; auto (the learned sampler's default, nmcmc train's; for nuts "
                        "nmcmc sample's --transport auto): the flow where the affine map does not fit "
                        "(docs/transport.md)")
    c.add_argument("--transport-rounds", type=int, default=None, help="with --transport flow: the flow's fits in warm-up (default: nmcmc sample's)")
    c.add_argument("--transport-layers", type=int, default=None, help="with --transport flow: its coupling layers (default: nmcmc sample's)")
    c.add_argument("--chains", type=int, default=4)
    c.add_argument("--warmup", type=int, default=1000)
    c.add_argument("--target-accept", type=float, default=None, help="NUTS's step-size target (default: nmcmc's, 0.8)")
    c.add_argument("--step-size-per-chain", action="store_true",
                   help="NUTS: each chain adapts its own step size, as Stan (Note [A step size per chain]; default: one for all)")
    c.add_argument("--draws", type=int, default=1000)
    c.add_argument("--steps", type=int, default=None, help="learned: training steps (default: nmcmc train's)")
    c.add_argument("--persistence", type=float, default=None,
                   help="learned: its base draw's persistence in sampling (default: nmcmc sample's, 0.6)")
    c.add_argument("--thin", type=int, default=None,
                   help="learned: one draw kept in this many steps (default: nmcmc sample's, from its training's check)")
    c.add_argument("--ess", type=float, default=None,
                   help="learned: train.ess_goal, stop training once it no longer pays for this many effective draws")
    c.add_argument("--dtype", default="float64")
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--json")
    c.add_argument("--save-draws", metavar="DIR", default=None,
                   help="keep each run's draws and summary in DIR/POSTERIOR.pt, for `recheck`")
    c.add_argument("--progress", action="store_true",
                   help="training's and sampling's progress on stderr (phase, rate, ETA; a line every 10 s when "
                        "stderr is not a terminal): the large suite's runs take minutes to hours")
    c.add_argument("--temper", type=float, default=1.0,
                   help="the broken variant for the ports: sample the energy times this factor; exit 0 only if "
                        "every posterior then fails its moment checks")
    c.add_argument("--widened-must-fail", type=float, default=None, metavar="F",
                   help="the broken variant beside each run, Stan programs included: the same draws with every "
                        "quantity's spread about its mean taken F times the run's (1.118: as the energy tempered "
                        "by 0.8 widens a Gaussian) must fail the moment checks; exit 0 only if every run passes "
                        "and every widened one fails")
    rc = sub.add_parser("recheck", help="a run kept by check --save-draws against its reference as it is now")
    rc.add_argument("saved", nargs="+", help="DIR/POSTERIOR.pt files")
    rc.add_argument("--suite", choices=sorted(SUITE_DIRS), default="large")
    ps = sub.add_parser("ports-vs-stan")
    ps.add_argument("only", nargs="*")
    lt = sub.add_parser("large-table", help="the large suite's table (Note [The large suite]) and issue #64's goals")
    lt.add_argument("learned_json")
    lt.add_argument("flow_json", help="NUTS through the flow (check --transport flow); '-' if not run")
    lt.add_argument("nuts_jsons", nargs="+", help="NUTS runs without it, one per metric: the best is the yardstick")
    t = sub.add_parser("table")
    t.add_argument("nuts_json")
    t.add_argument("learned_json")
    t.add_argument("more_nuts_json", nargs="*", help="NUTS runs with other metrics: the best is the yardstick")
    mt = sub.add_parser("metrics")
    mt.add_argument("jsons", nargs="+", help="NUTS check --json runs, Stan's diagonal metric first")
    pr = sub.add_parser("pairs")
    pr.add_argument("directory", help="bench/posteriordb_pairs.sh's output")
    tt = sub.add_parser("transport")
    tt.add_argument("flow_json", help="a NUTS check --json run with --transport flow")
    tt.add_argument("nuts_jsons", nargs="+", help="NUTS runs without it (one per metric): the best is the yardstick")
    a = ap.parse_args()
    if a.cmd == "list":
        for p, (_d, _b, params, kind) in ports.PORTS.items():
            print(f"{p:45s} D = {len(params):2d}  {kind}")
    elif a.cmd == "recheck":
        return recheck(a.saved, a.suite)
    elif a.cmd == "export":
        export(a.directory, a.only)
    elif a.cmd == "gradients":
        bad = 0
        for p in a.only or ports.PORTS:
            z, z2 = gradient_z(p), second_moment_z(p)
            ok = bool(z.abs().max() < 5) and bool(z2.abs().max() < 5)
            bad += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'} {p:45s} max |z| of E[grad U] {z.abs().max().item():.2f}, "
                  f"of E[(x - m) grad U^T] - I {z2.abs().max().item():.2f}")
        return 1 if bad else 0
    elif a.cmd == "check":
        return check(a)
    elif a.cmd == "ports-vs-stan":
        return ports_vs_stan(a.only)
    elif a.cmd == "large-table":
        print(large_table(a.learned_json, a.flow_json, a.nuts_jsons), end="")
    elif a.cmd == "table":
        print(table([a.nuts_json] + a.more_nuts_json, a.learned_json), end="")
    elif a.cmd == "metrics":
        print(metrics_table(a.jsons), end="")
    elif a.cmd == "pairs":
        print(pairs_table(a.directory), end="")
    elif a.cmd == "transport":
        print(transport_table(a.flow_json, a.nuts_jsons), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
