#!/usr/bin/python3
"""Simulation-based calibration (Talts et al. 2018) of nmcmc's adaptive paths: warm-up, metric,
transport fits and training included, not only the fixed Markov kernel.

    sbc.py --model hier|logistic [--sampler nuts|learned] [--metric diag] [--transport none|flow]
           [--replicates N] [--broken] [--seed S]

For each replicate: parameters drawn from the prior, data simulated from them, the posterior
sampled as a user would (`nmcmc.sample` with warm-up, or `nmcmc.train` with its defaults and then
the learned sampler), the draws thinned to L = 99, and the rank of the true value among them
recorded (0..L). For a correct sampler each parameter's ranks are uniform: their counts in B bins
are tested with Pearson's chi-square. The exit status is 1 when any parameter's p-value is below
alpha / (parameters tested), alpha = 1e-3 by default: a correct sampler fails a run with
probability at most 1e-3 (Bonferroni over the parameters; each p-value exact up to the
chi-square approximation, 20 or more expected per bin).

--broken: the deliberately biased warm-up the test must catch: none at all, chains started at x = 5
in every coordinate (the first draws are the transient, the step size is not adapted): the exit
status is 0 only if some parameter fails (ctest runs it so). At 500 replicates it fails the
hierarchical model at p = 2.5e-6 (eta_1) and the logistic regression at p < 1e-24.

Models (both have exact priors to draw from and cheap simulations):
  hier      eight groups, non-centred: mu ~ N(0, 5^2), tau ~ half-N(0, 5^2), eta_j ~ N(0, 1),
            y_j ~ N(mu + tau eta_j, sigma_j) with eight schools' sigma_j; parameters (mu, log tau,
            eta_1..8), ranks of mu, log tau and eta_1
  logistic  30 observations, 3 coefficients beta ~ N(0, 1) (an intercept and two covariates drawn
            once from N(0, 1)), y_i ~ Bernoulli(sigmoid(x_i . beta)); ranks of all three
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
import nmcmc  # noqa: E402 (before torch: Note [OpenBLAS's kernels])
import torch  # noqa: E402

SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]


class Hier(torch.nn.Module):
    def __init__(self, y: torch.Tensor):
        super().__init__()
        self.register_buffer("y", y)
        self.register_buffer("sigma", torch.tensor(SIGMA, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [C, 10] -> U [C]
        mu, log_tau, eta = x[:, 0], x[:, 1], x[:, 2:]
        tau = torch.exp(log_tau)
        theta = mu.unsqueeze(1) + tau.unsqueeze(1) * eta
        like = 0.5 * (((self.y - theta) / self.sigma) ** 2).sum(-1)
        # half-normal(0, 5) on tau, with the Jacobian of tau = exp(log_tau)
        return like + 0.5 * (mu / 5.0) ** 2 + 0.5 * (tau / 5.0) ** 2 - log_tau + 0.5 * (eta ** 2).sum(-1)


def hier_draw(g):
    mu = torch.randn((), generator=g, dtype=torch.float64) * 5.0
    tau = torch.randn((), generator=g, dtype=torch.float64).abs() * 5.0
    eta = torch.randn(8, generator=g, dtype=torch.float64)
    y = mu + tau * eta + torch.randn(8, generator=g, dtype=torch.float64) * torch.tensor(SIGMA, dtype=torch.float64)
    truth = torch.cat([mu.view(1), tau.log().view(1), eta])
    return Hier(y), truth, [0, 1, 2], ["mu", "log_tau", "eta_1"]


class Logistic(torch.nn.Module):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        super().__init__()
        self.register_buffer("xs", x)
        self.register_buffer("ys", y)

    def forward(self, b: torch.Tensor) -> torch.Tensor:  # b [C, 3] -> U [C]
        eta = b @ self.xs.t()  # [C, N]
        # -log Bernoulli(y | sigmoid(eta)) = softplus(eta) - y eta
        return (torch.nn.functional.softplus(eta) - self.ys * eta).sum(-1) + 0.5 * (b ** 2).sum(-1)


_COVARIATES = torch.cat([torch.ones(30, 1, dtype=torch.float64),
                         torch.randn(30, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)], 1)


def logistic_draw(g):
    beta = torch.randn(3, generator=g, dtype=torch.float64)
    p = torch.sigmoid(_COVARIATES @ beta)
    y = (torch.rand(30, generator=g, dtype=torch.float64) < p).to(torch.float64)
    return Logistic(_COVARIATES, y), beta, [0, 1, 2], ["beta_0", "beta_1", "beta_2"]


MODELS = {"hier": hier_draw, "logistic": logistic_draw}
L = 99  # draws per replicate after thinning: ranks 0..99, ten bins of ten


def posterior_draws(args, module, dim, seed) -> torch.Tensor:
    """[L, D] thinned draws of one replicate's posterior, sampled as the options say."""
    target = nmcmc.from_module(torch.jit.script(module), dim=dim, dtype="float64")
    chains, per_chain = 4, 100  # 400 draws, every 4th kept (of the last 396): L = 99
    common = dict(chains=chains, draws=per_chain, seed=seed, progress=False)
    if args.broken:
        run = nmcmc.sample(target, "nuts", warmup=0, init_x=torch.full((1, dim), 5.0, dtype=torch.float64), **common)
    elif args.sampler == "nuts":
        run = nmcmc.sample(target, "nuts", warmup=args.warmup, metric=args.metric, transport=args.transport, **common)
    else:
        model = nmcmc.train(target, progress=False, dtype="float64", options={"seed": seed})
        run = nmcmc.sample(sampler="learned", model=model, warmup=args.warmup, **common)
    d = run.draws.to(torch.float64).reshape(-1, dim)  # chains interleaved: [S * C, D]
    return d[-4 * L::4]


