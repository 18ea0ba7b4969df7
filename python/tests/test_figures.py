"""Figures and reports: the plotting script on its own (specs as the C++ program writes them)
and through the command line (`nmcmc report`, `nmcmc figures`, drawing at the end of a command,
and what happens without matplotlib)."""
import importlib.util
import json
import os
import stat
import subprocess

import pytest

CLI = os.environ.get("NMCMC_CLI", "build/nmcmc")
SOURCE = os.environ.get("NMCMC_SOURCE_DIR", ".")
SCRIPT = os.path.join(SOURCE, "scripts", "nmcmc_plot.py")


def load_script():
    spec = importlib.util.spec_from_file_location("nmcmc_plot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, env=None, check=True):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def is_svg(path):
    with open(path) as f:
        return "<svg" in f.read(2000)


PANELS = {
    "type": "panels", "title": "two panels", "caption": "a caption", "columns": 2,
    "panels": [
        {"title": "lines", "xlabel": "training step", "ylabel": "accept rate", "log_y": False,
         "series": [{"kind": "line", "x": [0, 1, 2, 3], "y": [0.1, 0.5, 0.9, 0.95], "colour": "#0072b2", "label": "a"},
                    {"kind": "line", "x": [0, 1, 2, 3], "y": [0.2, 0.4, None, 0.99], "colour": "#d55e00",
                     "label": "b"}]},
        {"title": "scatter on a density", "xlabel": "x.1", "ylabel": "x.2", "xlim": [-2, 2], "ylim": [-2, 2],
         "series": [{"kind": "density", "extent": [-2, 2, -2, 2], "values": [[0, 1], [1, 0.5]],
                     "label": "target density"},
                    {"kind": "scatter", "x": [0, 1, -1], "y": [1, 0, 0.5], "colour": "#009e73", "size": 3,
                     "label": "draws", "alpha": 0.7}]},
    ],
}


def test_panels_and_image_grids_become_png_and_svg(tmp_path):
    plot = load_script()
    spec = tmp_path / "fig.figure.json"
    spec.write_text(json.dumps(PANELS))
    grid = tmp_path / "grid.figure.json"
    grid.write_text(json.dumps({"type": "image_grid", "title": "images", "columns": 2, "caption": "under the grid",
                                "images": [[[0, 1], [1, 0]]] * 3, "captions": ["one", "two", "three"],
                                "row_labels": ["first", "second"]}))
    drawn = plot.render([str(spec), str(grid)])
    assert sorted(os.path.basename(p) for p in drawn) == ["fig.png", "fig.svg", "grid.png", "grid.svg"]
    assert all(is_png(p) for p in drawn if p.endswith(".png")) and all(is_svg(p) for p in drawn if p.endswith(".svg"))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]  # written atomically
    with pytest.raises(ValueError, match="unknown figure type"):
        bad = tmp_path / "bad.figure.json"
        bad.write_text(json.dumps({"type": "pie"}))
        plot.render([str(bad)])


def test_legends_never_cover_the_axes():
    plot = load_script()
    fig = plot.build_panels(PANELS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1  # one legend for the figure: every label once
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "draws", "target density"]
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        area = ax.get_tightbbox(renderer)  # the axes with their tick labels and axis labels
        assert box.y1 <= area.y0 + 1, "the legend overlaps a panel"
        assert ax.get_xlabel() and ax.get_ylabel()


