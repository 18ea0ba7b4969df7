"""nmcmc: exact MCMC with the learned, entropy-maximising proposal of Li, Chen and Sommer (2021).

A target is a density p(x) = exp(-U(x)) / Z: a built-in one by name, or your own, written in
PyTorch::

    import torch, nmcmc

    def energy(x: torch.Tensor) -> torch.Tensor:          # x [C, D] -> U(x) [C]
        return 0.5 * (x ** 2).sum(-1)

    t = nmcmc.from_function(energy, dim=10)
    run = nmcmc.sample(t, sampler="nuts", chains=4, warmup=1000, draws=1000)
    run.draws            # torch.Tensor [draws, chains, D], float64
    run.summary          # dict: per-parameter mean, sd, ESS, R-hat; ESS per gradient; ...

    model = nmcmc.train(t, steps=2000, batch=256)          # the learned sampler
    run = nmcmc.sample(t, sampler="learned", model=model)
    nmcmc.compare(t, model=model)                          # against NUTS, HMC, MALA

Everything runs in nmcmc's C++ core (the same code as the `nmcmc` command); tensors are shared
with PyTorch without copies. Errors in what you pass raise ValueError with one clear message.
"""
import io as _io
import json as _json
import math
import os as _os
import shutil as _shutil
import sys as _sys
import tempfile as _tempfile
import warnings as _warnings
from typing import List as _List, Optional as _Optional

# A user's own OPENBLAS_CORETYPE (not one nmcmc set in a parent process) is their choice: no warning.
_user_coretype = bool(_os.environ.get("OPENBLAS_CORETYPE")) and not _os.environ.get("NMCMC_BLAS_CORE_FROM")
from ._blas import choose_kernels as _choose_blas_kernels  # noqa: E402 (before torch)

_choose_blas_kernels()

import torch  # before _nmcmc: it loads the LibTorch both share

from . import _nmcmc as _C
from ._kept import KeptModule as _KeptModule
from ._progress import _Progress
from ._summary import summarise

__version__ = _C.version()
__all__ = ["Target", "target", "from_module", "from_function", "stan_model", "targets", "sample", "Run", "train", "Model", "report",
           "compare", "compare_defaults", "sample_defaults", "summarise", "blas_kernels", "UsageError", "DataError"]

UsageError = _C.UsageError
DataError = _C.DataError


def blas_kernels() -> str:
    """The kernels OpenBLAS runs in this process, and what this CPU would run better
    (Note [OpenBLAS's kernels]); e.g. 'Cooperlake (chosen by nmcmc over Prescott, ...)'."""
    return _C.blas_kernels()[2]


_kernels = _C.blas_kernels()  # (loaded, better, description)
if _kernels[1] and not _user_coretype:
    _warnings.warn(f"nmcmc: OpenBLAS runs {_kernels[0]} kernels, and this CPU runs {_kernels[1]}: matrix "
                   f"products ~3x slower. Set OPENBLAS_CORETYPE={_kernels[1]} before Python starts, or import "
                   f"nmcmc before torch.", stacklevel=2)


def _dtype_name(dtype) -> _Optional[str]:
    if dtype is None:
        return None
    if dtype in (torch.float32, "float32"):
        return "float32"
    if dtype in (torch.float64, "float64"):
        return "float64"
    raise ValueError(f"nmcmc: dtype must be float32 or float64, not {dtype!r}")


def _to_json(value, what: str) -> str:
    """JSON for the core; a NaN or infinity (which JSON cannot hold) is a ValueError naming it."""
    def check(v, key):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"nmcmc: {what} '{key}' must be a finite number, got {v}")
        if isinstance(v, dict):
            for k, x in v.items():
                check(x, k)
        if isinstance(v, (list, tuple)):
            for x in v:
                check(x, key)
    check(value, "")
    return _json.dumps(value)


