"""The NUTS-vs-Stan table from bench/nuts_vs_stan.sh's output directory (markdown on stdout)."""
import json, os, statistics, sys

# Stan 2.21 NUTS, diag_e, adapt_delta 0.8, 4 x (1000 + 2000), measured on this machine kind (the
# NUTS issue): gradients per draw, ESS per gradient (paper convention: true or reference moments,
# minimum over dimensions; x1 for the funnels, median of 5 seeds).
STAN = {"icg": (7.4, 0.13), "scg": (28.6, 0.0061), "german": (13.6, 0.074), "australian": (9.1, 0.103),
        "heart": (7.5, 0.134), "funnel1": (28.0, 5.0e-4), "funnel3": (40.3, 1.9e-4)}

out = sys.argv[1]
rows = {}
for d in sorted(os.listdir(out)):
    f = os.path.join(out, d, "summary.json")
    if not os.path.isfile(f):
        continue
    name = d.rsplit("_s", 1)[0]
    s = json.load(open(f))
    p = s.get("paper_ess", {})
    funnel = name.startswith("funnel")
    ess_grad = p["ess_per_grad_x1"] if funnel else p["ess_per_grad_min"]
    rows.setdefault(name, []).append(dict(grads=s["grads_per_step"], ess_grad=ess_grad, ess_draw=ess_grad * s["grads_per_step"],
                                          div=s["divergences"], hits=s.get("tree_depth_hits", 0), accept=s["accept_rate"],
                                          rhat=s["max_rhat"], step=s["step_size"]))
print("| target | seeds | grads/draw (Stan) | ratio | ESS/grad (Stan) | ratio | ESS/draw (Stan) | ratio | accept | divergences | depth hits | max R-hat |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in ["icg", "scg", "german", "australian", "heart", "funnel1", "funnel3"]:
    if name not in rows:
        continue
    r = rows[name]
    med = lambda k: statistics.median(x[k] for x in r)
    g, e = med("grads"), med("ess_grad")
    sg, se = STAN[name]
    sd = sg * se
    what = " (x1)" if name.startswith("funnel") else ""
    print(f"| {name}{what} | {len(r)} | {g:.1f} ({sg}) | {g / sg:.2f} | {e:.3g} ({se}) | {e / se:.2f} | {med('ess_draw'):.3g} ({sd:.3g}) | "
          f"{med('ess_draw') / sd:.2f} | {med('accept'):.3f} | {sum(x['div'] for x in r)} | {sum(x['hits'] for x in r)} | "
          f"{max(x['rhat'] for x in r):.3f} |")
