#!/usr/bin/env python3
"""Lists includes that climb from a lower layer of the library to a higher one (Note [Layers]).
The build refuses them too; this says which, by file and line. Exit 1 if any."""
import pathlib, re, sys

LAYERS = [("core", ["core", "parallel"]), ("nn", ["nn"]), ("base", ["targets", "kernels", "diagnostics", "io"]),
          ("learn", ["flows", "training", "images"]), ("services", ["services"])]
level = {d: i for i, (_, dirs) in enumerate(LAYERS) for d in dirs}
root = pathlib.Path(__file__).resolve().parent.parent
bad = 0
for base in ("include/nmcmc", "src"):
    for f in sorted((root / base).rglob("*.[hc]pp")):
        rel = f.relative_to(root / base)
        if len(rel.parts) < 2 or rel.parts[0] not in level:
            continue
        own = level[rel.parts[0]]
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"nmcmc/([a-z_]+)/', line)
            if m and m.group(1) in level and level[m.group(1)] > own:
                print(f"{f.relative_to(root)}:{n}: {LAYERS[own][0]} includes {LAYERS[level[m.group(1)]][0]}: {line.strip()}")
                bad += 1
print(f"{bad} upward include(s)")
sys.exit(1 if bad else 0)
