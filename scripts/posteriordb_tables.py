"""The benchmark tables of `scripts/posteriordb.py check --json` runs (its `table`, `metrics`,
`pairs` and `transport` commands): the learned sampler and NUTS through the flow against the best
NUTS, sampling only and all-in (Note [All-in accounting])."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "posteriordb"))
import ports  # noqa: E402


def _cost(r, goal, currency):
    """The cost of `goal` effective draws at a run's measured rates (Note [All-in accounting])."""
    return r[f"{currency}_for_{goal}"]


def _rate(r, currency):  # sampling cost per effective draw
    return (r["sampling_grads"] if currency == "grads" else r["sampling_seconds"]) / r["min_ess_bulk"]


def _break_even(l, nuts_runs, currency):
    """Effective draws from which the learned sampler is cheaper than every NUTS run (None: never)."""
    fixed = "fixed_grads" if currency == "grads" else "fixed_seconds"
    start = 0.0
    for n in nuts_runs:
        saving = _rate(n, currency) - _rate(l, currency)
        extra = l[fixed] - n[fixed]
        if saving <= 0:
            if extra >= 0:
                return None
            continue  # cheaper up front but not per draw: only short runs (ignored: the table is about long ones)
        start = max(start, extra / saving)
    return start


def table(nuts_jsons, learned_json: str) -> str:
    """The BENCHMARKS table: the learned sampler with its defaults against the best NUTS (of the
    runs given, one per metric; only those that pass the moment checks), per posterior."""
    runs = [{r["posterior"]: r for r in json.load(open(f))} for f in nuts_jsons]
    learned = {r["posterior"]: r for r in json.load(open(learned_json))}
    # every ratio is the best NUTS's cost over the learned sampler's: above 1 the learned sampler wins
    out = ["| posterior | D | moments: NUTS runs passing / learned | sampling only: bulk-ESS per grad, learned / best NUTS | "
           "all-in, 10k ESS: gradients best NUTS / learned | all-in, 10k ESS: seconds best NUTS / learned | "
           "learned: warm-up + training s (why it stopped) | break-even vs every NUTS (effective draws): gradients; seconds |",
           "|---" * 8 + "|"]
    for p, l in learned.items():
        nuts = [r[p] for r in runs if p in r]
        ok = [n for n in nuts if n["passes"]]
        both = l["passes"] and ok

        def best(f, highest=False):
            v = [(f(n), n.get("metric", "diag")) for n in ok]
            return (max if highest else min)(v) if v else (float("nan"), "-")

        dim = l["dim"]
        if not both:
            out.append(f"| {p} | {dim} | {len(ok)} of {len(nuts)} / {'pass' if l['passes'] else 'FAIL'} | n/a | n/a | n/a | "
                       f"{l.get('training_seconds', 0):.0f} ({l.get('stopped')}) | n/a |")
            continue
        g, gm = best(lambda n: n["ess_bulk_per_grad"] or 0, highest=True)
        cg, cgm = best(lambda n: _cost(n, 10000, "grads"))
        cs, csm = best(lambda n: _cost(n, 10000, "seconds"))
        beg, bes = _break_even(l, ok, "grads"), _break_even(l, ok, "seconds")

        def fmt_be(x):
            return "never" if x is None else ("always" if x == 0 else f"{x:.3g}")
        out.append(f"| {p} | {dim} | {len(ok)} of {len(nuts)} / pass | {(l['ess_bulk_per_grad'] or 0) / g:.3g}x ({gm}) | "
                   f"{cg / _cost(l, 10000, 'grads'):.3g}x ({cgm}) | {cs / _cost(l, 10000, 'seconds'):.3g}x ({csm}) | "
                   f"{l.get('training_seconds', 0):.0f} ({l.get('stopped')}) | {fmt_be(beg)}; {fmt_be(bes)} |")
    out.append("")
    out += _goal_counts(runs, learned)
    return "\n".join(out) + "\n"


def _goal_counts(runs, learned):
    """Issue #35's goals counted: the learned sampler ahead per sampling gradient, and in seconds to
    10,000 effective draws (all-in), against the best NUTS and against the first run given (NUTS
    with Stan's settings: the diagonal metric). A posterior where the learned sampler fails counts
    against it; one where no NUTS passes (or the first run has no row) is listed apart."""
    lines = []
    for name, pick in (("the best NUTS", runs), ("NUTS with Stan's settings (the first run given)", runs[:1])):
        grad_wins, sec_wins, counted, without = [], [], 0, []
        for p, l in learned.items():
            ok = [r[p] for r in pick if p in r and r[p]["passes"]]
            if not ok:
                without.append(p)
                continue
            counted += 1
            if not l["passes"]:
                continue
            if l["ess_bulk_per_grad"] > max(n["ess_bulk_per_grad"] or 0 for n in ok):
                grad_wins.append(p)
            if _cost(l, 10000, "seconds") < min(_cost(n, 10000, "seconds") for n in ok):
                sec_wins.append(p)
        lines.append(f"against {name}: ahead per sampling gradient on {len(grad_wins)} of {counted}; all-in in seconds to "
                     f"10,000 effective draws on {len(sec_wins)} of {counted} ({', '.join(sec_wins) or 'none'})"
                     + (f"; no passing NUTS run for {', '.join(without)}" if without else ""))
    return lines


