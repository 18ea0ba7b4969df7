"""The progress line that nmcmc.sample, train and compare print on stderr."""
import sys as _sys
import time as _time


class _Progress:
    """One progress line on stderr: phase, done/total, accept, step size, rate and ETA."""
    interval_tty, interval_log = 0.25, 10.0  # seconds between redraws on a terminal, between lines in a log

    def __init__(self, enabled: bool):
        self.enabled = enabled and _sys.stderr is not None
        self.last = 0.0
        self.tty = bool(getattr(_sys.stderr, "isatty", lambda: False)())

    def __call__(self, p: dict):
        if not self.enabled:
            return
        if "message" in p:
            return print(p["message"], file=_sys.stderr)
        now = _time.monotonic()
        done, total = p.get("iteration", p.get("step", 0)), p["total"]
        final = done >= total
        if not final and now - self.last < (self.interval_tty if self.tty else self.interval_log):
            return
        self.last = now
        rate = done / p["elapsed"] if p["elapsed"] > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        label, unit = p.get("phase", "training"), "it/s"
        if label == "summary":  # the diagnostics of a long run, a block of parameters at a time
            stats, unit = "bulk/tail ESS, R-hat, quantiles", "parameters/s"
        elif "loss" in p or label == "fit":  # a flow transport's fit (sampling's holds its loss in accept)
            stats, unit = f"held-out Fisher loss {p.get('loss', p.get('accept', float('nan'))):.4g}", "steps/s"
        else:
            stats = f"accept {p['accept']:.3f}"
            stats += f"  step {p['step_size']:.3g}" if "step_size" in p else f"  beta {p['beta']:.3g}  eps {p['eps']:.3g}"
        line = f"[{label}] {done}/{total} {100.0 * done / max(total, 1):3.0f}%  {stats}  {rate:.1f} {unit}  ETA {eta:.0f} s"
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line + "\x1b[K" * self.tty, end=end, file=_sys.stderr, flush=True)
