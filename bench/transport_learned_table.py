"""The table of bench/transport_learned.sh: the learned proposal with the flow or the affine
preconditioner, sampling-only and all-in (summary.json, config.json, the checkpoint's meta)."""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from transport_table import x1_sd_mcse  # noqa: E402

out = sys.argv[1]


def meta_of(model):
    """The checkpoint's metadata, through the Python package (build/python)."""
    code = "import json, sys, nmcmc; print(json.dumps(nmcmc.Model(sys.argv[1]).meta))"
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "build/python"))
    r = subprocess.run(["/usr/bin/python3", "-c", code, model], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"reading {model}: {r.stderr.strip()}")
    return json.loads(r.stdout)


print("| target | preconditioner | max R-hat | x1 mean (in MCSE) | x1 sd (true; off by, in MCSE) | accept "
      "| sampling: x1 ESS/grad | min ESS/grad | warm-up grads | training steps | training grads | all-in: x1 ESS/grad "
      "| min ESS/grad | warm-up s | training s | sampling s |")
print("|" + "---|" * 16)
for path in sorted(glob.glob(os.path.join(out, "*", "run", "summary.json"))):
    run_dir = os.path.dirname(path)
    name = os.path.basename(os.path.dirname(run_dir))
    target, pre = name.split("_")[0], name.split("_")[-1]
    j = json.load(open(path))
    meta = meta_of(os.path.join(os.path.dirname(run_dir), "model.pt"))
    sigma = j["target"]["sigma"]
    x1 = j["parameters"][0]
    steps = j["draws"] * j["chains"]
    sampling = j["grads_per_step"] * steps
    burn = j["grads_warmup_per_chain"] * j["chains"]
    p = meta.get("preconditioner") or {}
    warm = p.get("grads", 0)
    training = meta["grads"] * meta["train"]["batch"]
    total = warm + training + burn + sampling
    ok = j["max_rhat"] <= 1.01
    na = "n/a (R-hat)"
    sd, mcse = x1_sd_mcse(run_dir)
    row = [target, pre, f"{j['max_rhat']:.3f}", f"{x1['mean']:+.3f} ({x1['mean'] / x1['mcse_mean']:+.1f})",
           f"{sd:.3f} ({sigma:g}; {(sd - sigma) / mcse:+.1f})", f"{j.get('accept_rate', float('nan')):.3f}",
           f"{x1['ess_bulk'] / sampling:.3g}" if ok else na, f"{j['min_ess_bulk'] / sampling:.3g}" if ok else na,
           f"{warm:.3g}", f"{meta['step']}", f"{training:.3g}",
           f"{x1['ess_bulk'] / total:.3g}" if ok else na, f"{j['min_ess_bulk'] / total:.3g}" if ok else na,
           f"{p.get('seconds', 0):.0f}", f"{meta.get('elapsed', 0):.0f}", f"{j['seconds_sampling']:.0f}"]
    print("| " + " | ".join(row) + " |")
