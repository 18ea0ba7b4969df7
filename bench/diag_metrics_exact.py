#!/usr/bin/python3
"""The two diagonal metrics at their exact values, on posteriordb's reference draws (issue #34).

NUTS's cost per effective draw on a near-Gaussian posterior grows with the trajectory's length in
leapfrog steps: the step size is bounded by the stiffest direction of the preconditioned density
(the largest eigenvalue of D^1/2 F D^1/2, F = Cov(grad U), the Fisher information) and the
trajectory must span its widest one (the largest eigenvalue of D^-1/2 S D^-1/2, S = Cov(x)), so
the number of steps per trajectory goes as sqrt(lambda_max(D^-1/2 S D^-1/2) lambda_max(D^1/2 F D^1/2))
(1 for a perfect metric). This compares, for each posterior, that figure with D = Var x (Stan's
diagonal metric, exact) and with D = sqrt(Var x / Var grad U) (the Fisher diagonal, exact), both
from posteriordb's reference draws and the port's gradients there: what the two estimators
converge to, without a warm-up's noise.

    /usr/bin/python3 bench/diag_metrics_exact.py
"""
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "posteriordb"))
import ports  # noqa: E402


def steps_figure(inv_mass, s, f):
    r = inv_mass.sqrt()
    wide = torch.linalg.eigvalsh(s / r[:, None] / r[None, :]).max().item()
    stiff = torch.linalg.eigvalsh(f * r[:, None] * r[None, :]).max().item()
    return math.sqrt(wide * stiff)


def main():
    print("| posterior | D | Stan's diagonal (Var x) | Fisher diagonal | Var x / Fisher |")
    print("|---|---|---|---|---|")
    gains = []
    for p in ports.PORTS:
        m = ports.module(p)
        x = torch.tensor(ports.reference(p)["draws"], dtype=torch.float64).requires_grad_(True)
        g, = torch.autograd.grad(m(x).sum(), x)
        x = x.detach()
        s = torch.cov(x.T)
        gc = g - g.mean(0)
        f = gc.T @ gc / g.shape[0]
        var_x, var_g = x.var(0), g.var(0)
        a, b = steps_figure(var_x, s, f), steps_figure((var_x / var_g).sqrt(), s, f)
        gains.append(a / b)
        print(f"| {p} | {x.shape[1]} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    print(f"\nmedian Var x / Fisher over {len(gains)} posteriors: {statistics.median(gains):.3f} "
          f"(range {min(gains):.3f}-{max(gains):.3f}; above 1: the Fisher diagonal needs fewer steps)")


if __name__ == "__main__":
    main()