class Target:
    """A density nmcmc can sample. Build one with target(), from_module() or from_function()."""

    def __init__(self, spec: dict, dtype="float32", device="cpu"):
        if not isinstance(spec, dict):
            raise ValueError("nmcmc: a target spec is a dict with a 'name' (see nmcmc.targets())")
        self._device = str(device)
        self._dtype = _dtype_name(dtype)
        self._t = _C.make_target(_to_json(spec, "target option"), self._dtype, self._device)
        self._keep = None  # what must outlive this target (a scripted module)

    @property
    def spec(self) -> dict:
        """The complete spec: recreates the target (and is what outputs and checkpoints record)."""
        return _json.loads(self._t.spec)

    @property
    def name(self) -> str:
        return self._t.name

    @property
    def dim(self) -> int:
        return self._t.dim

    @property
    def names(self) -> _List[str]:
        """Parameter names (x.1 ... x.D unless the target names them)."""
        return list(self._t.names)

    @property
    def engine(self) -> str:
        """How a module's energy runs: "native" (nmcmc's evaluator), "libtorch", or "builtin" (not
        a module); engine_note says why a module is not native."""
        return self._t.engine[0]

    @property
    def engine_note(self) -> str:
        return self._t.engine[1]

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self._dtype == "float64" else torch.float32

    @property
    def reference_moments(self):
        """(mean, sd) as float64 tensors [D], or None."""
        return self._t.reference_moments

    def constrained_names(self, transformed: bool = True, generated: bool = True) -> _List[str]:
        """A Stan program's (stan_model) names on the constrained scale: parameters, then transformed
        parameters and generated quantities as asked."""
        return list(self._t.constrained_names(transformed, generated))

    def constrain(self, x: torch.Tensor, transformed: bool = True, generated: bool = True, seed: int = 0):
        """A Stan program's constrained values at unconstrained points x [N, D] -> [N, K] float64, as
        constrained_names says; generated quantities draw with `seed` and the row's index."""
        return self._t.constrain(x, transformed, generated, seed)

    def unconstrain(self, values: torch.Tensor) -> torch.Tensor:
        """A Stan program's unconstrained points [N, D] of constrained parameter values [N, P]
        (constrained_names(False, False) order)."""
        return self._t.unconstrain(values)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """U(x) for x [C, D] (in the target's dtype) -> [C]."""
        return self._t.energy(x)

    def energy_and_grad(self, x: torch.Tensor):
        """(U(x) [C], dU/dx [C, D])."""
        return self._t.energy_and_grad(x)

    def __repr__(self):
        return f"nmcmc.Target({_json.dumps(self.spec)}, dtype={self._dtype})"


def targets() -> _List[dict]:
    """Every target nmcmc knows: name, description, options."""
    return _json.loads(_C.targets())


def target(name: str, dtype="float32", device="cpu", **options) -> Target:
    """A built-in target by name, e.g. target("funnel", dim=100, sigma=1.0),
    target("logistic", dataset="german"); see targets() for the options."""
    return Target(dict(name=name, **options), dtype=dtype, device=device)


def from_module(module, dim: _Optional[int] = None, output: str = "energy", dtype="float32",
                device="cpu", engine: str = "auto") -> Target:
    """Your density as a TorchScript module: forward(x [C, D]) -> U(x) [C] (output="energy") or
    log p(x) [C] (output="log_prob"). `module` is a torch.nn.Module (scripted here), a
    torch.jit.ScriptModule, or the path of a file written by torch.jit.save. The module may carry
    `dim`, `names` (List[str]) and reference moments `ref_mean`, `ref_sd` as attributes.
    engine: "auto" (nmcmc's own evaluator where the module's operations allow, else LibTorch),
    "native" (an error if they do not) or "libtorch"; see Target.engine."""
    spec = {"name": "torchscript", "output": output}
    if engine != "auto":
        spec["engine"] = engine
    if dim is not None:
        spec["dim"] = int(dim)
    keep = None
    if isinstance(module, (str, _os.PathLike)):
        spec["module"] = _os.fspath(module)
    else:
        if not isinstance(module, torch.jit.ScriptModule):
            if not isinstance(module, torch.nn.Module):
                raise ValueError("nmcmc.from_module: give a torch.nn.Module, a ScriptModule or a path; "
                                 "for a plain function use nmcmc.from_function")
            try:
                module = torch.jit.script(module)
            except Exception as e:  # TorchScript's own message says where and why
                raise ValueError(f"nmcmc.from_module: TorchScript cannot compile this module:\n{e}") from None
        buf = _io.BytesIO()
        torch.jit.save(module, buf)
        kept = _KeptModule(_C.register_module(buf.getvalue()))
        spec["module"] = kept.key
        keep = (module, kept)
    t = Target(spec, dtype=dtype, device=device)
    t._keep = keep
    return t


