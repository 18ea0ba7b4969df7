#!/usr/bin/python3
"""Scripts a density for the `nmcmc` command line: the eight-schools model (Rubin 1981; Gelman et
al., Bayesian Data Analysis, sec. 5.5) in its non-centred form, written in PyTorch.

    y_j ~ N(theta_j, sigma_j),  theta_j = mu + tau * eta_j,  eta_j ~ N(0, 1),
    mu ~ N(0, 5^2),  tau ~ HalfCauchy(0, 5)   (sampled as log tau, with its Jacobian)

Parameters: mu, log_tau, eta.1 ... eta.8 (D = 10). Run:

    /usr/bin/python3 examples/torchscript/eight_schools.py          # writes eight_schools.pt here
    nmcmc sample --module eight_schools.pt --sampler nuts --chains 4 --output run
"""
import sys
from typing import List

import torch


class EightSchools(torch.nn.Module):
    dim: int
    names: List[str]

    def __init__(self):
        super().__init__()
        self.register_buffer("y", torch.tensor([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]))
        self.register_buffer("sigma", torch.tensor([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]))
        self.dim = 10
        self.names = ["mu", "log_tau"] + [f"eta.{j}" for j in range(1, 9)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [C, 10] -> U(x) [C]
        mu, log_tau, eta = x[:, 0], x[:, 1], x[:, 2:]
        tau = torch.exp(log_tau)
        theta = mu.unsqueeze(1) + tau.unsqueeze(1) * eta
        likelihood = 0.5 * (((self.y - theta) / self.sigma) ** 2).sum(-1)
        prior = 0.5 * (mu / 5.0) ** 2 + torch.log1p((tau / 5.0) ** 2) - log_tau + 0.5 * (eta ** 2).sum(-1)
        return likelihood + prior


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "eight_schools.pt"
    torch.jit.save(torch.jit.script(EightSchools()), out)
    print(f"wrote {out}: U(x) for x [C, 10] = (mu, log_tau, eta.1..8)")
