"""Mode weights of bench/transport_mixture.sh's runs: the fraction of draws in the weight-0.3 mode
(sum of x < 0) per run and per chain, with its MCSE by batch means (10 batches per chain) and
its distance from the truth in MCSE. Usage: mixture_weights.py RUN_DIR..."""
import sys, glob, numpy as np
for d in sys.argv[1:]:
    ind = []
    for f in sorted(glob.glob(d + "/chain_*.csv")):
        rows = [l for l in open(f) if not l.startswith("#")]
        head = rows[0].strip().split(",")
        a = np.array([[float(v) for v in r.split(",")] for r in rows[1:]])
        xs = a[:, [i for i, h in enumerate(head) if not h.endswith("__")]]
        ind.append((xs.sum(1) < 0).astype(float))  # in the weight-0.3 mode at -a
    ind = np.array(ind)  # [chains, draws]
    per_chain = ind.mean(1)
    # MCSE by batch means (10 batches per chain)
    b = ind.reshape(ind.shape[0], 10, -1).mean(2).ravel()
    w = ind.mean()
    mcse = b.std(ddof=1) / np.sqrt(len(b))
    print(f"{d}: weight of the -a mode {w:.3f} (true 0.300), MCSE {mcse:.3f}, z {(w - 0.3) / mcse if mcse > 0 else float('inf'):+.1f}; per chain {np.round(per_chain, 2)}")
