"""summarise(): the Stan / posterior-package summary of any draws, as `nmcmc sample` writes it."""
from typing import List as _List, Optional as _Optional

import torch

from . import _nmcmc as _C

FIELDS = ("mean", "sd", "mcse_mean", "mcse_sd", "q05", "q50", "q95", "ess_bulk", "ess_tail", "rhat")


def summarise(draws, names: _Optional[_List[str]] = None) -> dict:
    """Summary of draws shaped [draws, chains, parameters] (a tensor or anything torch.as_tensor
    takes; [draws, chains] for one parameter): per parameter the mean, sd, MCSE of the mean and of
    the sd, the 5 %, 50 % and 95 % quantiles, rank-normalised bulk- and tail-ESS and R-hat
    (Vehtari et al. 2021), computed as R's posterior package computes them (checked against it in
    the test suite). Returns {"names": [...], field: tensor [parameters], ...}."""
    x = torch.as_tensor(draws, dtype=torch.float64)
    if x.dim() == 2:
        x = x.unsqueeze(-1)
    if names is not None and len(names) != (x.shape[-1] if x.dim() == 3 else -1):
        raise _C.UsageError(f"summarise: {len(names)} names for {x.shape[-1] if x.dim() == 3 else '?'} parameters")
    out = dict(_C.stan_summary(x))
    out["names"] = list(names) if names is not None else [f"x[{k}]" for k in range(x.shape[-1])]
    return out