def stan_model(program, data=None, dtype="float64", device="cpu", seed: _Optional[int] = None) -> Target:
    """Your Stan program as a target: `program` is the path of a .stan file (current Stan syntax,
    or Stan 2.21's), `data` the path of its data as CmdStan's JSON, or a dict of them (written to
    a temporary file). Compiled by Stan's own compiler on first use (about a minute; cached).
    The chains move on Stan's unconstrained scale; sample() reports the draws as Stan writes them:
    constrained parameters, transformed parameters and generated quantities by Stan's names.
    `seed` seeds the transformed data block's random numbers."""
    spec = {"name": "stan", "program": _os.fspath(program)}
    keep = None
    if isinstance(data, dict):  # written where the target can read it; removed with the target
        keep = _tempfile.TemporaryDirectory(prefix="nmcmc_stan_")
        path = _os.path.join(keep.name, "data.json")
        with open(path, "w") as f:
            _json.dump(data, f)
        data = path
    if data is not None:
        spec["data"] = _os.fspath(data)
    if seed is not None:
        spec["seed"] = int(seed)
    t = Target(spec, dtype=dtype, device=device)
    t._keep = keep
    return t


def from_function(fn, dim: int, names: _Optional[_List[str]] = None, output: str = "energy",
                  dtype="float32", device="cpu") -> Target:
    """Your density as a plain Python function fn(x [C, D]) -> U(x) [C] that TorchScript can
    compile (type-annotated tensors, torch operations). Raises ValueError with TorchScript's
    message when it cannot."""
    try:
        scripted = torch.jit.script(fn)
    except Exception as e:
        raise ValueError(f"nmcmc.from_function: TorchScript cannot compile {getattr(fn, '__name__', fn)!r} "
                         f"(write it with torch operations on tensors, annotate non-tensor arguments):\n{e}") from None
    if names is not None:
        names = [str(n) for n in names]

    class _Function(torch.nn.Module):
        dim: int
        names: _List[str]

        def __init__(self):
            super().__init__()
            self.dim = int(dim)
            self.names = names if names is not None else []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scripted(x)

    try:
        module = torch.jit.script(_Function())
    except Exception as e:
        raise ValueError(f"nmcmc.from_function: TorchScript cannot compile a module around {fn!r}:\n{e}") from None
    return from_module(module, dim=dim, output=output, dtype=dtype, device=device)


class Run:
    """A finished sampling run. Tensors are CPU float64 unless noted, shaped [draws, chains, ...]."""

    def __init__(self, d: dict):
        self.draws: torch.Tensor = d["draws"]            # [S, C, D]
        self.lp: torch.Tensor = d["lp"]                  # [S, C]: -U(x)
        self.accept_stat: torch.Tensor = d["accept_stat"]
        self.divergent: torch.Tensor = d["divergent"]    # bool
        self.n_grad: torch.Tensor = d["n_grad"]          # int64: gradients each chain spent per draw
        self.tree_depth: _Optional[torch.Tensor] = d.get("tree_depth")  # NUTS
        self.energy: _Optional[torch.Tensor] = d.get("energy")          # NUTS: the Hamiltonian
        self.inv_mass: _Optional[torch.Tensor] = d.get("inv_mass")
        self.step_size: float = d["step_size"]
        self.names: _List[str] = list(d["names"])
        self.summary: dict = _json.loads(d["summary"])
        self.config: dict = _json.loads(d["config"])
        self._text = d["summary_text"]

    def __repr__(self):
        return self._text

    def __str__(self):
        return self._text


