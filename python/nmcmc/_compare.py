"""nmcmc.compare: NUTS with each metric, HMC, MALA and the learned sampler on one footing (split from
the package's __init__, whose names it uses)."""
import json as _json
import os as _os
import tempfile as _tempfile
from typing import Optional as _Optional

from . import Model, Run, _C, _Progress, _dtype_name, _spec_of, _transport_choice


def compare_defaults() -> dict:
    """compare()'s options as nmcmc's C++ definition (CompareOptions) sets them: what an argument
    left unset takes."""
    return _json.loads(_C.compare_defaults())


def compare(target=None, *, model=None, config=None, chains: _Optional[int] = None, warmup: _Optional[int] = None,
            draws: _Optional[int] = None, seed: _Optional[int] = None, dtype: _Optional[str] = None,
            hmc_leapfrog: _Optional[int] = None, output: _Optional[str] = None, nuts_metrics=None,
            transport: _Optional[str] = None, transport_layers: _Optional[int] = None,
            transport_rounds: _Optional[int] = None, global_moves: _Optional[bool] = None, warm_start=None,
            warm_warmup: _Optional[int] = None, progress: bool = True) -> dict:
    """Runs NUTS (with each metric in `nuts_metrics`: by default diag, dense, fisher-diag and
    fisher-lowrank), HMC, MALA and (with `model`, or `config` to train one first) the learned
    sampler on the same target with the same chains, warm-up and draws; returns what compare.json
    holds (per sampler: accept, gradients per draw, ESS per draw, per gradient and per second,
    R-hat, divergences, and "all_in": the cost of 1,000 and 10,000 effective draws with warm-up and
    training counted; the learned sampler's "vs_best_nuts": ratios and break-evens in gradients
    and seconds against the best NUTS). transport="flow" adds NUTS on the target pulled back
    through a flow fitted in warm-up ("nuts_flow"); "auto" adds NUTS with the flow only where its
    warm-up's draws are far from any Gaussian ("nuts_auto"); transport_layers, transport_rounds and
    global_moves as for nmcmc.sample. warm_start (a previous Run of the same
    model on other data, its output directory or its "adaptation" record) adds "nuts_warm": NUTS
    started where it ended, with its step size and metric, after warm_warmup (150) iterations.
    result["table"] is the markdown. Writes compare.json, compare.md and the trace figure into `output` (a temporary
    directory if not given)."""
    if isinstance(model, Model):
        model = model.path
    if isinstance(config, dict):
        tmpdir = _tempfile.mkdtemp(prefix="nmcmc-")
        path = _os.path.join(tmpdir, "config.json")
        with open(path, "w") as f:
            _json.dump(config, f)
        config = path
    if output is None:
        output = _tempfile.mkdtemp(prefix="nmcmc-compare-")
    # Only what was given: the rest takes the C++ definition's defaults (compare_defaults()).
    opts = {"output": _os.fspath(output)}
    if target is not None:
        opts["target"] = _spec_of(target)
    if model is not None:
        opts["model"] = _os.fspath(model)
    if config is not None:
        opts["config"] = _os.fspath(config)
    for key, value in (("chains", chains), ("warmup", warmup), ("draws", draws), ("seed", seed),
                       ("hmc_leapfrog", hmc_leapfrog)):
        if value is not None:
            opts[key] = int(value)
    if dtype is not None:
        opts["dtype"] = _dtype_name(dtype)
    if nuts_metrics is not None:
        opts["nuts_metrics"] = [str(m) for m in nuts_metrics]
    if warm_start is not None:
        if isinstance(warm_start, Run):
            warm_start = warm_start.summary.get("adaptation")
            if warm_start is None:
                raise ValueError("nmcmc.compare: warm_start= needs a completed run of nuts, hmc or mala without a transport")
        opts["warm_start"] = warm_start if isinstance(warm_start, dict) else _os.fspath(warm_start)
    if warm_warmup is not None:
        opts["warm_warmup"] = int(warm_warmup)
    choice = _transport_choice(transport, transport_layers, transport_rounds, global_moves)
    if choice:
        opts["transport"] = choice
    result = _json.loads(_C.compare(_json.dumps(opts), _Progress(progress)))
    result["table"] = _C.compare_table(_json.dumps(result))
    result["output"] = _os.fspath(output)
    return result