def _median_range(values):
    """(median, smallest, largest) of a non-empty list."""
    v = sorted(values)
    med = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
    return med, v[0], v[-1]


def transport_table(flow_json: str, nuts_jsons) -> str:
    """NUTS through the flow transport (docs/transport.md) against the best NUTS without it (of the
    runs given, one per metric; only those that pass), per posterior: sampling-only bulk-ESS per
    gradient, all-in bulk-ESS per gradient (warm-up and the flow's rounds counted), and the cost of
    10,000 effective draws in seconds. Ratios above 1: the flow wins."""
    flow = {r["posterior"]: r for r in json.load(open(flow_json))}
    runs = [{r["posterior"]: r for r in json.load(open(f))} for f in nuts_jsons]
    out = ["| posterior | D | kind | kept (flow or its affine base) | flow passes | sampling ESS/grad: flow (x best NUTS) | "
           "all-in ESS/grad: flow (x best) | 10k ESS seconds: flow (best NUTS / flow) | max R-hat |", "|---" * 9 + "|"]
    wins = {"sampling": [], "all-in": [], "seconds": []}
    for p, f in flow.items():
        ok = [r[p] for r in runs if p in r and r[p]["passes"]]
        kept = f.get("transport_choice", "not recorded")
        if not f["passes"]:
            out.append(f"| {p} | {f['dim']} | {f['kind']} | {kept} | FAIL ({'; '.join(f['why'])[:60]}) | n/a | n/a | n/a | "
                       f"{f.get('max_rhat', float('nan')):.3f} |")
            continue
        if not ok:
            out.append(f"| {p} | {f['dim']} | {f['kind']} | {kept} | pass (no NUTS passes) | {f['ess_bulk_per_grad']:.3g} | "
                       f"{f['allin_ess_per_grad']:.3g} | {f['seconds_for_10000']:.0f} | {f['max_rhat']:.3f} |")
            continue
        g = max(ok, key=lambda n: n["ess_bulk_per_grad"] or 0)
        a = max(ok, key=lambda n: n["allin_ess_per_grad"])
        c = min(ok, key=lambda n: n["seconds_for_10000"])
        r1, r2, r3 = f["ess_bulk_per_grad"] / g["ess_bulk_per_grad"], f["allin_ess_per_grad"] / a["allin_ess_per_grad"], \
            c["seconds_for_10000"] / f["seconds_for_10000"]
        wins["sampling"].append(r1)
        wins["all-in"].append(r2)
        wins["seconds"].append(r3)
        out.append(f"| {p} | {f['dim']} | {f['kind']} | {kept} | pass | {f['ess_bulk_per_grad']:.3g} ({r1:.2f}x {g['metric']}) | "
                   f"{f['allin_ess_per_grad']:.3g} ({r2:.2f}x {a['metric']}) | {f['seconds_for_10000']:.0f} "
                   f"({r3:.2f}x {c['metric']}) | {f['max_rhat']:.3f} |")
    out.append("")
    for k, v in wins.items():
        if v:
            med, lo, hi = _median_range(v)
            out.append(f"{k}: flow / best NUTS median {med:.3g}x over {len(v)} posteriors (range {lo:.3g}-{hi:.3g}); "
                       f"the flow ahead on {sum(x > 1 for x in v)}")
    return "\n".join(out) + "\n"


def metrics_table(jsons) -> str:
    """NUTS with each metric against Stan's diagonal one (the first file), same posteriors: bulk-ESS
    per gradient and per second of sampling, the ratios to the diagonal metric's, and their medians."""
    runs = [{r["posterior"]: r for r in json.load(open(f))} for f in jsons]
    names = [next(iter(r.values())).get("metric", "?") if r else "?" for r in runs]
    head = "| posterior | D | " + " | ".join(f"{m}: ESS/grad (x diag)" for m in names) + " | " + \
        " | ".join(f"{m}: ESS/s" for m in names) + " |"
    out = [head, "|---|---|" + "---|" * (2 * len(names))]
    ratios = {m: [] for m in names[1:]}
    for p in runs[0]:
        rows = [r.get(p) for r in runs]
        base = rows[0]
        cells, secs = [], []
        for m, r in zip(names, rows):
            if r is None:
                cells.append("not run")
                secs.append("")
                continue
            if not r["passes"]:
                cells.append(f"FAIL ({'; '.join(r['why'])[:60]})")
                secs.append("")
                continue
            e = r["ess_bulk_per_grad"]
            if r is base or not base["passes"]:
                cells.append(f"{e:.3g}")
            else:
                ratios[m].append(e / base["ess_bulk_per_grad"])
                cells.append(f"{e:.3g} ({e / base['ess_bulk_per_grad']:.2f}x)")
            secs.append(f"{r['ess_bulk_per_second']:.3g}")
        out.append(f"| {p} | {base['dim']} | " + " | ".join(cells) + " | " + " | ".join(secs) + " |")
    out.append("")
    for m, v in ratios.items():
        if v:
            med, lo, hi = _median_range(v)
            out.append(f"{m}: median bulk-ESS per gradient {med:.3g}x the diagonal metric's over {len(v)} posteriors "
                       f"(range {lo:.3g}-{hi:.3g})")
    return "\n".join(out) + "\n"


