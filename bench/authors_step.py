#!/usr/bin/python3
"""Seconds per step of the authors' PyTorch code (NEM-MC/Entropy-NeuralMC, fetched separately and
never copied into nmcmc) on Funnel-1 (D = 100, sigma = 1) with the paper's MLP (width 512, N = 3
sub-steps, elu, gradient mode 'R'): one training step (sample_train) at a batch size, or one
sampling step (sample, one MH step) of a number of chains. Prints one JSON line, like
nmcmc_bench. With --autocast the steps run under PyTorch's CPU autocast to bfloat16 (its linear
layers' GEMMs in bfloat16: the counterpart of nmcmc's matmul = bfloat16). Run with
GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=536870912 it has
the malloc policy that nmcmc sets for itself (Note [Allocator policy]); "malloc" in the output says.
Usage: authors_step.py REPO --mode train|sample --batch B [--reps 10] [--threads 1] [--autocast]"""
import contextlib
import argparse
import json
import os
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", help="a checkout of NEM-MC/Entropy-NeuralMC")
    ap.add_argument("--mode", choices=["train", "sample"], default="train")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--autocast", action="store_true", help="torch.autocast('cpu', dtype=torch.bfloat16)")
    a = ap.parse_args()
    sys.path.insert(0, a.repo)
    from distributions import distributions
    from L2RW import L2GradRW_M
    from L2RW_models import L2GradRW
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    dist = distributions("funnel", d=a.dim, funnel_sig=a.sigma)
    rw = L2GradRW(dist.Ex, a.dim, a.hidden, a.steps, epsi=0.1, net_type="MLP", grad_mode="R", bias=True, act="elu")
    ctl = L2GradRW_M(rw, beta=1e-3, beta_max=1e3, rho_beta=0.03, adapt_beta=True, a_target=0.7, lr=1e-3,
                     N_steps=5000)
    x = dist.sample(a.batch)
    times = []
    for r in range(a.reps + 3):  # the first 3: warm-up
        t0 = time.perf_counter()
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast else contextlib.nullcontext()
        with amp:
            if a.mode == "train":
                x, _, _, _ = ctl.sample_train(dist.sample(a.batch))
            else:
                x, _, _, _ = ctl.sample(x, 1, grad=False)
        if r >= 3:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"bench": "authors", "mode": a.mode, "batch": a.batch, "threads": a.threads,
                      "torch": torch.__version__, "autocast": a.autocast,
                      "malloc": "heap-reuse" if "malloc.trim_threshold" in os.environ.get("GLIBC_TUNABLES", "") else "default",
                      "seconds_per_step": statistics.median(times), "reps": a.reps}))


if __name__ == "__main__":
    main()
