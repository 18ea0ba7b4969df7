#!/usr/bin/python3
"""nmcmc's figures and run reports, drawn with matplotlib.

(Over 500 lines: every figure kind and the HTML report in one script that the program runs.)
    nmcmc_plot.py render SPEC.figure.json ...   draw figures the C++ program described
    nmcmc_plot.py report RUN_DIR [--output F]   one HTML page about a run directory

`nmcmc` calls this script itself (`nmcmc report`, `nmcmc figures`, and at the end of demo,
reproduce, compare and ebm); it needs Debian's python3-matplotlib, and for reports
python3-xarray with python3-netcdf4 (the Stan CSV is read with pandas when a run has no NetCDF).

A figure spec (written by src/io/plot.cpp) is JSON:
    {"type": "panels", "title", "caption", "columns", "panels": [
        {"title", "xlabel", "ylabel", "log_y", "xlim", "ylim",
         "series": [{"kind": "line" | "scatter", "x", "y", "label", "colour", "size", "alpha"},
                    {"kind": "density", "extent": [x0, x1, y0, y1], "values": [[row y0 ...]], "label"}]}]}
    {"type": "image_grid", "title", "caption", "columns", "images": [N][H][W] or [N][H][W][3] in [0, 1],
     "captions": [N strings], "row_labels": [strings]}
Each is drawn as STEM.png (150 dpi) and STEM.svg beside the spec, written atomically.
"""
import argparse
import base64
import datetime
import html
import json
import math
import os
import sys
import tempfile

# Okabe-Ito: readable by colour-blind readers (the C++ side's palette indices).
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
                         "figure.dpi": 100, "savefig.dpi": 150, "axes.spines.top": False,
                         "axes.spines.right": False, "svg.fonttype": "none"})
    return plt


def colour(c):
    if isinstance(c, int):
        return PALETTE[c % len(PALETTE)]
    return c or PALETTE[0]


def save(fig, stem, formats=("png", "svg")):
    """Writes STEM.png and STEM.svg atomically (a reader never sees half a file)."""
    out = []
    directory = os.path.dirname(os.path.abspath(stem))
    for ext in formats:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="." + ext, dir=directory)
        os.close(fd)
        try:
            fig.savefig(tmp, format=ext, bbox_inches="tight")
            os.replace(tmp, stem + "." + ext)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        out.append(stem + "." + ext)
    return out


def add_caption(fig, caption, below_legend=False):
    if caption:
        height = fig.get_size_inches()[1]
        fig.text(0.5, -0.45 / height if below_legend else 0.0, caption, ha="center", va="top", fontsize=9, wrap=True)