def test_report_of_a_nuts_run_and_of_a_compare_directory(tmp_path):
    out = tmp_path / "run"
    run("sample", "--target", "funnel", "--dim", 5, "--sampler", "nuts", "--chains", 3, "--warmup", 150, "--draws",
        200, "-q", "--output", out)
    p = run("report", out)
    page = (out / "report.html").read_text()
    assert str(out / "report.html") in p.stdout
    for section in ("Efficiency", "Parameters", "Traces and rank plots", "Autocorrelation", "Pair plot",
                    "Sampler statistics", "E-BFMI"):
        assert section in page, section
    assert page.count("data:image/png;base64,") == 4
    files = sorted(os.listdir(out / "report_files"))
    assert files == sorted(f"{s}.{e}" for s in ("traces_ranks", "autocorrelation", "pairs", "sampler_stats")
                           for e in ("png", "svg"))
    # A Stan-CSV-only run (no NetCDF) is read with pandas.
    csv_only = tmp_path / "csv"
    run("sample", "--target", "gaussian", "--dim", 2, "--chains", 2, "--warmup", 50, "--draws", 60, "-q",
        "--format", "csv", "--output", csv_only)
    run("report", csv_only, "--output", tmp_path / "csv-report.html")
    assert "Traces and rank plots" in (tmp_path / "csv-report.html").read_text()
    cmp = tmp_path / "cmp"
    run("compare", "--target", "funnel", "--dim", 3, "--chains", 2, "--warmup", 50, "--draws", 60, "-q", "--output", cmp)
    assert (cmp / "compare_traces.png").exists() and (cmp / "compare_traces.svg").exists()
    run("report", cmp)
    page = (cmp / "report.html").read_text()
    assert "Sampler comparison" in page and "<td>nuts" in page and "data:image/png" in page


def test_report_of_a_learned_run_has_its_training_curves(tmp_path):
    model = tmp_path / "m.pt"
    run("train", "--target", "gaussian", "--dim", 2, "--steps", 10, "--batch", 32, "--set", "model.hidden=8",
        "--set", "train.log_every=2", "-q", "--output", model)
    out = tmp_path / "learned"
    run("sample", "--sampler", "learned", "--model", model, "--chains", 2, "--warmup", 10, "--draws", 40, "-q",
        "--output", out)
    run("report", out)
    assert "Training of the learned sampler" in (out / "report.html").read_text()
    assert (out / "report_files" / "training.svg").exists()


def test_report_refuses_what_is_not_a_run(tmp_path):
    p = run("report", tmp_path, check=False)
    assert p.returncode == 64 and "no summary.json" in p.stderr
    p = run("report", tmp_path / "missing", check=False)
    assert p.returncode == 64 and "not a directory" in p.stderr
    (tmp_path / "summary.json").write_text("{not json")
    p = run("report", tmp_path, check=False)
    assert p.returncode == 65, p.stderr


def test_without_matplotlib_the_run_succeeds_and_says_how_to_get_the_figures(tmp_path):
    # A Python that cannot import matplotlib.
    fake = tmp_path / "python-without-matplotlib"
    fake.write_text("#!/bin/sh\nexec /usr/bin/python3 -c \"import sys, runpy; sys.modules['matplotlib'] = None; "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\" \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cmp = tmp_path / "cmp"
    p = run("compare", "--target", "gaussian", "--dim", 2, "--chains", 2, "--warmup", 30, "--draws", 30, "-q",
            "--output", cmp, env={"NMCMC_PYTHON": str(fake)})
    assert "figures not drawn" in p.stderr and "apt-get install python3-matplotlib" in p.stderr
    assert "nmcmc figures DIR" in p.stderr
    assert (cmp / "compare_traces.figure.json").exists() and not (cmp / "compare_traces.png").exists()
    assert (cmp / "compare.json").exists()
    p = run("figures", cmp, env={"NMCMC_PYTHON": str(fake)}, check=False)
    assert p.returncode == 74
    # Later, with matplotlib: the same specs are drawn.
    p = run("figures", cmp)
    assert "drew 1 figure" in p.stdout and (cmp / "compare_traces.png").exists()
    out = tmp_path / "run"
    run("sample", "--target", "gaussian", "--dim", 2, "--chains", 2, "--warmup", 30, "--draws", 30, "-q",
        "--output", out)
    p = run("report", out, env={"NMCMC_PYTHON": str(fake)}, check=False)
    assert p.returncode == 74 and "install python3-matplotlib" in p.stderr
    assert not (out / "report.html").exists()
