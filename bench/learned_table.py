#!/usr/bin/env python3
"""Markdown table of bench/results/learned.jsonl beside the authors' PyTorch times (issue #3)."""
import json, sys

authors = {  # seconds per step of the authors' code on this machine kind (LibTorch 1.13 kernels, OpenBLAS, 1 thread)
    ("scg", "train", 1024): 0.0177, ("scg", "train", 256): 0.0151, ("scg", "sample", 256): 0.0059,
    ("icg", "train", 1024): 0.232, ("icg", "train", 256): 0.0742, ("icg", "sample", 256): 0.0290,
    ("funnel1", "train", 1024): 2.59, ("funnel1", "train", 128): 0.390, ("funnel1", "sample", 256): 0.239,
    ("funnel3", "train", 1024): 9.28, ("funnel3", "train", 128): 1.40, ("funnel3", "sample", 256): 0.861,
}
goal = lambda mode, batch: 0.8 if (mode == "train" and batch == 1024) else 0.5
rows = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "bench/results/learned.jsonl") if l.strip()]
print("| config | mode | batch | threads | s/step (ours) | authors' s/step | ratio (goal) | network GFLOP/s | peak RSS MB |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    key = (r["config"], r["mode"], r["batch"])
    a = authors.get(key) if r["threads"] == 1 else None
    ratio = "%.2f (<= %.1f) %s" % (r["seconds_per_step"] / a, goal(r["mode"], r["batch"]),
                                   "met" if r["seconds_per_step"] / a <= goal(r["mode"], r["batch"]) else "MISSED") if a else ""
    print("| %s | %s | %d | %d | %.4g | %s | %s | %.0f | %.0f |" % (r["config"], r["mode"], r["batch"], r["threads"],
          r["seconds_per_step"], ("%.4g" % a) if a else "", ratio, r["network_gflops_per_s"], r["peak_rss_mb"]))
