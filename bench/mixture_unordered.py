#!/usr/bin/python3
"""posteriordb's low-dimensional Gaussian mixture (low_dim_gauss_mix, its vendored data) without
the ordering of its means: two separated modes, one per labelling, exactly equal in weight (the
priors are symmetric: swapping (mu1, sigma1, theta) with (mu2, sigma2, 1 - theta) leaves the
density unchanged). For bench/transport_mixture.sh (issue #36 item 3).

    /usr/bin/python3 bench/mixture_unordered.py module OUT.pt
        the TorchScript energy on (mu1, mu2, log sigma1, log sigma2, logit theta)
    /usr/bin/python3 bench/mixture_unordered.py weights RUN_DIR ...
        per run: the fraction of draws with mu1 < mu2 (truth 0.5) and its MCSE by batch means
        (10 batches per chain), per chain, and the ordered labelling's moments against
        posteriordb's reference (the draws relabelled so that mu1 < mu2)
"""
import glob
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
import ports  # noqa: E402


class UnorderedMix(torch.nn.Module):
    dim: int

    def __init__(self, y: torch.Tensor):
        super().__init__()
        self.dim = 5
        self.register_buffer("y", y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [C, 5] -> U(x) [C]
        mu1, mu2 = x[:, 0], x[:, 1]
        s1, s2 = torch.exp(x[:, 2]), torch.exp(x[:, 3])
        theta = torch.sigmoid(x[:, 4])
        # the port's priors (normal(0, 2) on the means and the scales, beta(5, 5) on theta), unordered
        lp = -0.5 * (s1 / 2.0) ** 2 - 0.5 * (s2 / 2.0) ** 2 - 0.5 * (mu1 / 2.0) ** 2 - 0.5 * (mu2 / 2.0) ** 2
        lp = lp + 4.0 * torch.log(theta) + 4.0 * torch.log1p(-theta)
        y = self.y.to(x.dtype).unsqueeze(0)
        a = torch.log(theta).unsqueeze(1) - 0.5 * ((y - mu1.unsqueeze(1)) / s1.unsqueeze(1)) ** 2 - torch.log(s1).unsqueeze(1)
        b = torch.log1p(-theta).unsqueeze(1) - 0.5 * ((y - mu2.unsqueeze(1)) / s2.unsqueeze(1)) ** 2 - torch.log(s2).unsqueeze(1)
        lp = lp + torch.logsumexp(torch.stack([a, b], 0), 0).sum(-1)
        # Jacobians: log sigma (2), logit theta
        lp = lp + x[:, 2] + x[:, 3] + torch.log(theta) + torch.log1p(-theta)
        return -lp


def draws(run_dir):
    out = []
    for f in sorted(glob.glob(os.path.join(run_dir, "chain_*.csv"))):
        rows = [l for l in open(f) if not l.startswith("#")]
        head = rows[0].strip().split(",")
        cols = [i for i, h in enumerate(head) if not h.endswith("__")]
        out.append(torch.tensor([[float(r.split(",")[i]) for i in cols] for r in rows[1:]], dtype=torch.float64))
    return torch.stack(out)  # [chains, draws, 5]


def weights(run_dirs):
    ref = ports.reference("low_dim_gauss_mix-low_dim_gauss_mix")
    for d in run_dirs:
        x = draws(d)
        ind = (x[..., 0] < x[..., 1]).double()  # [chains, draws]
        b = ind.reshape(ind.size(0), 10, -1).mean(2).reshape(-1)
        w = ind.mean().item()
        mcse = b.std().item() / math.sqrt(b.numel())
        z = (w - 0.5) / mcse if mcse > 0 else float("inf")
        # relabelled so that mu1 < mu2, on the port's coordinates (mu1, log gap, log s1, log s2, logit theta)
        swap = (x[..., 0] > x[..., 1]).unsqueeze(-1)
        o = torch.where(swap, x[..., [1, 0, 3, 2, 4]] * torch.tensor([1, 1, 1, 1, -1], dtype=x.dtype), x)
        o = torch.stack([o[..., 0], torch.log(o[..., 1] - o[..., 0]), o[..., 2], o[..., 3], o[..., 4]], -1).reshape(-1, 5)
        off = [(o[:, k].mean().item() - ref["mean"][k]) / ref["sd"][k] for k in range(5)]
        print(f"{d}: weight of mu1 < mu2 {w:.3f} (true 0.5), MCSE {mcse:.3f}, z {z:+.1f}; per chain "
              f"{[round(v, 2) for v in ind.mean(1).tolist()]}; relabelled means off the reference by "
              f"{max(abs(v) for v in off):.2f} reference sd at most, sds x{min(o.std(0) / torch.tensor(ref['sd'])):.2f}-"
              f"{max(o.std(0) / torch.tensor(ref['sd'])):.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "module":
        y = torch.tensor(ports.data("low_dim_gauss_mix-low_dim_gauss_mix")["y"], dtype=torch.float64)
        torch.jit.save(torch.jit.script(UnorderedMix(y)), sys.argv[2])
        print(f"wrote {sys.argv[2]}: posteriordb's low_dim_gauss_mix without the ordering (5 parameters)")
    else:
        weights(sys.argv[2:])