def legend_below(ax, handles=None, labels=None):
    """A legend under the axes: it never covers data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(handles), 4),
                  frameon=False, markerscale=2)


def robust_ylim(ax, values, title):
    """Early points far off the rest (a training loss's first steps) would flatten the curve: the
    axis shows the 2-98 % range, and the title says so."""
    import numpy as np
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 20:
        return
    lo, hi = np.percentile(v, [2, 98])
    if hi > lo and (v.min() < lo - (hi - lo) or v.max() > hi + (hi - lo)):
        ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
        ax.set_title(title + "\n(2-98 % range; early points off the scale)")


def render_panels(spec, stem):
    plt = _plt()
    fig = build_panels(spec)
    out = save(fig, stem)
    plt.close(fig)
    return out


def build_panels(spec):
    """The matplotlib figure of a "panels" spec."""
    plt = _plt()
    from matplotlib.patches import Patch
    panels = spec["panels"]
    columns = max(1, min(spec.get("columns") or len(panels), len(panels)))
    rows = math.ceil(len(panels) / columns)
    w, h = spec.get("panel_size") or [4.6, 3.3]
    fig, axes = plt.subplots(rows, columns, figsize=(w * columns, h * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    legend = {}  # one legend for the figure, under all panels: it never covers data
    for ax, p in zip(axes.flat, panels):
        extra_handles = []
        for s in p.get("series", []):
            kind = s.get("kind", "line")
            if kind == "line":
                ax.plot(s["x"], s["y"], color=colour(s.get("colour")), lw=s.get("width", 1.3), alpha=s.get("alpha", 1.0),
                        label=s.get("label") or None)
            elif kind == "scatter":
                ax.scatter(s["x"], s["y"], s=s.get("size", 4) ** 2 / 2, color=colour(s.get("colour")),
                           alpha=s.get("alpha", 0.6), linewidths=0, label=s.get("label") or None, rasterized=True)
            elif kind == "density":
                x0, x1, y0, y1 = s["extent"]
                ax.imshow(s["values"], origin="lower", extent=(x0, x1, y0, y1), aspect="auto", cmap="Greys",
                          alpha=0.75, interpolation="bilinear", zorder=0)
                if s.get("label"):
                    extra_handles.append(Patch(facecolor="0.6", label=s["label"]))
            else:
                raise ValueError(f"unknown series kind {kind!r}")
        ax.set_title(p.get("title", ""))
        ax.set_xlabel(p.get("xlabel", ""))
        ax.set_ylabel(p.get("ylabel", ""))
        if p.get("log_y"):
            # A log axis over less than a decade only garbles the tick labels: linear then.
            ys = [v for s_ in p.get("series", []) if s_.get("kind") in ("line", "scatter")
                  for v in s_["y"] if v is not None and v > 0]
            if ys and max(ys) / min(ys) >= 10:
                ax.set_yscale("log")
        if p.get("robust_y"):
            robust_ylim(ax, [v for s_ in p.get("series", []) if s_.get("kind") == "line" for v in s_["y"]],
                        p.get("title", ""))
        if p.get("xlim"):
            ax.set_xlim(*p["xlim"])
        if p.get("ylim"):
            ax.set_ylim(*p["ylim"])
        ax.grid(alpha=0.25)
        handles, labels = ax.get_legend_handles_labels()
        for h in extra_handles:
            handles.append(h)
            labels.append(h.get_label())
        for h, label in zip(handles, labels):
            if label not in legend:
                legend[label] = h
    if spec.get("title"):
        fig.suptitle(spec["title"], fontsize=12)
    if len(legend) > 1 or (legend and spec.get("legend_single")):
        fig.legend(list(legend.values()), list(legend.keys()), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(len(legend), 5), frameon=False, markerscale=2)
    add_caption(fig, spec.get("caption"), below_legend=len(legend) > 1)
    return fig


def render_image_grid(spec, stem):
    import numpy as np
    plt = _plt()
    images = np.asarray(spec["images"], dtype=float)
    n = len(images)
    columns = max(1, min(spec.get("columns") or 8, n))
    rows = math.ceil(n / columns)
    captions = spec.get("captions") or [""] * n
    cell = spec.get("cell_size", 1.05)
    fig, axes = plt.subplots(rows, columns, figsize=(cell * columns, (cell + 0.22) * rows + 0.4), squeeze=False,
                             layout="constrained")
    for k, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ax.spines.values():
            side.set_visible(False)
        if k >= n:
            ax.set_visible(False)
            continue
        img = np.clip(images[k], 0, 1)
        ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
        if captions[k]:
            ax.set_title(captions[k], fontsize=7, pad=2)
    for r, label in enumerate(spec.get("row_labels") or []):
        if r < rows:
            axes[r][0].set_ylabel(label, fontsize=8)
    if spec.get("title"):
        fig.suptitle(spec["title"], fontsize=11)
    add_caption(fig, spec.get("caption"))
    out = save(fig, stem)
    plt.close(fig)
    return out


def render(paths):
    drawn = []
    for path in paths:
        if not path.endswith(".figure.json"):
            raise ValueError(f"{path}: not a figure spec (*.figure.json)")
        with open(path) as f:
            spec = json.load(f)
        stem = path[: -len(".figure.json")]
        kind = spec.get("type")
        if kind == "panels":
            drawn += render_panels(spec, stem)
        elif kind == "image_grid":
            drawn += render_image_grid(spec, stem)
        else:
            raise ValueError(f"{path}: unknown figure type {kind!r}")
    return drawn


# ---------------------------------------------------------------------------------------------
# Reports


class Run:
    """What a run directory holds: summary.json, the draws (NetCDF, else Stan CSV), compare.json."""

    def __init__(self, directory):
        self.dir = directory
        self.summary = self._json("summary.json")
        self.compare = self._json("compare.json")
        self.nc = os.path.join(directory, "inference_data.nc")
        self.csvs = sorted((f for f in os.listdir(directory) if f.startswith("chain_") and f.endswith(".csv")),
                           key=lambda f: int(f[6:-4]) if f[6:-4].isdigit() else 0)
        self.names = [p["name"] for p in self.summary["parameters"]] if self.summary else []
        self.source = "netcdf" if os.path.exists(self.nc) else "csv" if self.csvs else None
        self._csv_frames = None

    def _json(self, name):
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def _frames(self):
        if self._csv_frames is None:
            import pandas as pd
            self._csv_frames = [pd.read_csv(os.path.join(self.dir, f), comment="#") for f in self.csvs]
        return self._csv_frames

    def columns(self, indices):
        """Draws of the parameters `indices` (in summary order) as an array [C, S, k]."""
        import numpy as np
        if self.source == "netcdf":
            import xarray as xr
            with xr.open_dataset(self.nc, group="posterior") as post:
                flat = []  # (variable, index or None) per parameter, in the file's (= parameter) order
                for name, var in post.data_vars.items():
                    if var.ndim == 2:
                        flat.append((name, None))
                    else:
                        flat += [(name, i) for i in range(var.shape[2])]
                out = []
                for k in indices:
                    name, i = flat[k]
                    v = post[name]
                    out.append(np.asarray(v.values if i is None else v[:, :, i].values, dtype=float))
                return np.stack(out, axis=-1)
        frames = self._frames()
        first = [c for c in frames[0].columns if not c.endswith("__")]
        return np.stack([f[[first[k] for k in indices]].to_numpy(dtype=float) for f in frames], axis=0)

    def stats(self):
        """Per-draw statistics [C, S] by name (lp, acceptance_rate, n_steps, diverging, ...)."""
        import numpy as np
        if self.source == "netcdf":
            import xarray as xr
            with xr.open_dataset(self.nc, group="sample_stats") as st:
                return {k: np.asarray(v.values) for k, v in st.data_vars.items()}
        rename = {"lp__": "lp", "accept_stat__": "acceptance_rate", "divergent__": "diverging",
                  "treedepth__": "tree_depth", "n_leapfrog__": "n_steps", "n_grad__": "n_steps", "energy__": "energy"}
        frames = self._frames()
        return {rename[c]: np.stack([f[c].to_numpy() for f in frames]) for c in frames[0].columns if c in rename}

    def training(self):
        if self.source != "netcdf":
            return None
        import xarray as xr
        try:
            with xr.open_dataset(self.nc, group="nmcmc_training") as t:
                return {"step": t["step"].values, **{k: v.values for k, v in t.data_vars.items()}}
        except (OSError, KeyError, ValueError):
            return None


def autocorrelation(x, max_lag):
    """Mean over chains of the autocorrelation of x [C, S] at lags 0..max_lag (FFT)."""
    import numpy as np
    c, s = x.shape
    y = x - x.mean(axis=1, keepdims=True)
    n = 1 << (2 * s - 1).bit_length()
    f = np.fft.rfft(y, n)
    acov = np.fft.irfft(f * np.conj(f), n)[:, : max_lag + 1] / s
    var = acov[:, :1]
    var[var == 0] = 1
    return (acov / var).mean(axis=0)


def thin_index(n, most):
    import numpy as np
    return np.unique(np.linspace(0, n - 1, min(n, most)).round().astype(int))


def report_figures(run, fig_dir):
    """Draws the report's figures; returns [(title, stem, caption)]."""
    import numpy as np
    plt = _plt()
    figures = []
    params = run.summary["parameters"]
    chains = run.summary["chains"]
    draws = run.summary["draws"]
    ess = np.array([p["ess_bulk"] if p["ess_bulk"] is not None else np.nan for p in params], dtype=float)
    order = np.argsort(np.where(np.isfinite(ess), ess, -1))  # NaN (stuck) first
    worst = [int(k) for k in order[: min(4, len(params))]]
    names = [params[k]["name"] for k in worst]
    x = run.columns(worst)  # [C, S, k]
    stats = run.stats()
    show = min(chains, 8)
    cols = [PALETTE[k % len(PALETTE)] for k in range(show)]
    divergent = stats.get("diverging")

    # Traces and rank plots of the worst-mixing parameters (and lp).
    series = [(n, x[:, :, j]) for j, n in enumerate(names)]
    if "lp" in stats:
        series.append(("lp (log density)", stats["lp"].astype(float)))
    fig, axes = plt.subplots(len(series), 2, figsize=(11, 2.2 * len(series) + 0.6), squeeze=False,
                             layout="constrained", gridspec_kw={"width_ratios": [2.2, 1]})
    idx = thin_index(draws, 2000)
    for row, (name, v) in enumerate(series):
        ax = axes[row][0]
        for c in range(min(show, 4)):  # more overlaid traces only hide each other
            ax.plot(idx, v[c, idx], color=cols[c], lw=0.6, alpha=0.8, label=f"chain {c + 1}")
        ax.set_ylabel(name)
        if row == len(series) - 1:
            ax.set_xlabel("draw (after warm-up)")
        ax.grid(alpha=0.25)
        # Rank plot (Vehtari et al. 2021): ranks over all chains, one histogram per chain; uniform when mixed.
        ranks = np.argsort(np.argsort(v.reshape(-1), kind="stable"), kind="stable").reshape(v.shape)
        ranks = ranks / v.size
        bins = np.linspace(0, 1, 21)
        ax = axes[row][1]
        expected = v.shape[1] / 20
        for c in range(show):
            h, _ = np.histogram(ranks[c], bins=bins)
            ax.step(bins[:-1], c + 0.8 * h / (2 * expected), where="post", color=cols[c], lw=1)
            ax.axhline(c + 0.4, color="0.6", lw=0.5, ls="--")
        ax.set_yticks(range(show), [str(c + 1) for c in range(show)])
        ax.set_ylabel("chain")
        if row == len(series) - 1:
            ax.set_xlabel("rank of draw / number of draws (all chains pooled)")
    axes[0][0].set_title(f"traces of {min(show, 4)} chains" + (f" (every {max(1, draws // len(idx))}th draw)" if len(idx) < draws else ""))
    axes[0][1].set_title(f"rank plots of {show} chains (dashed: uniform)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if len(handles) > 1:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.35, 0.0), ncol=len(handles), frameon=False)
    stem = os.path.join(fig_dir, "traces_ranks")
    save(fig, stem)
    plt.close(fig)
    figures.append(("Traces and rank plots", stem,
                    f"The {len(names)} parameters with the smallest bulk ESS, and lp; of {chains} chains, "
                    f"the first {min(show, 4)} (traces) and {show} (rank plots). "
                    "Rank plots are uniform (flat at the dashed line) when the chains agree."))

    # Autocorrelation.
    max_lag = max(1, min(200, draws // 2))
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.0), squeeze=False, layout="constrained")
    for j, name in enumerate(names):
        ax = axes[0][j]
        r = autocorrelation(x[:, :, j], max_lag)
        ax.bar(np.arange(max_lag + 1), r, width=1.0, color=PALETTE[0])
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"{name}: bulk ESS {ess[worst[j]]:.0f}")
        ax.set_xlabel("lag (draws)")
        ax.set_ylabel("autocorrelation" if j == 0 else "")
        ax.set_ylim(min(-0.2, r.min() - 0.05), 1.05)
    stem = os.path.join(fig_dir, "autocorrelation")
    save(fig, stem)
    plt.close(fig)
    figures.append(("Autocorrelation", stem, "Mean over chains of each chain's autocorrelation, for the same parameters."))

    # Pair plot of the worst-mixing parameters, divergent transitions marked.
    k = min(3, len(names))
    if k >= 2:
        flat = x[:, :, :k].reshape(-1, k)
        div = divergent.reshape(-1).astype(bool) if divergent is not None else np.zeros(len(flat), bool)
        pick = thin_index(len(flat), 5000)
        fig, axes = plt.subplots(k, k, figsize=(2.8 * k, 2.8 * k), squeeze=False, layout="constrained")
        for a in range(k):
            for b in range(k):
                ax = axes[a][b]
                if a == b:
                    ax.hist(flat[:, a], bins=50, color=PALETTE[0], alpha=0.8)
                    ax.set_yticks([])
                elif a > b:
                    ax.scatter(flat[pick, b], flat[pick, a], s=2, color=PALETTE[0], alpha=0.4, linewidths=0,
                               rasterized=True, label="draw")
                    d = pick[div[pick]]
                    if len(d):
                        ax.scatter(flat[d, b], flat[d, a], s=6, color=PALETTE[1], label="divergent")
                else:
                    ax.set_visible(False)
                if a == k - 1:
                    ax.set_xlabel(names[b])
                if b == 0 and a > 0:
                    ax.set_ylabel(names[a])
        handles, labels = axes[k - 1][0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False, markerscale=3)
        stem = os.path.join(fig_dir, "pairs")
        save(fig, stem)
        plt.close(fig)
        figures.append(("Pair plot", stem,
                        f"The {k} worst-mixing parameters ({len(pick)} of {len(flat)} draws, evenly spaced); "
                        f"{int(div.sum())} divergent transitions in all, in orange where shown."))

    # Sampler statistics.
    panels = [("acceptance_rate", "acceptance statistic", "accept probability of the step")]
    if "n_steps" in stats:
        panels.append(("n_steps", "gradient evaluations per draw", "gradients"))
    if "energy" in stats:
        panels.append(("energy", "energy: marginal vs transitions", "centred energy"))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.0), squeeze=False, layout="constrained")
    for ax, (key, title, xlabel) in zip(axes[0], panels):
        v = stats[key].astype(float)
        if key == "energy":
            e = v - v.mean()
            ax.hist(e.reshape(-1), bins=50, alpha=0.6, color=PALETTE[0], density=True, label="energy")
            ax.hist(np.diff(v, axis=1).reshape(-1), bins=50, alpha=0.6, color=PALETTE[1], density=True,
                    label="energy change")
            de = np.diff(v, axis=1)
            bfmi = (de ** 2).mean(axis=1) / v.var(axis=1).clip(1e-300)
            ax.set_title(f"{title}\nE-BFMI min {bfmi.min():.2f}")
            legend_below(ax)
        else:
            ax.hist(v.reshape(-1), bins=40, color=PALETTE[2])
            ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("draws" if key != "energy" else "density")
    stem = os.path.join(fig_dir, "sampler_stats")
    save(fig, stem)
    plt.close(fig)
    figures.append(("Sampler statistics", stem, "Per-draw statistics over all chains."
                    + (" E-BFMI below 0.3 signals poor exploration of the energy (NUTS)." if "energy" in stats else "")))

    # Training curves of a learned sampler.
    t = run.training()
    if t is not None:
        keys = [("accept", "accept rate", False), ("beta", "β (entropy weight)", True),
                ("entropy", "proposal entropy (nats, + const)", False), ("eps", "step size ε", True),
                ("loss", "training loss", False)]
        keys = [k for k in keys if k[0] in t]
        fig, axes = plt.subplots(1, len(keys), figsize=(3.3 * len(keys), 2.9), squeeze=False, layout="constrained")
        for ax, (key, title, log) in zip(axes[0], keys):
            v = np.asarray(t[key], dtype=float)
            ax.plot(t["step"], v, color=PALETTE[0], lw=1.2)
            ax.set_title(title)
            ax.set_xlabel("training step")
            finite = v[np.isfinite(v)]
            if log and len(finite) and np.all(finite > 0) and finite.max() / finite.min() >= 10:
                ax.set_yscale("log")
            else:
                robust_ylim(ax, finite, title)
            ax.grid(alpha=0.25)
        stem = os.path.join(fig_dir, "training")
        save(fig, stem)
        plt.close(fig)
        figures.append(("Training of the learned sampler", stem, "The training log the model was saved with."))
    return figures