def _spec_of(t) -> dict:
    if isinstance(t, Target):
        return t.spec
    if isinstance(t, dict):
        return t
    raise ValueError("nmcmc: give a Target (nmcmc.target, from_module, from_function) or a spec dict")


def _warn_unless_it_mixes(check, said: str, advice: str) -> None:
    """Note [The mixing check]: a RuntimeWarning where a trained sampler's check failed - why, and
    the parameter that mixed worst where the check names it."""
    if not isinstance(check, dict) or check.get("passes", True):
        return
    worst = check.get("worst") or {}
    slowest = f"; slowest: {worst.get('name')} (R-hat {worst['rhat']:.3g})" if worst.get("rhat") is not None else ""
    _warnings.warn(f"{said} ({check.get('why')}{slowest}): {advice}", RuntimeWarning)


def _transport_choice(kind=None, layers=None, rounds=None, global_moves=None) -> dict:
    """Note [The transport's options]: the keyword arguments as the one JSON form of a transport
    choice, with only what was given (the C++ definition holds the defaults and the rules)."""
    given = {"kind": (kind, str), "layers": (layers, int), "rounds": (rounds, int), "global_moves": (global_moves, bool)}
    return {key: cast(value) for key, (value, cast) in given.items() if value is not None}


def sample_defaults() -> dict:
    """sample()'s options as nmcmc's C++ definition (SampleOptions, the same as `nmcmc sample`'s)
    sets them: what an argument left unset takes."""
    return _json.loads(_C.sample_defaults())


