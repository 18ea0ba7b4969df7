"""The table of bench/transport.sh: sampling-only and all-in efficiency per run (summary.json)."""
import glob
import json
import math
import os
import sys

out = sys.argv[1]
print("| target | sampler | seed | max R-hat | x1 mean (MCSE) | x1 sd (true) | min bulk-ESS | x1 bulk-ESS "
      "| sampling: min ESS/grad | all-in: grads | min ESS/grad | x1 ESS/grad | seconds | min ESS/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(out, "*", "summary.json"))):
    j = json.load(open(path))
    name = os.path.basename(os.path.dirname(path))
    target, sampler, seed = name.split("_")[0], "_".join(name.split("_")[1:-1]), name.split("_")[-1][1:]
    sigma = j["target"]["sigma"]
    x1 = j["parameters"][0]
    steps = j["draws"] * j["chains"]
    sampling_grads = j["grads_per_step"] * steps
    total = j["grads_warmup_per_chain"] * j["chains"] + sampling_grads
    seconds = j["seconds_warmup"] + j["seconds_sampling"]
    ok = j["max_rhat"] <= 1.01
    na = "n/a (R-hat)"
    row = [target, sampler, seed, f"{j['max_rhat']:.3f}",
           f"{x1['mean']:+.3f} ({x1['mean'] / x1['mcse_mean']:+.1f})", f"{x1['sd']:.3f} ({sigma:g})",
           f"{j['min_ess_bulk']:.0f}", f"{x1['ess_bulk']:.0f}",
           f"{j['min_ess_bulk'] / sampling_grads:.4g}" if ok else na, f"{total:.3g}",
           f"{j['min_ess_bulk'] / total:.4g}" if ok else na, f"{x1['ess_bulk'] / total:.4g}" if ok else na,
           f"{seconds:.0f}", f"{j['min_ess_bulk'] / seconds:.3g}" if ok else na]
    print("| " + " | ".join(row) + " |")
