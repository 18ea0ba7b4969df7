#!/usr/bin/env python3
"""Self time per operator of a LibTorch chrome trace (nmcmc_bench learned --trace FILE), grouped:
GEMM (addmm/mm/bmm: the BLAS calls), the rest of the forward/backward arithmetic, allocation and
views, and the autograd engine's own overhead (time inside evaluate_function not spent in ops).
    /usr/bin/python3 bench/trace_table.py trace.json [steps]"""
import json
import sys
from collections import defaultdict

events = [e for e in json.load(open(sys.argv[1])) if e.get("ph") == "X"]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
events.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
self_time = defaultdict(float)
stack = []  # (end, event, children time)
total = 0.0
for e in events:
    start, end = e["ts"], e["ts"] + e["dur"]
    while stack and stack[-1][0] <= start:
        top = stack.pop()
        self_time[top[1]["name"]] += top[1]["dur"] - top[2]
    if stack:
        stack[-1][2] += e["dur"]
    else:
        total += e["dur"]
    stack.append([end, e, 0.0])
while stack:
    top = stack.pop()
    self_time[top[1]["name"]] += top[1]["dur"] - top[2]

GEMM = {"aten::addmm", "aten::addmm_", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear"}
ALLOC = {"aten::empty", "aten::empty_strided", "aten::zeros", "aten::zero_", "aten::fill_", "aten::copy_",
         "aten::as_strided", "aten::view", "aten::slice", "aten::select", "aten::t", "aten::transpose",
         "aten::expand", "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze",
         "aten::contiguous", "aten::clone", "aten::detach", "detach", "aten::resize_", "aten::to",
         "aten::_to_copy", "aten::narrow", "aten::permute", "aten::stride", "aten::split", "aten::chunk",
         "aten::cat", "aten::stack", "aten::index_select", "aten::empty_like", "aten::zeros_like",
         "aten::ones_like", "aten::full_like", "aten::result_type"}
groups = defaultdict(float)
for name, t in self_time.items():
    if name in GEMM:
        groups["GEMM (addmm, mm, bmm)"] += t
    elif (name.startswith("autograd::engine") or name.startswith("torch::autograd::CppNode")
          or name.endswith("Backward0") or name.endswith("Backward1")):
        groups["autograd engine and backward-node overhead"] += t
    elif name in ALLOC:
        groups["allocation, copies and views"] += t
    else:
        groups["other arithmetic (elementwise, reductions, RNG)"] += t
print(f"profiled time per step: {total / steps / 1e3:.1f} ms (profiler overhead included)")
for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"| {g} | {t / steps / 1e3:.1f} ms | {100 * t / total:.1f} % |")
print("top operators by self time:")
for name, t in sorted(self_time.items(), key=lambda kv: -kv[1])[:15]:
    print(f"  {name:<55} {t / steps / 1e3:8.2f} ms  {100 * t / total:5.1f} %")