def sample(target=None, sampler: _Optional[str] = None, *, chains: _Optional[int] = None,
           warmup: _Optional[int] = None, draws: _Optional[int] = None, seed: _Optional[int] = None, model=None,
           metric: _Optional[str] = None, step_size: _Optional[float] = None,
           target_accept: _Optional[float] = None, adapt_step: _Optional[bool] = None,
           step_size_per_chain: _Optional[bool] = None, leapfrog: _Optional[int] = None, max_depth: _Optional[int] = None, jitter: _Optional[float] = None,
           init: _Optional[str] = None, init_x: _Optional[torch.Tensor] = None, dtype=None,
           device: _Optional[str] = None, output: _Optional[str] = None, formats: _Optional[str] = None,
           matmul: _Optional[str] = None, gemm: _Optional[str] = None, transport: _Optional[str] = None,
           transport_layers: _Optional[int] = None, transport_rounds: _Optional[int] = None,
           global_moves: _Optional[bool] = None, warm_start=None, engine: _Optional[str] = None,
           persistence: _Optional[float] = None, thin: _Optional[int] = None, progress: bool = True) -> Run:
    """Samples `target` with rwm | mala | hmc | nuts | learned (with `model`) exactly as
    `nmcmc sample` does: warm-up (step size by dual averaging, the metric over Stan's windows:
    metric="unit" | "diag" | "dense" | "fisher-diag" | "fisher-lowrank", diag by default for NUTS), then `draws` per chain.
    With `output` a directory, also writes the draws there as they are drawn, in `formats`: "csv"
    (Stan CSV per chain), "netcdf" (ArviZ InferenceData, inference_data.nc: arviz.from_netcdf or
    xarray.open_dataset(path, group="posterior")) or both, and summary.json.
    init: "auto" (a learned sampler starts from its own chains saved with its checkpoint when it
    has them, everything else from Stan's uniform(-2, 2)), "uniform", "exact", "zero" or "buffer";
    init_x: explicit starting points [n, D] (rows cycled over the chains).
    matmul: the learned sampler's GEMMs, "auto" | "native" | "bfloat16" (default: its model's
    model.matmul); exact in either. gemm: where its float32 GEMMs run, "auto" | "onednn" |
    "libtorch" (default: its model's model.gemm). persistence: the learned sampler's base draw
    carried from step to step, z0 <- rho z0 + sqrt(1 - rho^2) xi, in [0, 1) (default 0.6; 0: a fresh
    draw each step, the paper's sampler; exact for any value; docs/commands.md).
    thin: keep every thin-th step as a draw (default 1; the learned sampler: about half the steps per
    effective draw its training's mixing check measured, at most 50; run.summary["thin"] says which).
    transport: "flow" samples the target pulled back through a normalizing flow fitted during
    warm-up from the chains' draws and gradients (transport_layers coupling layers, fitted
    transport_rounds times; None: `nmcmc sample`'s defaults, 8 and 6; docs/transport.md); "auto"
    fits it only where the warm-up's draws are far from any Gaussian, and samples as "none"
    elsewhere (the summary's transport record says which); global_moves adds an independence
    move from the flow after every step (exact; it can jump between modes).
    warm_start: a previous Run of the same model on other data (or its output directory, or its
    summary's "adaptation" record): the chains start where it ended, with its step size and metric;
    give a short `warmup` (e.g. 150); the metric is re-estimated only when `metric` is given
    (docs/commands.md, Warm starts). nuts, hmc and mala without a transport.
    step_size_per_chain: NUTS adapts each chain's step size, as Stan (default: one for all chains).
    engine: nmcmc's own copies of LibTorch paths that the run meets (a TorchScript module's
    evaluator, the learned step, the flow's passes and fit): "auto" each where it pays, "native"
    wherever it applies, "libtorch" never (docs/commands.md, Native copies).
    Every argument left unset takes `nmcmc sample`'s default (sample_defaults()).
    Ctrl-C raises KeyboardInterrupt."""
    if sampler is None:
        sampler = sample_defaults()["sampler"]
    if matmul is not None and sampler != "learned":
        raise ValueError("nmcmc.sample: matmul= goes with sampler='learned'")
    if gemm is not None and sampler != "learned":
        raise ValueError("nmcmc.sample: gemm= goes with sampler='learned'")
    if sampler == "learned":
        if model is None:
            raise ValueError("nmcmc.sample: sampler='learned' needs model= (from nmcmc.train or nmcmc.Model.load)")
        model_path = model.path if isinstance(model, Model) else _os.fspath(model)
    elif model is not None:
        raise ValueError("nmcmc.sample: model= goes with sampler='learned'")
    else:
        model_path = None
    if target is None and sampler != "learned":
        raise ValueError("nmcmc.sample: give a target")
    if dtype is None and isinstance(target, Target) and sampler != "learned":
        dtype = target._dtype
    # Only what was given: the rest takes the C++ definition's defaults (sample_defaults()).
    options = {"sampler": sampler, "model": model_path, "metric": metric, "step_size": step_size,
               "target_accept": target_accept, "dtype": _dtype_name(dtype) if dtype is not None else None,
               "output": None if output is None else _os.fspath(output), "matmul": matmul, "gemm": gemm}
    given = {"jitter": (jitter, float), "leapfrog": (leapfrog, int), "max_depth": (max_depth, int),
             "chains": (chains, int), "warmup": (warmup, int), "draws": (draws, int), "seed": (seed, int),
             "init": (init, str), "device": (device, str), "formats": (formats, str),
             "step_size_per_chain": (step_size_per_chain, bool), "engine": (engine, str),
             "persistence": (persistence, float), "thin": (thin, int)}
    for key, (value, kind) in given.items():
        if value is not None:
            options[key] = kind(value)
    choice = _transport_choice(transport, transport_layers, transport_rounds, global_moves)
    if choice:
        options["transport"] = choice
    if adapt_step is not None:
        options["no_adapt"] = not adapt_step
    if warm_start is not None:
        if isinstance(warm_start, Run):
            if "adaptation" not in warm_start.summary:
                raise ValueError("nmcmc.sample: warm_start= needs a completed run of nuts, hmc or mala without a "
                                 "transport (this run recorded no adaptation)")
            warm_start = warm_start.summary["adaptation"]
        options["warm_start"] = warm_start if isinstance(warm_start, dict) else _os.fspath(warm_start)
    request = {"target": None if target is None else _spec_of(target), "options": options}
    run = Run(_C.sample(_to_json(request, "option"), init_x, _Progress(progress)))
    check = ((run.summary or {}).get("model_fit") or {}).get("training_check") or {}
    _warn_unless_it_mixes(check, "nmcmc.sample: this model did not mix in its training's check",
                          "do not trust these draws without their R-hat and ESS; train on (from_model=) or use NUTS")
    return run


