#!/usr/bin/python3
"""A hierarchical model written in PyTorch, trained and sampled from Python, checked against a long
NUTS run. The model: eight schools (Rubin 1981; Gelman et al., BDA sec. 5.5), non-centred:

    y_j ~ N(mu + tau * eta_j, sigma_j),  eta_j ~ N(0, 1),  mu ~ N(0, 5^2),  tau ~ HalfCauchy(0, 5)

sampled in (mu, log tau, eta.1..8). Run from the repository root after `make build`:

    PYTHONPATH=build/python /usr/bin/python3 examples/python/eight_schools.py [--quick]

It exits non-zero when the learned sampler's means or standard deviations disagree with NUTS's
beyond their Monte-Carlo errors.
"""
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
    reference = nmcmc.sample(target, "nuts", chains=4, warmup=1000, draws=2000 if quick else 10000, seed=3,
                             progress=False)
    print("learned sampler:\n" + str(learned))
    print("NUTS (reference):\n" + str(reference))

    ok = True
    print(f"{'param':>8} {'learned':>16} {'NUTS':>16} {'|d mean|/se':>12} {'sd ratio':>9}")
    for p_l, p_n in zip(learned.summary["parameters"], reference.summary["parameters"]):
        se = (p_l["mcse_mean"] ** 2 + p_n["mcse_mean"] ** 2) ** 0.5
        z = abs(p_l["mean"] - p_n["mean"]) / se
        ratio = p_l["sd"] / p_n["sd"]
        # 4 standard errors (false alarm ~ 6e-5 per parameter); sd within 15 % (the learned run's
        # worst ESS here is a few hundred, so its sd is within ~5 % with 3 sigma to spare).
        good = z < 4 and abs(ratio - 1) < 0.15
        ok &= good
        print(f"{p_l['name']:>8} {p_l['mean']:8.3f} ({p_l['sd']:5.2f}) {p_n['mean']:8.3f} ({p_n['sd']:5.2f})"
              f" {z:12.2f} {ratio:9.3f} {'' if good else '  <-- disagrees'}")
    g_l, g_n = learned.summary["ess_bulk_per_grad"], reference.summary["ess_bulk_per_grad"]
    print(f"min bulk-ESS per gradient: learned {g_l:.4g}, NUTS {g_n:.4g} ({g_l / g_n:.2f}x); "
          f"training spent {model.training['grads']} gradients per batch row")
    print("agreement with NUTS:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
