"""The view of a `spectra cache` run: next-token NLL of the continuation against the ratio of the cache removed,
a line per press starting from the full cache at ratio 0 (dotted grey: the full cache's NLL), and beside it the
share of the continuation's attention mass on the context that the kept tokens hold (mean over layers and heads;
channel presses, which keep every token, are left out there)."""

from __future__ import annotations

from pathlib import Path

from ...runs import CacheRun
from . import style
from .style import plot_folder, pyplot

#: a fixed marker per press, so figures of different runs read the same way
MARKERS = {"streaming": "o", "knorm": "v", "snapkv": "s", "tova": "D", "random": "x", "observed": "^", "think": "P"}


def draw_cache(run: CacheRun):
    """NLL vs ratio (left) and attention mass kept vs ratio (right), a line per press."""
    plt = pyplot()
    table = run.table
    full = table[table["press"] == "full"].iloc[0]
    mass = run.head_stats.groupby(["press", "ratio"], sort=False)["mass_kept"].mean()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.0), layout="constrained")
    presses = [press for press in dict.fromkeys(table["press"]) if press != "full"]
    colors = plt.get_cmap("tab10")
    for i, press in enumerate(presses):
        rows = table[table["press"] == press].sort_values("ratio")
        ratios = [0.0, *rows["ratio"]]
        style_of = dict(color=colors(i % 10), marker=MARKERS.get(press, "o"), markersize=4, linewidth=1.3)
        channel = bool((rows["key_channel_ratio"] > 0).any())
        label = f"{press} (key channels)" if channel else press
        left.plot(ratios, [full["nll"], *rows["nll"]], label=label, gid=f"nll:{press}", **style_of)
        if not channel:  # a channel press keeps every token: its mass says nothing
            kept = [mass.get(("full", 0.0), 1.0), *(mass.get((press, ratio)) for ratio in rows["ratio"])]
            right.plot(ratios, kept, label=label, gid=f"mass:{press}", **style_of)
    left.axhline(full["nll"], color="0.5", linestyle=":", linewidth=1.0, label="full cache")
    left.set_ylabel("Continuation NLL (nats/token)")
    right.set_ylabel("Attention mass on kept context tokens")
    right.set_ylim(-0.02, 1.02)
    for ax in (left, right):
        ax.set_xlabel("Ratio of the cache removed")
        ax.grid(alpha=0.25, linewidth=0.6)
    left.legend(frameon=False, fontsize=8)
    meta = run.meta
    figure.suptitle(f"KV-cache compression after an exact prefill — {run.label}, context {meta['context']}, "
                    f"continuation {meta['continuation']}, {meta.get('scored', meta.get('samples'))} sequences",
                    fontsize=10.5)
    return figure


def plot_cache(run: CacheRun, out: str | Path | None = None) -> list[Path]:
    """Write the view into directory `out` (default <run directory>/figures). Returns the paths."""
    return style.save(draw_cache(run), plot_folder(run, out) / "cache_nll_vs_ratio")