def tune_allocator() -> str:
    """Opt in to the `nmcmc` program's malloc policy for this process (docs/precision.md,
    Note [Allocator policy]): freed training memory stays in the heap instead of going back to
    the system every step (a few per cent faster training on CPU). Importing nmcmc changes
    nothing; NMCMC_MALLOC=default makes this a no-op. Returns what was done."""
    applied, message = _C.tune_allocator()
    return message


def report(run_dir, output: _Optional[str] = None) -> str:
    """Writes the HTML report of a run directory (from sample(..., output=...), compare or the
    command line) as `nmcmc report` does: RUN_DIR/report.html unless `output` is given; returns its
    path. Needs Debian's python3-matplotlib (and python3-xarray, python3-netcdf4) for the figures."""
    return _C.report(_os.fspath(run_dir), None if output is None else _os.fspath(output))


class Model:
    """A trained learned sampler: a checkpoint file and what it records (target, options, log)."""

    def __init__(self, path: str):
        self.path = _os.fspath(path)
        self.meta: dict = _json.loads(_C.model_meta(self.path))  # ValueError if it is not a model
        self._keep = None  # what must outlive the model (the module its target was scripted from)

    @classmethod
    def load(cls, path) -> "Model":
        return cls(path)

    def save(self, path) -> "Model":
        """Copies the checkpoint to `path` (atomically) and returns the model at its new place."""
        path = _os.fspath(path)
        tmp = path + ".tmp"
        _shutil.copyfile(self.path, tmp)
        _os.replace(tmp, path)
        self.path = path
        return self

    @property
    def target_spec(self) -> dict:
        return self.meta["target"]

    @property
    def steps(self) -> int:
        return int(self.meta["step"])

    def __repr__(self):
        return f"nmcmc.Model({self.path!r}, trained {self.steps} steps on {_json.dumps(self.target_spec)})"


def _load_config(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, dict):
        return _json.loads(_json.dumps(config))
    with open(_os.fspath(config)) as f:
        try:
            return _json.load(f)
        except ValueError as e:
            raise ValueError(f"nmcmc.train: {config} is not valid JSON: {e}") from None


