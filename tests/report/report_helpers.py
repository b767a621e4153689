"""Shared by the tests of spectra.report: the tiny runs they read, and readers of what a figure drew.

Runs are real: `analyze`, `approx` and `theorems` of tiny offline models (see tests/tiny.py), built by the
fixtures in tests/report/conftest.py once per session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from tiny import save_model, write_text

import spectra
from spectra.api import approx, theorems
from spectra.config import RunConfig

QUIET = dict(progress=None, notify=lambda line: None)

ANALYZE_N = 32  # sequence length of the tiny analyze runs; the heatmap index n/4 is 8

APPROX_N = 24  # sequence length of the tiny approx and theorems runs
BUDGETS = [4, 8, APPROX_N]  # k = n: svd and pool-mean are exact, so their zero errors sit below the log axis
METHODS = ["svd", "jl", "linformer(kv)", "pool-mean"]
SHARING = ["none", "headwise", "kv", "layerwise"]


# ---------------------------------------------------------------- building the runs


def build_runs(root: Path) -> dict[str, spectra.Run]:
    """Real `analyze` runs of tiny models: 2 and 3 layers × two corpora at n = 32, and one at n = 16.

    Idempotent (resume=True loads finished runs), so every test module shares one set per session.
    """
    N = ANALYZE_N
    root.mkdir(parents=True, exist_ok=True)
    models = {depth: root / name for depth, name in [(2, "roberta-small"), (3, "roberta-deep")]}
    for depth, path in models.items():
        if not (path / "config.json").exists():
            save_model(path, layers=depth, seed=depth)
    corpora = {name: root / f"{name}.txt" for name in ("wikitext-103", "imdb")}
    for seed, path in enumerate(corpora.values()):
        if not path.exists():
            write_text(path, count=200, seed=seed + 1)
    plan = {
        "small-wiki": (2, "wikitext-103", N), "small-imdb": (2, "imdb", N),
        "deep-wiki": (3, "wikitext-103", N), "deep-imdb": (3, "imdb", N), "small-imdb-n16": (2, "imdb", 16),
    }
    return {
        key: spectra.analyze(str(models[depth]), str(corpora[data]), length=length, samples=16, batch_size=8,
                             out=root / key, resume=True, progress=None, notify=lambda line: None)
        for key, (depth, data, length) in plan.items()
    }


def build_approx(model: Path, text: Path, out: Path) -> spectra.ApproxRun:
    """An approx run with --end-to-end at the budgets BUDGETS of the methods METHODS, n = 24."""
    return approx(str(model), str(text), budget=BUDGETS, methods=METHODS, end_to_end=True, length=APPROX_N,
                  samples=2, batch_size=2, out=out, **QUIET)


def theorem_run_dir(runs_dir: Path, model: Path, text: Path) -> Path:
    """Where analyses/theorems.py looks for the run (the name `spectra theorems` picks by default)."""
    return runs_dir / RunConfig(str(model), str(text), APPROX_N).default_out("theorems").name


def build_theorems(model: Path, text: Path, out: Path) -> spectra.TheoremRun:
    """A theorems run at the budgets BUDGETS and ε ∈ {0.3, 0.5}, n = 24."""
    return theorems(str(model), str(text), budget=BUDGETS, eps=[0.3, 0.5], length=APPROX_N, samples=2,
                    batch_size=2, out=out, **QUIET)


def expected_errors(run) -> dict[str, pd.DataFrame]:
    """label → rows (budget ascending) of median and p95, straight from a theorems run's pooled tables."""
    one, two = run.tables["theorem1"], run.tables["theorem2"]
    found = {method: one[one["method"] == method] for method in ("jl", "svd")}
    for level in SHARING:
        found[f"linformer({level})"] = two[(two["method"] == "linformer") & (two["variant"] == level)]
    for rule in ("1/2^n", "1/n"):
        found[f"theorem2(delta={rule})"] = two[(two["method"] == "theorem2") & (two["variant"] == f"delta={rule}")
                                               & (two["relative_to"] == "output")]
    return {label: rows.drop_duplicates("budget").sort_values("budget") for label, rows in found.items()}


