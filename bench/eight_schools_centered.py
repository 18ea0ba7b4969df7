#!/usr/bin/python3
"""The centred eight schools (posteriordb's eight_schools_centered: theta_j ~ normal(mu, tau) sampled
directly, the funnel NUTS diverges in) as a posteriordb port for scripts/posteriordb.py, without
adding it to the suite: issue #36's goal names it ("beat them on the hierarchical ones (centred
eight schools and the like)"). Its posterior is the non-centred one's (theta = mu + tau
theta_trans), so its reference moments come from the vendored non-centred reference draws (1,000,
thinned), moved to the centred coordinates (theta[1..8], mu, log tau); the moment checks count
them as 1,000 draws.

    /usr/bin/python3 bench/eight_schools_centered.py check [scripts/posteriordb.py check's options]
    /usr/bin/python3 bench/eight_schools_centered.py gradients     (E[grad U] = 0 on those draws)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import posteriordb as pdb  # noqa: E402  (scripts/posteriordb.py: imports nmcmc before torch's BLAS)
import ports  # noqa: E402

NAME = "eight_schools-eight_schools_centered"


class EightSchoolsCentered(torch.nn.Module):
    """eight_schools-eight_schools_centered: hierarchical, 10 parameters (theta[1..8], mu, log tau)."""

    def __init__(self, d: dict):
        super().__init__()
        self.register_buffer("y", torch.tensor(d["y"], dtype=torch.float64))
        self.register_buffer("sigma", torch.tensor(d["sigma"], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = x[:, :8]
        mu = x[:, 8]
        log_tau = x[:, 9]
        tau = torch.exp(log_tau)
        lp = -0.5 * (((theta - mu.unsqueeze(1)) / tau.unsqueeze(1)) ** 2).sum(-1) - 8.0 * log_tau
        lp = lp - 0.5 * (((self.y - theta) / self.sigma) ** 2).sum(-1)
        lp = lp - 0.5 * (mu / 5.0) ** 2 - torch.log1p((tau / 5.0) ** 2)
        return -(lp + log_tau)


def centred_reference() -> dict:
    nc = ports.reference("eight_schools-eight_schools_noncentered")
    d = torch.tensor(nc["draws"], dtype=torch.float64)  # theta_trans[1..8], mu, log_tau
    x = torch.cat([d[:, 8:9] + torch.exp(d[:, 9:10]) * d[:, :8], d[:, 8:10]], 1)
    return {"posterior": NAME, "kind": "hierarchical", "source": nc["source"] + " (non-centred, moved)",
            "names": [f"theta[{i}]" for i in range(1, 9)] + ["mu", "log_tau"],
            "mean": x.mean(0).tolist(), "sd": x.std(0).tolist(), "n": x.size(0), "draws": x.tolist()}


_reference = ports.reference
_ref = centred_reference()
ports.PORTS[NAME] = ("eight_schools", EightSchoolsCentered,
                     [(f"theta[{i}]", "id") for i in range(1, 9)] + [("mu", "id"), ("tau", "log")], "hierarchical")
ports.reference = lambda p: _ref if p == NAME else _reference(p)

if __name__ == "__main__":
    sys.argv = [sys.argv[0], sys.argv[1], "--only", NAME] + sys.argv[2:] if sys.argv[1] == "check" else \
        [sys.argv[0], sys.argv[1], NAME]
    sys.exit(pdb.main())
