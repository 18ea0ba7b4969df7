"""posteriordb's reference posteriors as nmcmc targets: each a torch.nn.Module whose forward maps
x [C, D] on the unconstrained scale to U(x) = -(log p(constrained(x)) + log|Jacobian|) [C], as
Stan's model block writes it (constants dropped, as Stan's `~` drops them).

The models are ports of posteriordb's Stan programs (stan-dev/posteriordb, BSD-3-Clause, see
LICENCE.md and README.md in this directory); the data and the reference draws are posteriordb's.

Each port declares its parameters as (posteriordb name, transform):
  "id"      real                    x = v
  "log"     real<lower=0>           x = log v
  "logit"   real<lower=0, upper=1>  x = logit v
  "gap"     ordered[2]'s 2nd        x = log(v - previous)   (the previous one is an "id")
  "garch"   beta1 in (0, 1-alpha1)  x = logit(beta1 / (1 - alpha1))
and `unconstrain` maps posteriordb's constrained draws to x with the same transforms.
Used by scripts/posteriordb.py (export to TorchScript, checks) and the tests.
"""
import json
import math
import os
from typing import Dict, List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
LOG_2PI = math.log(2.0 * math.pi)


def _t(v) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


def normal_lpdf(y: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Elementwise, with log sigma (Stan keeps it when sigma is a parameter); no 2 pi."""
    z = (y - mu) / sigma
    return -0.5 * z * z - torch.log(sigma)


def softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


def logit_jacobian(x: torch.Tensor) -> torch.Tensor:
    """log|d sigmoid(x)/dx| = log s + log(1 - s)."""
    return -softplus(-x) - softplus(x)


class ArK(torch.nn.Module):
    """arK-arK: AR(5) time series, 7 parameters."""

    def __init__(self, d: dict):
        super().__init__()
        k, t = d["K"], d["T"]
        y = _t(d["y"])
        lags = torch.stack([y[k - j - 1:t - j - 1] for j in range(k)], 1)  # [T-K, K]: y[t-1-j]
        self.register_buffer("lags", lags)
        self.register_buffer("target", y[k:])
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = x[:, 0]
        beta = x[:, 1:1 + self.k]
        sigma = torch.exp(x[:, 1 + self.k])
        lp = -0.5 * (alpha / 10.0) ** 2 - 0.5 * ((beta / 10.0) ** 2).sum(-1)
        lp = lp - torch.log1p((sigma / 2.5) ** 2)  # cauchy(0, 2.5)
        mu = alpha.unsqueeze(1) + beta @ self.lags.t()  # [C, T-K]
        lp = lp + normal_lpdf(self.target.unsqueeze(0), mu, sigma.unsqueeze(1)).sum(-1)
        return -(lp + x[:, 1 + self.k])


class Arma11(torch.nn.Module):
    """arma-arma11: ARMA(1, 1), 4 parameters; a 200-step recursion."""

    def __init__(self, d: dict):
        super().__init__()
        self.register_buffer("y", _t(d["y"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, phi, theta = x[:, 0], x[:, 1], x[:, 2]
        sigma = torch.exp(x[:, 3])
        lp = -0.5 * (mu / 10.0) ** 2 - 0.5 * (phi / 2.0) ** 2 - 0.5 * (theta / 2.0) ** 2
        lp = lp - torch.log1p((sigma / 2.5) ** 2)
        err = self.y[0] - (mu + phi * mu)
        ss = err * err
        for t in range(1, self.y.size(0)):
            err = self.y[t] - (mu + phi * self.y[t - 1] + theta * err)
            ss = ss + err * err
        lp = lp - 0.5 * ss / (sigma * sigma) - float(self.y.size(0)) * torch.log(sigma)
        return -(lp + x[:, 3])


class Garch11(torch.nn.Module):
    """garch-garch11: GARCH(1, 1) volatility, 4 constrained parameters; a 200-step recursion."""

    def __init__(self, d: dict):
        super().__init__()
        self.register_buffer("y", _t(d["y"]))
        self.sigma1 = float(d["sigma1"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x[:, 0]
        alpha0 = torch.exp(x[:, 1])
        alpha1 = torch.sigmoid(x[:, 2])
        beta1 = (1.0 - alpha1) * torch.sigmoid(x[:, 3])
        # log Jacobian: alpha0 = exp, alpha1 = sigmoid, beta1 = (1 - alpha1) sigmoid
        logj = x[:, 1] + logit_jacobian(x[:, 2]) + torch.log1p(-alpha1) + logit_jacobian(x[:, 3])
        sigma = torch.full_like(mu, self.sigma1)
        lp = normal_lpdf(self.y[0], mu, sigma)
        for t in range(1, self.y.size(0)):
            r = self.y[t - 1] - mu
            sigma = torch.sqrt(alpha0 + alpha1 * r * r + beta1 * sigma * sigma)
            lp = lp + normal_lpdf(self.y[t], mu, sigma)
        return -(lp + logj)


class EightSchoolsNoncentered(torch.nn.Module):
    """eight_schools-eight_schools_noncentered: hierarchical, 10 parameters."""

    def __init__(self, d: dict):
        super().__init__()
        self.register_buffer("y", _t(d["y"]))
        self.register_buffer("sigma", _t(d["sigma"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta_trans = x[:, :8]
        mu = x[:, 8]
        tau = torch.exp(x[:, 9])
        theta = theta_trans * tau.unsqueeze(1) + mu.unsqueeze(1)
        lp = -0.5 * (theta_trans ** 2).sum(-1)
        lp = lp - 0.5 * (((self.y - theta) / self.sigma) ** 2).sum(-1)
        lp = lp - 0.5 * (mu / 5.0) ** 2 - torch.log1p((tau / 5.0) ** 2)
        return -(lp + x[:, 9])


class LinearRegression(torch.nn.Module):
    """y ~ normal(X beta, sigma) with normal priors on beta (scale inf: flat) and a prior on sigma:
    kilpisjarvi, kidiq, earnings, mesquite, nes, sblrc (blr)."""

    def __init__(self, design: torch.Tensor, y: torch.Tensor, beta_mean: List[float], beta_scale: List[float],
                 sigma_prior: str, sigma_scale: float):
        super().__init__()
        self.register_buffer("design", design)  # [N, K]
        self.register_buffer("y", y)
        self.register_buffer("beta_mean", _t(beta_mean))
        self.register_buffer("beta_prec", _t([0.0 if math.isinf(s) else 1.0 / s for s in beta_scale]))
        self.sigma_prior = sigma_prior  # flat | cauchy | normal
        self.sigma_scale = float(sigma_scale)
        self.k = design.size(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beta = x[:, :self.k]
        sigma = torch.exp(x[:, self.k])
        lp = -0.5 * (((beta - self.beta_mean) * self.beta_prec) ** 2).sum(-1)
        if self.sigma_prior == "cauchy":
            lp = lp - torch.log1p((sigma / self.sigma_scale) ** 2)
        elif self.sigma_prior == "normal":
            lp = lp - 0.5 * (sigma / self.sigma_scale) ** 2
        resid = self.y.unsqueeze(0) - beta @ self.design.t()  # [C, N]
        n = float(self.y.size(0))
        lp = lp - 0.5 * (resid * resid).sum(-1) / (sigma * sigma) - n * torch.log(sigma)
        return -(lp + x[:, self.k])


class GpRegr(torch.nn.Module):
    """gp_pois_regr-gp_regr: a Gaussian process regression's 3 hyper-parameters. Its Cholesky
    factorisation fails where the kernel matrix is not numerically positive definite: the module
    then raises, as Stan's does (nmcmc rejects those points: Note [A density may fail])."""

    def __init__(self, d: dict):
        super().__init__()
        xs = _t(d["x"])
        self.register_buffer("sq", (xs.unsqueeze(0) - xs.unsqueeze(1)) ** 2)
        self.register_buffer("y", _t(d["y"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rho, alpha, sigma = torch.exp(x[:, 0]), torch.exp(x[:, 1]), torch.exp(x[:, 2])
        n = self.y.size(0)
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        cov = (alpha * alpha).view(-1, 1, 1) * torch.exp(-0.5 * self.sq / (rho * rho).view(-1, 1, 1)) + \
            sigma.view(-1, 1, 1) * eye
        chol = torch.linalg.cholesky(cov)  # raises where cov is not positive definite
        z = torch.linalg.solve_triangular(chol, self.y.view(1, -1, 1).expand(x.size(0), n, 1), upper=False)
        lp = -0.5 * (z * z).sum((1, 2)) - torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(-1)
        # priors: rho ~ gamma(25, 4), alpha ~ normal(0, 2), sigma ~ normal(0, 1)
        lp = lp + 24.0 * torch.log(rho) - 4.0 * rho - 0.5 * (alpha / 2.0) ** 2 - 0.5 * sigma * sigma
        return -(lp + x[:, 0] + x[:, 1] + x[:, 2])


class GpPoisRegr(torch.nn.Module):
    """gp_pois_regr-gp_pois_regr: a latent Gaussian process with Poisson counts, 13 parameters."""

    def __init__(self, d: dict):
        super().__init__()
        xs = _t(d["x"])
        self.register_buffer("sq", (xs.unsqueeze(0) - xs.unsqueeze(1)) ** 2)
        self.register_buffer("k", _t(d["k"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rho, alpha = torch.exp(x[:, 0]), torch.exp(x[:, 1])
        f_tilde = x[:, 2:]
        n = f_tilde.size(1)
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        cov = (alpha * alpha).view(-1, 1, 1) * torch.exp(-0.5 * self.sq / (rho * rho).view(-1, 1, 1)) + 1e-10 * eye
        chol = torch.linalg.cholesky(cov)
        f = (chol @ f_tilde.unsqueeze(2)).squeeze(2)
        lp = 24.0 * torch.log(rho) - 4.0 * rho - 0.5 * (alpha / 2.0) ** 2 - 0.5 * (f_tilde * f_tilde).sum(-1)
        lp = lp + (self.k * f - torch.exp(f)).sum(-1)  # poisson_log, constants dropped
        return -(lp + x[:, 0] + x[:, 1])


class LowDimGaussMix(torch.nn.Module):
    """low_dim_gauss_mix-low_dim_gauss_mix: a two-component normal mixture, 5 parameters (ordered
    means, two scales, the weight)."""

    def __init__(self, d: dict):
        super().__init__()
        self.register_buffer("y", _t(d["y"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu1 = x[:, 0]
        mu2 = x[:, 0] + torch.exp(x[:, 1])
        s1, s2 = torch.exp(x[:, 2]), torch.exp(x[:, 3])
        theta = torch.sigmoid(x[:, 4])
        lp = -0.5 * (s1 / 2.0) ** 2 - 0.5 * (s2 / 2.0) ** 2 - 0.5 * (mu1 / 2.0) ** 2 - 0.5 * (mu2 / 2.0) ** 2
        lp = lp + 4.0 * torch.log(theta) + 4.0 * torch.log1p(-theta)  # beta(5, 5)
        y = self.y.unsqueeze(0)
        a = torch.log(theta).unsqueeze(1) + normal_lpdf(y, mu1.unsqueeze(1), s1.unsqueeze(1))
        b = torch.log1p(-theta).unsqueeze(1) + normal_lpdf(y, mu2.unsqueeze(1), s2.unsqueeze(1))
        lp = lp + torch.logsumexp(torch.stack([a, b], 0), 0).sum(-1)
        return -(lp + x[:, 1] + x[:, 2] + x[:, 3] + logit_jacobian(x[:, 4]))


class Diamonds(torch.nn.Module):
    """diamonds-diamonds: a 26-parameter linear regression with strongly correlated coefficients."""

    def __init__(self, d: dict):
        super().__init__()
        xm = _t(d["X"])[:, 1:]
        self.register_buffer("xc", xm - xm.mean(0, keepdim=True))
        self.register_buffer("y", _t(d["Y"]))
        self.kc = xm.size(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x[:, :self.kc]
        intercept = x[:, self.kc]
        sigma = torch.exp(x[:, self.kc + 1])
        lp = -0.5 * (b * b).sum(-1)
        lp = lp - 2.0 * torch.log1p(((intercept - 8.0) / 10.0) ** 2 / 3.0)  # student_t(3, 8, 10)
        lp = lp - 2.0 * torch.log1p((sigma / 10.0) ** 2 / 3.0)  # half student_t(3, 0, 10)
        resid = self.y.unsqueeze(0) - intercept.unsqueeze(1) - b @ self.xc.t()
        n = float(self.y.size(0))
        lp = lp - 0.5 * (resid * resid).sum(-1) / (sigma * sigma) - n * torch.log(sigma)
        return -(lp + x[:, self.kc + 1])


INF = float("inf")


def _regression(design_columns, y, beta_mean, beta_scale, sigma_prior, sigma_scale):
    design = torch.stack([_t(c) for c in design_columns], 1)
    return LinearRegression(design, _t(y), beta_mean, beta_scale, sigma_prior, sigma_scale)


def _kilpisjarvi(d):
    return _regression([[1.0] * d["N"], d["x"]], d["y"], [d["pmualpha"], d["pmubeta"]], [d["psalpha"], d["psbeta"]],
                       "flat", 1.0)


def _kidiq_momiq(d):
    return _regression([[1.0] * d["N"], d["mom_iq"]], d["kid_score"], [0, 0], [INF, INF], "cauchy", 2.5)


def _kidiq_interaction(d):
    inter = [h * q for h, q in zip(d["mom_hs"], d["mom_iq"])]
    return _regression([[1.0] * d["N"], d["mom_hs"], d["mom_iq"], inter], d["kid_score"], [0] * 4, [INF] * 4,
                       "cauchy", 2.5)


def _logearn_height(d):
    return _regression([[1.0] * d["N"], d["height"]], [math.log(e) for e in d["earn"]], [0, 0], [INF, INF], "flat", 1.0)


def _mesquite_logvolume(d):
    vol = [math.log(a * b * c) for a, b, c in zip(d["diam1"], d["diam2"], d["canopy_height"])]
    return _regression([[1.0] * d["N"], vol], [math.log(w) for w in d["weight"]], [0, 0], [INF, INF], "flat", 1.0)


def _mesquite_logvash(d):
    vol = [math.log(a * b * c) for a, b, c in zip(d["diam1"], d["diam2"], d["canopy_height"])]
    area = [math.log(a * b) for a, b in zip(d["diam1"], d["diam2"])]
    shape = [math.log(a / b) for a, b in zip(d["diam1"], d["diam2"])]
    height = [math.log(h) for h in d["total_height"]]
    return _regression([[1.0] * d["N"], vol, area, shape, height, d["group"]], [math.log(w) for w in d["weight"]],
                       [0] * 6, [INF] * 6, "flat", 1.0)


def _nes(d):
    age = d["age_discrete"]
    cols = [[1.0] * d["N"], d["real_ideo"], d["race_adj"], [float(a == 2) for a in age], [float(a == 3) for a in age],
            [float(a == 4) for a in age], d["educ1"], d["gender"], d["income"]]
    return _regression(cols, d["partyid7"], [0] * 9, [INF] * 9, "flat", 1.0)


def _blr(d):
    cols = [[row[j] for row in d["X"]] for j in range(d["D"])]
    return _regression(cols, d["y"], [0] * d["D"], [10.0] * d["D"], "normal", 10.0)


def _vector(name: str, n: int, transform: str = "id") -> List[Tuple[str, str]]:
    return [(f"{name}[{i + 1}]", transform) for i in range(n)]


# name -> (data name, builder, parameters [(posteriordb name, transform)], kind)
PORTS: Dict[str, tuple] = {
    "arK-arK": ("arK", ArK, [("alpha", "id")] + _vector("beta", 5) + [("sigma", "log")], "time series"),
    "arma-arma11": ("arma", Arma11, [("mu", "id"), ("phi", "id"), ("theta", "id"), ("sigma", "log")], "time series"),
    "garch-garch11": ("garch", Garch11, [("mu", "id"), ("alpha0", "log"), ("alpha1", "logit"), ("beta1", "garch")],
                      "time series"),
    "eight_schools-eight_schools_noncentered": (
        "eight_schools", EightSchoolsNoncentered, _vector("theta_trans", 8) + [("mu", "id"), ("tau", "log")],
        "hierarchical"),
    "kilpisjarvi_mod-kilpisjarvi": ("kilpisjarvi_mod", _kilpisjarvi, [("alpha", "id"), ("beta", "id"), ("sigma", "log")],
                                    "correlated regression"),
    "kidiq-kidscore_momiq": ("kidiq", _kidiq_momiq, _vector("beta", 2) + [("sigma", "log")], "regression"),
    "kidiq-kidscore_interaction": ("kidiq", _kidiq_interaction, _vector("beta", 4) + [("sigma", "log")],
                                   "correlated regression"),
    "earnings-logearn_height": ("earnings", _logearn_height, _vector("beta", 2) + [("sigma", "log")],
                                "correlated regression"),
    "mesquite-logmesquite_logvolume": ("mesquite", _mesquite_logvolume, _vector("beta", 2) + [("sigma", "log")],
                                       "regression"),
    "mesquite-logmesquite_logvash": ("mesquite", _mesquite_logvash, _vector("beta", 6) + [("sigma", "log")],
                                     "regression"),
    "nes1972-nes": ("nes1972", _nes, _vector("beta", 9) + [("sigma", "log")], "regression"),
    "sblrc-blr": ("sblrc", _blr, _vector("beta", 5) + [("sigma", "log")], "correlated regression"),
    "diamonds-diamonds": ("diamonds", Diamonds, _vector("b", 24) + [("Intercept", "id"), ("sigma", "log")],
                          "correlated regression"),
    "gp_pois_regr-gp_regr": ("gp_pois_regr", GpRegr, [("rho", "log"), ("alpha", "log"), ("sigma", "log")],
                             "Gaussian process"),
    "gp_pois_regr-gp_pois_regr": ("gp_pois_regr", GpPoisRegr,
                                  [("rho", "log"), ("alpha", "log")] + _vector("f_tilde", 11),
                                  "Gaussian process, Poisson GLM"),
    "low_dim_gauss_mix-low_dim_gauss_mix": ("low_dim_gauss_mix", LowDimGaussMix,
                                            [("mu[1]", "id"), ("mu[2]", "gap"), ("sigma[1]", "log"),
                                             ("sigma[2]", "log"), ("theta", "logit")], "mixture"),
}

_PREFIX = {"id": "", "log": "log_", "logit": "logit_", "gap": "log_gap_", "garch": "logit_scaled_"}


def names(posterior: str) -> List[str]:
    """The unconstrained coordinates' names: posteriordb's, with the transform as a prefix."""
    return [_PREFIX[t] + n for n, t in PORTS[posterior][2]]


def data(posterior: str) -> dict:
    with open(os.path.join(HERE, "data", PORTS[posterior][0] + ".json")) as f:
        return json.load(f)


def module(posterior: str) -> torch.nn.Module:
    """The port with its data, float64."""
    return PORTS[posterior][1](data(posterior)).double()


def _derived(posterior: str, draws: Dict[str, List[float]]) -> Dict[str, List[float]]:
    """Parameters posteriordb's draws hold only through a transformed parameter: the non-centred
    eight schools' theta_trans = (theta - mu) / tau, the latent GP's f_tilde = L^-1 f."""
    draws = dict(draws)
    if posterior == "eight_schools-eight_schools_noncentered":
        mu, tau = _t(draws["mu"]), _t(draws["tau"])
        for i in range(1, 9):
            draws[f"theta_trans[{i}]"] = ((_t(draws[f"theta[{i}]"]) - mu) / tau).tolist()
    if posterior == "gp_pois_regr-gp_pois_regr":
        sq = (lambda xs: (xs.unsqueeze(0) - xs.unsqueeze(1)) ** 2)(_t(data(posterior)["x"]))
        rho, alpha = _t(draws["rho"]), _t(draws["alpha"])
        f = torch.stack([_t(draws[f"f[{i}]"]) for i in range(1, 12)], 1)
        cov = (alpha ** 2).view(-1, 1, 1) * torch.exp(-0.5 * sq / (rho ** 2).view(-1, 1, 1)) + 1e-10 * torch.eye(11)
        f_tilde = torch.linalg.solve_triangular(torch.linalg.cholesky(cov), f.unsqueeze(2), upper=False).squeeze(2)
        for i in range(11):
            draws[f"f_tilde[{i + 1}]"] = f_tilde[:, i].tolist()
    return draws


def unconstrain(posterior: str, draws: Dict[str, List[float]]) -> torch.Tensor:
    """posteriordb's constrained draws (name -> values) as x [n, D]."""
    draws = _derived(posterior, draws)
    cols = []
    for name, transform in PORTS[posterior][2]:
        v = _t(draws[name])
        if transform == "log":
            v = torch.log(v)
        elif transform == "logit":
            v = torch.logit(v)
        elif transform == "gap":
            prev = name.split("[")[0] + "[" + str(int(name.split("[")[1][:-1]) - 1) + "]"
            v = torch.log(v - _t(draws[prev]))
        elif transform == "garch":
            v = torch.logit(v / (1.0 - _t(draws["alpha1"])))
        cols.append(v)
    return torch.stack(cols, 1)


def reference(posterior: str) -> dict:
    """names, mean, sd (all reference draws, unconstrained), draws (a thinned set, [n, D]), ess."""
    with open(os.path.join(HERE, "reference", posterior + ".json")) as f:
        return json.load(f)