def pairs_table(directory: str) -> str:
    """bench/posteriordb_pairs.sh's runs: per posterior, NUTS's (Stan's settings) all-in seconds to
    10,000 effective draws over the learned sampler's, pair by pair (one round: the two runs back to
    back), the median over rounds and its range; the count of posteriors where the learned sampler
    is ahead by the median. A pair where either run fails the moment checks has no ratio; a
    posterior where only NUTS fails in every round counts for the learned sampler (as in `table`)."""
    import glob
    import re
    import statistics
    runs = {}
    for f in glob.glob(os.path.join(directory, "*_r*.json")):
        m = re.match(r"(learned|nuts)_(.+)_r(\d+)\.json$", os.path.basename(f))
        if m:
            rows = json.load(open(f))
            if rows:
                runs[(m.group(1), m.group(2), int(m.group(3)))] = rows[0]
    posteriors = sorted({k[1] for k in runs}, key=lambda p: list(ports.PORTS).index(p) if p in ports.PORTS else 99)
    out = ["| posterior | rounds | learned: 10k ESS all-in, s (median) | NUTS, Stan's settings: the same (median) | "
           "NUTS / learned, pair by pair: median (range) | ahead |", "|---|---|---|---|---|---|"]
    ahead, level, counted = [], [], 0
    for p in posteriors:
        rounds = sorted({k[2] for k in runs if k[1] == p})
        ratios, secs_l, secs_n, nuts_failed, learned_failed = [], [], [], 0, 0
        for r in rounds:
            lr, nr = runs.get(("learned", p, r)), runs.get(("nuts", p, r))
            if lr is None or nr is None:
                continue
            if not lr.get("passes"):
                learned_failed += 1
                continue
            secs_l.append(lr["seconds_for_10000"])
            if not nr.get("passes"):
                nuts_failed += 1
                continue
            secs_n.append(nr["seconds_for_10000"])
            ratios.append(nr["seconds_for_10000"] / lr["seconds_for_10000"])
        counted += 1
        if not secs_l and not ratios:
            out.append(f"| {p} | {len(rounds)} | failed the moment checks | | | no |")
            continue
        if ratios:
            med = statistics.median(ratios)
            win = med > 1
            cell = f"{med:.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            if abs(med - 1) < 0.05:
                level.append(p)
            if nuts_failed or learned_failed:
                cell += f"; NUTS failed in {nuts_failed}, learned in {learned_failed} round(s)"
        else:
            win = True
            cell = "NUTS failed the moment checks in every round"
        if win:
            ahead.append(p)
        out.append(f"| {p} | {len(rounds)} | {statistics.median(secs_l):.2f} | "
                   f"{statistics.median(secs_n):.2f} | {cell} | {'yes' if win else 'no'} |" if secs_n else
                   f"| {p} | {len(rounds)} | {statistics.median(secs_l):.2f} | failed | {cell} | {'yes' if win else 'no'} |")
    out.append("")
    out.append(f"the learned sampler ahead of NUTS with Stan's settings, all-in seconds to 10,000 effective draws, "
               f"by the median pair: {len(ahead)} of {counted} ({', '.join(ahead) or 'none'}); "
               f"level within 5 % by the median pair: {', '.join(level) or 'none'}")
    return "\n".join(out) + "\n"


def _status(r):
    """'pass', or why a run has no ratio: not converged (R-hat above 1.01), or its first failed check."""
    if r is None:
        return "not run"
    if r["passes"]:
        return "pass"
    if "max_rhat" not in r:
        return "FAIL: " + ("; ".join(r["why"]) or "?")[:70]
    if r["max_rhat"] > 1.01:
        worst = f", {r['worst_rhat_quantity']}" if r.get("worst_rhat_quantity") else ""
        return f"not converged (R-hat {r['max_rhat']:.3f}{worst})"
    return "FAIL: " + "; ".join(r["why"])[:70]