def chi_square_p(counts: torch.Tensor) -> float:
    """Pearson's chi-square p-value of bin counts against equal bins."""
    n, b = float(counts.sum()), counts.numel()
    e = n / b
    stat = float(((counts - e) ** 2 / e).sum())
    return float(torch.special.gammaincc(torch.tensor((b - 1) / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=list(MODELS), required=True)
    ap.add_argument("--sampler", choices=["nuts", "learned"], default="nuts")
    ap.add_argument("--metric", default="diag")
    ap.add_argument("--transport", choices=["none", "flow"], default="none")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--broken", action="store_true")
    args = ap.parse_args()
    if (L + 1) % args.bins:
        sys.exit(f"--bins must divide {L + 1}")
    g = torch.Generator().manual_seed(args.seed)
    ranks, names, t0 = [], None, time.time()
    for r in range(args.replicates):
        module, truth, tested, names = MODELS[args.model](g)
        draws = posterior_draws(args, module, truth.numel(), args.seed * 100003 + r)
        ranks.append([int((draws[:, k] < truth[k]).sum()) for k in tested])
        if (r + 1) % 20 == 0 or r + 1 == args.replicates:
            el = time.time() - t0
            print(f"  {r + 1}/{args.replicates} replicates, {el:.0f} s, ETA {el / (r + 1) * (args.replicates - r - 1):.0f} s",
                  file=sys.stderr, flush=True)
    ranks = torch.tensor(ranks)  # [N, K]
    what = "biased warm-up (none, from x = 5)" if args.broken else (
        f"{args.sampler}" + (f" metric {args.metric}" if args.sampler == "nuts" else " (train's defaults)") +
        (f" transport {args.transport}" if args.transport != "none" else ""))
    print(f"SBC, {args.model}, {what}: {args.replicates} replicates, {L} draws each, {args.bins} bins")
    threshold = args.alpha / len(names)
    failed = 0
    for k, name in enumerate(names):
        counts = torch.bincount(ranks[:, k] * args.bins // (L + 1), minlength=args.bins).to(torch.float64)
        p = chi_square_p(counts)
        bad = p < threshold
        failed += bad
        print(f"{'FAIL' if bad else 'ok  '} {name:8s} chi-square p = {p:.3g} (threshold {threshold:.2g})  "
              f"counts {counts.to(torch.int64).tolist()}")
    if args.broken:
        print("the biased warm-up " + ("is caught" if failed else "is NOT caught"))
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