# ---------------------------------------------------------------- reading figures back


def by_gid(items, gid: str):
    """The one artist of `items` with this gid."""
    found = [item for item in items if item.get_gid() == gid]
    assert len(found) == 1, (gid, [item.get_gid() for item in items])
    return found[0]


def axis_by_gid(figure, gid: str):
    """The one axis of `figure` with this gid."""
    found = [ax for ax in figure.axes if ax.get_gid() == gid]
    assert len(found) == 1, [ax.get_gid() for ax in figure.axes]
    return found[0]


def mesh_values(ax) -> np.ndarray:
    """The (layers, heads) array a heatmap axis draws."""
    (mesh,) = ax.collections
    return np.asarray(mesh.get_array()).reshape(mesh.get_coordinates().shape[0] - 1, -1)


def legend_texts(figure) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def check_below_marks(ax, gids) -> None:
    """Every point under the log axis' bottom has a ▼ at its x; none above it does."""
    bottom = ax.get_ylim()[0]
    for gid in gids:
        line = by_gid(ax.lines, gid)
        y = np.asarray(line.get_ydata(), dtype=float)
        low = np.asarray(line.get_xdata(), dtype=float)[y < bottom]
        marks = [mark for mark in ax.lines if mark.get_gid() == f"below:{gid}"]
        if len(low):
            np.testing.assert_array_equal(marks[0].get_xdata(), low)
        else:
            assert not marks


def fake_save(monkeypatch) -> list[str]:
    """Record the figures `save` is asked for without rendering them (the CLI tests render real files).

    Every entry point saves through `spectra.report.plots.style.save`, so patching it there catches them all.
    """
    import matplotlib.pyplot as plt

    from spectra.report.plots import style

    names: list[str] = []

    def save(figure, out):
        plt.close(figure)
        names.append(str(out))
        return [Path(f"{out}.png"), Path(f"{out}.pdf")]

    monkeypatch.setattr(style, "save", save)
    return names


# ---------------------------------------------------------------- reading tables back


def printed_tables(text: str) -> list[dict[str, list]]:
    """The rich tables in printed output, in order: each as {"header": header lines' cells, "rows": body rows'
    cells}, cells stripped (an empty cell is "")."""
    tables: list[dict[str, list]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("┏"):
            tables.append({"header": [], "rows": []})
        elif line.startswith("┃"):
            tables[-1]["header"].append([cell.strip() for cell in line.strip("┃").split("┃")])
        elif line.startswith("│"):
            tables[-1]["rows"].append([cell.strip() for cell in line.strip("│").split("│")])
    return tables


def cielab(color) -> np.ndarray:
    """CIE L*a*b* (D65) of a matplotlib colour, from the sRGB formulas."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


#: Machado, Oliveira and Fernandes (2009): linear-RGB matrices simulating each dichromacy at full severity
DICHROMACY = {"protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                             (-0.003882, -0.048116, 1.051998)),
              "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                               (-0.011820, 0.042940, 0.968881)),
              "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                             (0.004733, 0.691367, 0.303900))}


def seen_by(color, dichromacy: str) -> tuple[float, float, float]:
    """The sRGB colour a reader with `dichromacy` (a `DICHROMACY` key) sees for a matplotlib colour."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    seen = np.clip(np.array(DICHROMACY[dichromacy]) @ linear, 0.0, 1.0)
    return tuple(np.where(seen <= 0.0031308, 12.92 * seen, 1.055 * seen ** (1 / 2.4) - 0.055))


def visible_tick_labels(axis, low: float, high: float) -> dict[float, str]:
    """tick value → label text of the ticks inside [low, high] that carry a label (major and minor)."""
    found = {}
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        value, text = tick.get_loc(), tick.label1.get_text()
        if low <= value <= high and tick.label1.get_visible() and text:
            found[value] = text
    return found