def train(target=None, *, config=None, steps: _Optional[int] = None, batch: _Optional[int] = None,
          model: _Optional[dict] = None, options: _Optional[dict] = None, dtype=None, device="cpu",
          output: _Optional[str] = None, resume: bool = False, progress: bool = True,
          transport: _Optional[str] = None, transport_layers: _Optional[int] = None,
          transport_rounds: _Optional[int] = None, from_model=None, ess: _Optional[float] = None,
          engine: _Optional[str] = None) -> Model:
    """Trains the learned sampler on `target` and returns the Model.

    config: a training config (dict or the path of a configs/*.json file) whose "target", "model"
    (network: variant, hidden, ...) and "train" (steps, batch, lr, ...) sections are the starting
    point; `target`, `steps`, `batch`, `model` and `options` (more "train" keys) override them.
    Without a config: the defaults of `nmcmc train --module` (the Langevin variant with the learned
    affine preconditioner; batch 64, at most 3,000 steps, stopping early when the proposal
    entropy has stopped improving or after 90 s of training steps: model.training["stopped"] says
    why; docs/commands.md). Then a short run of the trained sampler checks that it mixes
    (model.training["check"]; a RuntimeWarning where it does not).
    output: the checkpoint's path (a temporary file if not given; Model.save copies it).
    resume: continue the checkpoint at `output`. Ctrl-C stops after the current step and saves.
    transport: "flow" fits a normalizing flow in the warm-up and trains the proposal in its latent
    space (docs/transport.md); the model then samples there (transport_layers, transport_rounds:
    the flow's coupling layers and fits). "auto" (the default without a config) does so only where
    the affine preconditioner does not fit the posterior (model.training["preconditioner"]["auto"]
    says what it measured and chose); "none": the affine preconditioner only.
    from_model: a Model (or checkpoint path) trained on another data set of the same model: start
    from its networks, step size and beta (and its flow transport, kept as it is), move the affine
    map to the new data with a short warm-up, and train until the entropy stops improving
    (model.training["from"]; steps=0: re-adapt the map only and check that it still mixes;
    docs/commands.md, Training from a previous model).
    ess: the effective draws wanted (train.ess_goal; 10,000 in the defaults without a config):
    training stops once the projected all-in cost to reach them stops falling
    (model.training["probes"]; Note [Training stops when it no longer pays]); 0: off.
    engine: nmcmc's own copies of LibTorch paths in training and in the model ("auto", "native",
    "libtorch"; the config's "engine": docs/commands.md, Native copies)."""
    cfg = _load_config(config)
    if config is None:
        # Your own target: the defaults `nmcmc train --module` uses (the Langevin variant with the
        # affine preconditioner, a budget sized to the problem: docs/commands.md, "Training budget").
        cfg = _json.loads(_C.default_train_config())
    if target is not None:
        cfg["target"] = _spec_of(target)
        if dtype is None and isinstance(target, Target):
            dtype = target._dtype
    if "target" not in cfg:
        raise ValueError("nmcmc.train: give a target (or a config with one)")
    cfg.setdefault("name", cfg["target"].get("name", "model"))
    cfg.setdefault("model", {})
    cfg.setdefault("train", {})
    if model:
        cfg["model"].update(model)
    if options:
        cfg["train"].update(options)
    if steps is not None:
        cfg["train"]["steps"] = int(steps)
    if batch is not None:
        cfg["train"]["batch"] = int(batch)
    if dtype is not None:
        cfg["dtype"] = _dtype_name(dtype)
    # As the command line: a given kind replaces the config's transport, layers and rounds are set
    # on it (without a transport the C++ parser refuses them).
    choice = _transport_choice(transport, transport_layers, transport_rounds)
    if choice:
        base = {} if transport is not None else cfg.get("transport") or {}
        cfg["transport"] = {**({"kind": base} if isinstance(base, str) else base), **choice}
    if ess is not None:
        cfg["train"]["ess_goal"] = float(ess)
    if engine is not None:
        cfg["engine"] = str(engine)
    if from_model is not None:
        if resume:
            raise ValueError("nmcmc.train: from_model= starts a new model; resume= continues this one")
        cfg["from"] = from_model.path if isinstance(from_model, Model) else _os.fspath(from_model)
    if output is None:
        output = _os.path.join(_tempfile.mkdtemp(prefix="nmcmc-"), "model.pt")
    output = _os.fspath(output)
    log = _os.path.splitext(output)[0] + ".log.csv"
    result = _C.train(_to_json(cfg, "config value"), output, log, bool(resume), str(device), _Progress(progress))
    m = Model(output)
    m._keep = target._keep if isinstance(target, Target) else None
    m.log_path = log
    m.training = result
    if result["interrupted"] and not result.get("saved", True):
        raise KeyboardInterrupt("nmcmc.train: interrupted in the preconditioner warm-up; nothing was written")
    if result.get("skipped", 0) > 0:
        _warnings.warn(f"nmcmc.train: {result['skipped']} of {result['steps']} training steps were skipped because "
                       f"the gradient was not finite (see the 'skipped' column of {log})", RuntimeWarning)
    _warn_unless_it_mixes(result.get("check"), "nmcmc.train: the trained sampler does not mix",
                          "its draws would not be trustworthy (model.training['check']): train longer or use NUTS")
    if result["interrupted"]:
        print(f"nmcmc.train: interrupted after {result['steps']} steps; checkpoint saved at {output} "
              f"(resume=True continues it)", file=_sys.stderr)
    return m


from ._compare import compare, compare_defaults  # noqa: E402,F401 (uses the names above)
