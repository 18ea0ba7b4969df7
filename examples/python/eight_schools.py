#!/usr/bin/python3
"""A hierarchical model written in PyTorch, trained and sampled from Python, checked against
posteriordb's reference posterior for the same model (Stan, 10 chains x 10,000 thinned draws; in
posteriordb/reference), with NUTS beside it for efficiency. The model: eight schools (Rubin 1981; Gelman et al., BDA sec. 5.5), non-centred:

    y_j ~ N(mu + tau * eta_j, sigma_j),  eta_j ~ N(0, 1),  mu ~ N(0, 5^2),  tau ~ HalfCauchy(0, 5)

sampled in (mu, log tau, eta.1..8). Run from the repository root after `make build`:

    PYTHONPATH=build/python /usr/bin/python3 examples/python/eight_schools.py [--quick]

It exits non-zero when the learned sampler's means or standard deviations disagree with the
reference beyond their standard errors.
"""
import json
import math
import os
import sys
import time

import torch

import nmcmc


def eight_schools(x: torch.Tensor) -> torch.Tensor:  # x [C, 10] -> U(x) [C]
    y = torch.tensor([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], dtype=x.dtype)
    sigma = torch.tensor([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], dtype=x.dtype)
    mu, log_tau, eta = x[:, 0], x[:, 1], x[:, 2:]
    tau = torch.exp(log_tau)
    theta = mu.unsqueeze(1) + tau.unsqueeze(1) * eta
    likelihood = 0.5 * (((y - theta) / sigma) ** 2).sum(-1)
    prior = 0.5 * (mu / 5.0) ** 2 + torch.log1p((tau / 5.0) ** 2) - log_tau + 0.5 * (eta ** 2).sum(-1)
    return likelihood + prior


def main(quick: bool) -> int:
    names = ["mu", "log_tau"] + [f"eta.{j}" for j in range(1, 9)]
    target = nmcmc.from_function(eight_schools, dim=10, names=names)

    t0 = time.time()
    model = nmcmc.train(target, steps=1000 if quick else 2000, batch=256,
                        model={"hidden": 64}, options={"lr": 1e-3})
    print(f"trained {model.steps} steps in {time.time() - t0:.0f} s: {model}")

    learned = nmcmc.sample(target, "learned", model=model, chains=16, warmup=200, draws=2000 if quick else 3000,
                           seed=2, progress=False)
    nuts = nmcmc.sample(target, "nuts", chains=4, warmup=1000, draws=1000, seed=3, progress=False)
    print("learned sampler:\n" + str(learned))
    print("NUTS:\n" + str(nuts))

    # posteriordb's reference: the same parameters (theta_trans = eta, log_tau), 10,000 draws.
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "posteriordb", "reference",
                           "eight_schools-eight_schools_noncentered.json")) as f:
        ref = json.load(f)
    index = {n.replace("theta_trans[", "eta.").rstrip("]"): k for k, n in enumerate(ref["names"])}
    ok = True
    print(f"{'param':>8} {'learned':>16} {'reference':>16} {'|d mean|/se':>12} {'|d sd|/se':>10}")
    for p in learned.summary["parameters"]:
        k = index[p["name"]]
        m, sd, n = ref["mean"][k], ref["sd"][k], ref["n"]
        z = abs(p["mean"] - m) / math.sqrt(p["mcse_mean"] ** 2 + sd ** 2 / n)
        # the reference sd's standard error, for normal-tailed draws: sd / sqrt(2 n)
        zs = abs(p["sd"] - sd) / math.sqrt(p["mcse_sd"] ** 2 + sd ** 2 / (2 * n))
        # 5 standard errors: about 6e-7 false alarms per check, 1e-5 for the 20 checks
        good = z < 5 and zs < 5
        ok &= good
        print(f"{p['name']:>8} {p['mean']:8.3f} ({p['sd']:5.2f}) {m:8.3f} ({sd:5.2f}) {z:12.2f} {zs:10.2f}"
              f"{'' if good else '  <-- disagrees'}")
    g_l, g_n = learned.summary["ess_bulk_per_grad"], nuts.summary["ess_bulk_per_grad"]
    print(f"min bulk-ESS per gradient: learned {g_l:.4g}, NUTS {g_n:.4g} ({g_l / g_n:.2f}x); "
          f"training spent {model.training['grads']} gradients per batch row")
    print("agreement with posteriordb's reference:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
