#!/usr/bin/python3
"""A two-component Gaussian mixture in D dimensions with unequal weights, as a TorchScript energy
for `nmcmc sample --module` (bench/transport_mixture.sh, issue #36 item 3):

    p(x) = w N(x; -a 1, I) + (1 - w) N(x; +a 1, I),   w = 0.3, a = 2.5 (modes 2 a sqrt(D) apart)

Usage: /usr/bin/python3 bench/mixture_module.py OUT.pt [D] [w] [a]
"""
import sys

import torch


class Mixture(torch.nn.Module):
    dim: int

    def __init__(self, dim: int, weight: float, offset: float):
        super().__init__()
        self.dim = dim
        self.register_buffer("log_w", torch.tensor([weight, 1.0 - weight]).log())
        self.register_buffer("means", torch.stack([-offset * torch.ones(dim), offset * torch.ones(dim)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [C, D] -> U(x) [C]
        d2 = ((x.unsqueeze(1) - self.means.to(x.dtype)) ** 2).sum(-1)  # [C, 2]
        return -torch.logsumexp(self.log_w.to(x.dtype) - 0.5 * d2, dim=1)


if __name__ == "__main__":
    out = sys.argv[1]
    dim = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    a = float(sys.argv[4]) if len(sys.argv) > 4 else 2.5
    torch.jit.save(torch.jit.script(Mixture(dim, w, a)), out)
    print(f"wrote {out}: {dim}-d mixture, weight {w} at -{a}, {1 - w} at +{a}")