def _fmt(v, digits=4):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.{digits}g}"
    return html.escape(str(v))


def _table(header, rows, classes=None):
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _markdown_table(text):
    """The compare table (markdown) as HTML; other lines as paragraphs."""
    out, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
            continue
        if rows:
            out.append(_table(rows[0], [[html.escape(c) for c in r] for r in rows[1:]]))
            rows = []
        if line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    return "\n".join(out)


def _img(stem, report_dir, alt):
    with open(stem + ".png", "rb") as f:
        data = base64.b64encode(f.read()).decode()
    svg = os.path.relpath(stem + ".svg", report_dir)
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{{caption}} <a href="{html.escape(svg)}">SVG</a></figcaption></figure>')


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.92em} code{background:#f4f4f4;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0} th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f6f8} td:first-child,th:first-child{text-align:left}
tr.bad td{background:#fde8e8} tr.warn td{background:#fff6e0}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
.note{background:#fff6e0;border-left:4px solid #E69F00;padding:.5em 1em}
"""


def report(run_dir, output=None):
    run = Run(run_dir)
    if run.summary is None and run.compare is None:
        raise ValueError(f"{run_dir}: no summary.json or compare.json: not an nmcmc run directory "
                         "(from `nmcmc sample --output`, `nmcmc compare --output` or `nmcmc demo`)")
    output = output or os.path.join(run_dir, "report.html")
    report_dir = os.path.dirname(os.path.abspath(output))
    fig_dir = os.path.join(report_dir, "report_files")
    os.makedirs(fig_dir, exist_ok=True)
    parts = []
    if run.summary is not None:
        s = run.summary
        cfg = s.get("config", {})
        title = f"{cfg.get('sampler', 'run')} on {json.dumps(s.get('target'))}"
        parts.append(f"<h1>nmcmc run: {html.escape(title)}</h1>")
        parts.append(f'<p class="meta">{html.escape(os.path.abspath(run_dir))}<br>'
                     f"{s['chains']} chains &times; {s['draws']:,} draws"
                     f" (planned {s.get('draws_planned', s['draws']):,}), seed {s.get('seed')}; "
                     f"nmcmc {html.escape(str(cfg.get('nmcmc_version', '')))}; report written "
                     f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}<br>"
                     f"<code>{html.escape(str(cfg.get('command', '')))}</code></p>")
        if not s.get("complete", True):
            parts.append('<p class="note">This run was interrupted: the report shows the draws written before it '
                         "stopped.</p>")
        bad_rhat = s.get("max_rhat") is not None and s["max_rhat"] > 1.01
        if bad_rhat or s.get("divergences", 0) > 0:
            parts.append('<p class="note">' + "; ".join(
                ([f"max R-hat {s['max_rhat']:.3f} &gt; 1.01: the chains disagree"] if bad_rhat else [])
                + ([f"{s['divergences']} divergent transitions"] if s.get("divergences", 0) else []))
                + ".</p>")
        eff = [("accept rate", s.get("accept_rate")), ("step size", s.get("step_size")),
               ("gradient evaluations per draw", s.get("grads_per_step")),
               ("divergences", s.get("divergences")), ("min bulk ESS", s.get("min_ess_bulk")),
               ("min tail ESS", s.get("min_ess_tail")), ("max R-hat", s.get("max_rhat")),
               ("bulk ESS per draw", s.get("ess_bulk_per_step")), ("bulk ESS per gradient", s.get("ess_bulk_per_grad")),
               ("bulk ESS per second", s.get("ess_bulk_per_second")),
               ("warm-up / sampling time (s)", f"{s.get('seconds_warmup', 0):.2f} / {s.get('seconds_sampling', 0):.2f}")]
        if "mean_tree_depth" in s:
            eff.append(("mean tree depth (hits of the limit)", f"{s['mean_tree_depth']:.2f} ({s['tree_depth_hits']})"))
        if "paper_ess" in s:
            eff.append(("paper ESS per draw, min over dims (known moments)", s["paper_ess"].get("ess_per_step_min")))
        parts.append("<h2>Efficiency</h2>")
        parts.append(_table(["statistic", "value"], [[html.escape(k), v if isinstance(v, str) else _fmt(v)]
                                                      for k, v in eff]))
        params = s["parameters"]
        shown = list(range(len(params)))
        note = ""
        if len(params) > 40:
            by_ess = sorted(range(len(params)), key=lambda k: (params[k]["ess_bulk"] or -1))
            shown = sorted(set(range(10)) | set(by_ess[:20]))
            note = f" (the first 10 and the 20 with the smallest bulk ESS, of {len(params)})"
        parts.append(f"<h2>Parameters{note}</h2>")
        rows, classes = [], []
        for k in shown:
            p = params[k]
            rows.append([html.escape(p["name"])] + [_fmt(p[c]) for c in
                                                    ("mean", "sd", "mcse_mean", "q05", "q50", "q95", "ess_bulk",
                                                     "ess_tail", "rhat")])
            r, e = p.get("rhat"), p.get("ess_bulk")
            classes.append("bad" if r is not None and r > 1.01 else
                           "warn" if e is not None and e < 100 * min(s["chains"], 4) else "")
        parts.append(_table(["parameter", "mean", "sd", "MCSE", "5%", "50%", "95%", "bulk ESS", "tail ESS", "R-hat"],
                            rows, classes))
        parts.append('<p class="meta">Red: R-hat &gt; 1.01. Amber: bulk ESS below 100 per chain (at most 4 chains '
                     "counted). ESS and R-hat are Stan's rank-normalised split versions (Vehtari et al. 2021).</p>")
        if run.source is None:
            parts.append('<p class="note">No draws in this directory (written with --format? moved?): figures need '
                         "inference_data.nc or chain_N.csv.</p>")
        else:
            for title_, stem, caption in report_figures(run, fig_dir):
                parts.append(f"<h2>{html.escape(title_)}</h2>")
                parts.append(_img(stem, report_dir, title_).replace("{caption}", html.escape(caption)))
    if run.compare is not None:
        parts.append("<h1>Sampler comparison</h1>" if run.summary is None else "<h2>Sampler comparison</h2>")
        md = os.path.join(run_dir, "compare.md")
        if os.path.exists(md):
            with open(md) as f:
                parts.append(_markdown_table(f.read()))
        stem = os.path.join(run_dir, "compare_traces")
        if os.path.exists(stem + ".png"):
            parts.append(_img(stem, report_dir, "compare traces").replace(
                "{caption}", f"Chain 1 of each sampler on {html.escape(str(run.compare.get('trace_parameter')))}, "
                             "the parameter NUTS mixes worst."))
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>nmcmc report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".html", dir=report_dir)
    with os.fdopen(fd, "w") as f:
        f.write(page)
    os.replace(tmp, output)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nmcmc_plot.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="draw figure specs (*.figure.json) as PNG and SVG")
    r.add_argument("specs", nargs="+")
    p = sub.add_parser("report", help="write an HTML report of a run directory")
    p.add_argument("run_dir")
    p.add_argument("--output", help="the HTML file (default RUN_DIR/report.html)")
    args = parser.parse_args(argv)
    try:
        if args.command == "render":
            for path in render(args.specs):
                print(path)
        else:
            print(report(args.run_dir, args.output))
    except ImportError as e:
        print(f"nmcmc_plot.py: {e}: install python3-matplotlib python3-xarray python3-netcdf4 python3-pandas",
              file=sys.stderr)
        return 69
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"nmcmc_plot.py: {e}", file=sys.stderr)
        return 65
    return 0


if __name__ == "__main__":
    sys.exit(main())