def large_table(learned_json: str, flow_json: str, nuts_jsons) -> str:
    """The large suite (Note [The large suite]; issue #64's accounting): per posterior the best NUTS
    of the metrics run (only runs that pass every check), NUTS through the flow and the learned
    sampler with its defaults, each as all-in seconds to 10,000 effective draws (warm-up,
    preconditioner, fits, training and sampling counted), with the ratio to the best NUTS (above 1:
    it wins) and the sampling-only bulk-ESS per gradient beside it; then the issue's goals counted."""
    runs = [{r["posterior"]: r for r in json.load(open(f))} for f in nuts_jsons]
    learned = {r["posterior"]: r for r in json.load(open(learned_json))}
    flow = {r["posterior"]: r for r in json.load(open(flow_json))} if flow_json and os.path.exists(flow_json) else {}
    out = ["| posterior | D | NUTS runs passing | best NUTS: all-in s, grads to 10k (metric); sampling ESS/grad | "
           "NUTS through the flow: all-in s (x best NUTS), grads; ESS/grad | learned: all-in s (x best NUTS), grads; "
           "ESS/grad (x best) | learned: warm-up + training s (stop) |", "|---" * 7 + "|"]
    slow, learned_wins, flow_wins, misses, no_nuts = [], [], [], [], []
    for p, l in learned.items():
        nuts = [r[p] for r in runs if p in r]
        ok = [n for n in nuts if n["passes"]]
        best = min(ok, key=lambda n: n["seconds_for_10000"]) if ok else None
        best_g = max(ok, key=lambda n: n["ess_bulk_per_grad"] or 0) if ok else None
        nuts_cell = (f"{best['seconds_for_10000']:.0f}, {best['grads_for_10000']:.3g} ({best['metric']}); "
                     f"{best_g['ess_bulk_per_grad']:.3g}" if best else
                     "none passes (" + ", ".join(f"{n['metric']} {_status(n)}" for n in nuts) + ")")
        f = flow.get(p)
        if f is None:
            flow_cell = "not run"
        elif not f["passes"]:
            flow_cell = _status(f)
        else:
            ratio = f" ({best['seconds_for_10000'] / f['seconds_for_10000']:.2f}x)" if best else ""
            flow_cell = f"{f['seconds_for_10000']:.0f}{ratio}, {f['grads_for_10000']:.3g}; {f['ess_bulk_per_grad']:.3g}"
        if not l["passes"]:
            learned_cell = _status(l)
        else:
            ratio = f" ({best['seconds_for_10000'] / l['seconds_for_10000']:.2f}x)" if best else ""
            gratio = f" ({l['ess_bulk_per_grad'] / best_g['ess_bulk_per_grad']:.2f}x)" if best_g else ""
            learned_cell = f"{l['seconds_for_10000']:.0f}{ratio}, {l['grads_for_10000']:.3g}; {l['ess_bulk_per_grad']:.3g}{gratio}"
        fixed = l.get("training_seconds")
        out.append(f"| {p} | {l['dim']} | {len(ok)} of {len(nuts)} | {nuts_cell} | {flow_cell} | {learned_cell} | "
                   f"{fixed:.0f} ({l.get('stopped')}) |" if fixed is not None else
                   f"| {p} | {l['dim']} | {len(ok)} of {len(nuts)} | {nuts_cell} | {flow_cell} | {learned_cell} | n/a |")
        if best is None:
            no_nuts.append(p)
            continue
        if not l["passes"]:
            misses.append(p)
        if best["seconds_for_10000"] >= 60:
            slow.append(p)
            if l["passes"] and l["seconds_for_10000"] < best["seconds_for_10000"]:
                learned_wins.append(p)
            if f is not None and f["passes"] and f["seconds_for_10000"] < best["seconds_for_10000"]:
                flow_wins.append(p)
    out.append("")
    out.append(f"the learned sampler passes where the best NUTS passes: {len(learned) - len(no_nuts) - len(misses)} of "
               f"{len(learned) - len(no_nuts)}" + (f" (misses: {', '.join(misses)})" if misses else ""))
    out.append(f"where the best NUTS needs 60 s or more to 10,000 effective draws ({len(slow)}: {', '.join(slow) or 'none'}): "
               f"the learned sampler ahead all-in on {len(learned_wins)} ({', '.join(learned_wins) or 'none'}), "
               f"NUTS through the flow on {len(flow_wins)} ({', '.join(flow_wins) or 'none'})")
    if no_nuts:
        passed = [p for p in no_nuts if learned[p]["passes"]]
        out.append(f"no NUTS metric passes on {len(no_nuts)} ({', '.join(no_nuts)}); the learned sampler passes on "
                   f"{len(passed)} of them ({', '.join(passed) or 'none'})")
    return "\n".join(out) + "\n"
