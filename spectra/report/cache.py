"""The read side of `spectra cache`: its run object (`CacheRun`), what it prints and its figures.

The view of a `spectra cache` run: next-token NLL of the continuation against the share of the full cache's bytes
each cell stores (every axis — tokens, key channels, rank, bits — on one currency; runs before bytes were counted:
against the ratio), a line per press starting from the full cache at 1 (dotted grey: the full cache's NLL), a press
the same at every ratio (KIVI) one point, and beside it the
share of the continuation's attention mass on the context that the kept tokens hold (mean over layers and heads;
presses that keep every token — ThinK's key channels, a low-rank K and V — or whose rows are not tokens —
Linformer's E·K — are left out there, and its legend names them). Each panel has its own legend, below it,
naming what it draws; every press has its own colour and marker (`PRESS_STYLES`), the same in every run's
figure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..registry import PRESSES, applied
from ..runs import FinishedRun, read_table
from .console import out, plural, print_frame
from .plots import style
from .plots.style import plot_folder, pyplot

if TYPE_CHECKING:  # pandas is imported where a table is read: the command line's start does not pay for it
    import pandas as pd

@dataclass(repr=False)
class CacheRun(FinishedRun):
    """A `spectra cache` run loaded back: `table` (cache.csv: per press and ratio nll, ppl, kl, top1, kept,
    kept_share, key_channel_ratio, saved, axis, bytes and bytes_share — the context cache's bytes over every layer and
    key/value head, and their share of the full cache's; the full cache is press 'full' at ratio 0), `head_stats` (cache_heads.csv: per
    press, ratio, layer and head the attention mass kept and the output error) and `sequences` (per press, ratio and
    sequence: nll, kl, top1); `axes` (cache_axes.csv, a run with --bytes-kept: per byte budget, layer, key/value head
    and axis the least loss, `spectra.kv.axes`), else None."""

    path: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    head_stats: pd.DataFrame
    sequences: pd.DataFrame
    axes: pd.DataFrame | None = None


def load(path: Path, meta: dict[str, Any]) -> CacheRun:
    """A cache run directory read back."""
    return CacheRun(path, meta, read_table(path, "cache.csv"), read_table(path, "cache_heads.csv"),
                    read_table(path, "cache_sequences.csv"), read_table(path, "cache_axes.csv", optional=True))


def same_at_every_ratio(table: pd.DataFrame, values: list[str], within: tuple[str, ...] = ()) -> list[str]:
    """The presses of `table` (press, ratio, the `within` keys, `values`) run at several ratios whose rows are the same
    at every one of them, in the table's order: KIVI's quantization does not read the ratio, and linformer's rows stop
    at the keys' rank. Printed once and drawn as one point, they no longer read as a curve over the ratio; the run's
    CSV keeps a row per ratio (tidy, the same keys for every press)."""
    keys, found = list(within), []
    for press, rows in table[table["press"] != "full"].groupby("press", sort=False):
        blocks = [block.sort_values(keys) if keys else block for _, block in rows.groupby("ratio", sort=True)]
        first = blocks[0]
        if len(blocks) > 1 and all(
                len(block) == len(first) and block[keys].to_numpy().tolist() == first[keys].to_numpy().tolist()
                and np.array_equal(block[values].to_numpy(float), first[values].to_numpy(float), equal_nan=True)
                for block in blocks[1:]):
            found.append(press)
    return found


def once_note(presses: list[str], table: pd.DataFrame, csv: str) -> str:
    """The line under a table that printed `presses` once (`same_at_every_ratio`)."""
    ratios = ", ".join(f"{ratio:g}" for ratio in sorted(set(table["ratio"]) - {0.0}))
    return (f"{', '.join(presses)}: the same at every ratio ({ratios}), so one row each (ratio 'any'; {csv} keeps a "
            "row per ratio)")


def one_row_each(table: pd.DataFrame, once: list[str], within: tuple[str, ...] = ()) -> pd.DataFrame:
    """`table` with its ratio as text (two decimals) and the presses of `once` in one row per `within` key, their
    first ratio's, the ratio shown as 'any'."""
    repeated = table["press"].isin(once) & table.duplicated(["press", *within])
    shown = table[~repeated]
    ratio = [("any" if press in once else f"{value:.2f}") for press, value in zip(shown["press"], shown["ratio"])]
    return shown.assign(ratio=ratio)


#: what the table's two memory columns count: lowrank's saved 0.500 beside its bytes_share 0.629 went unexplained
MEMORY_NOTE = ("saved: the share of the cache a press reports removing, as kvpress reports a compression ratio (the "
               "tokens evicted; half the key channels think prunes; the coefficients lowrank drops, its basis and mean "
               "not counted; linformer's 1 − m/L; KIVI's 1 − bytes_share); bytes_share: the bytes the compressed "
               "context cache stores over the full cache's, everything it keeps counted (channel masks, lowrank's "
               "basis and mean, KIVI's scales, zero-points and full-precision recent tokens), the share on which "
               "presses of every axis compare")


def show(run: CacheRun) -> None:
    """Per press and ratio: NLL, perplexity, KL from the full cache, top-1 agreement, tokens kept, memory saved and
    bytes stored; a press the same at every ratio (KIVI's bits) in one row; what saved and bytes_share count."""
    meta = run.meta
    columns = ["press", "ratio", "nll", "ppl", "kl", "top1", "kept", "saved"]
    columns += ["bytes_share"] if "bytes_share" in run.table.columns else []  # runs before bytes were counted
    table = run.table[columns]
    if (run.table["key_channel_ratio"] > 0).any():
        table = table.assign(channels=run.table["key_channel_ratio"])
    once = same_at_every_ratio(run.table, [column for column in [*columns[2:], "key_channel_ratio"]
                                           if column in run.table.columns])
    print_frame(one_row_each(table, once), f"{run.label}: context {meta['context']}, continuation "
                f"{meta['continuation']}, {plural(meta.get('scored', meta.get('samples', 0)), 'sequence')}; NLL "
                "(nats/token) of the continuation against each compressed cache, KL from the full cache's next-token "
                "distribution, top-1 agreement",
                digits={"nll": 4, "ppl": 3, "kl": 4, "top1": 3, "kept": 1, "saved": 3, "channels": 2,
                        "bytes_share": 3})
    if once:
        out.print(once_note(once, run.table, "cache.csv"))
    out.print(MEMORY_NOTE if "bytes_share" in columns else MEMORY_NOTE.split("; bytes_share")[0])
    if meta.get("local_layers", "keep") != "keep":  # what the presses did to the sliding-window layers
        out.print(f"Local layers: {meta['local_layers']} (--local-layers)")
    if meta.get("skipped"):
        out.print(f"{plural(meta['skipped'], 'sequence')} shorter than context + continuation skipped")
    from ..kv.presses.window import window_note

    note = window_note(meta["context"], sorted(set(run.table["ratio"]) - {0.0}), set(run.table["press"]))
    if note is not None:
        out.print(note[0].upper() + note[1:])
    if run.axes is not None:
        from ..kv.axes import summary

        print_frame(summary(run.axes), "Per byte budget (a share of the context cache's bytes) and axis: the key/value "
                    "heads whose output the axis harms least (best_heads of heads where it fits), its median output "
                    "error and the median bytes it used", digits={"budget": 3, "median_err": 4,
                                                                 "median_bytes_share": 3})


#: (colour, marker) per press named alone, each marker its own and each colour ΔE ≥ 25 (CIELAB) from every other
#: and from the full cache's grey, so that the default list's 23 presses (`spectra evaluate --help`) are told apart
#: in one panel (snapkv's green and compactor's were ΔE 20, random's purple and kivi2's 17, and finch, cap, kvgrad
#: and kvcompose took spares that others shared), the markers telling apart what colour alone hardly can at that
#: many. Fixed per press, so figures of different runs read the same way.
PRESS_STYLES: dict[str, tuple[str, str]] = {
    "streaming": ("tab:blue", "o"), "knorm": ("tab:orange", "v"), "snapkv": ("tab:green", "s"),
    "tova": ("tab:red", "D"), "random": ("tab:purple", "x"), "observed": ("tab:brown", "^"),
    "think": ("tab:pink", "P"), "pca_leverage": ("tab:olive", "*"), "loki": ("tab:cyan", "<"),
    "lowrank": ("#e6ab02", ">"), "linformer": ("black", "h"),
    "kivi2": ("#782d5a", "H"), "kivi4": ("#b15928", "1"), "kivi8": ("#c3a5d2", "2"),
    "keydiff": ("#1a237e", "p"), "lagkv": ("#00796b", "d"), "cur": ("#c2185b", "8"), "compactor": ("#960f87", "X"),
    "expected_attention": ("#3e82fc", "3"), "pyramidkv": ("#01c08d", "4"), "simlayerkv": ("#c4a661", "+"),
    "finch": ("#4b4b69", "$F$"), "cap": ("#d2a596", "$C$"), "kvzip": ("#fe7b7c", "$Z$"),
    "kvgrad": ("#3c4b00", "$G$"), "kvcompose": ("#a5d278", "$K$"),
}
#: styles for a press `PRESS_STYLES` does not list (a name with an argument, such as adakv(snapkv)), taken in turn,
#: each colour ΔE ≥ 29 from every listed one
SPARE_STYLES: tuple[tuple[str, str], ...] = (("#e178ff", "$a$"), ("#96c3a5", "$b$"), ("#870f1e", "$c$"),
                                             ("#784bd2", "$e$"))
FULL_STYLE = dict(color="0.5", linestyle=":", linewidth=1.0)


def press_style(press: str, index: int = 0) -> tuple[str, str]:
    """(colour, marker) of a press: its own from `PRESS_STYLES`, a wrapper's (decoding(knorm)) its inner press's
    (drawn dashed: `wrapped`), else the `index`-th spare."""
    return PRESS_STYLES.get(press) or PRESS_STYLES.get(wrapped(press) or "") or SPARE_STYLES[index % len(SPARE_STYLES)]


def wrapped(press: str) -> str | None:
    """The scorer of a press that compresses while decoding (decoding(knorm) → knorm: drawn in its style, dashed);
    None for any other press (adakv(snapkv) and the other names with an argument take spare styles)."""
    parts = applied(press)
    base = PRESSES.entries().get(parts[0]) if parts else None
    return parts[1] if parts and base is not None and base.facts.get("decodes") else None  # type: ignore[index]


def panel_legend(ax, title: str | None = None) -> None:
    """The panel's own legend, below it (never over a curve), in columns that fit the panel's width."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3, frameon=False, fontsize=8,
              handlelength=1.8, columnspacing=1.2, title=title, title_fontsize=8)


#: the x axis of a run that counted bytes (each cell at the share of the full cache's bytes it stores, the full
#: cache at 1, compression growing to the right) and of an older run (the ratio)
BYTES_AXIS = "Share of the full cache's bytes stored"
RATIO_AXIS = "Ratio of the cache removed"


def by_bytes(table: pd.DataFrame) -> bool:
    """Whether the run's cells can be drawn at the bytes they store (runs before bytes were counted cannot)."""
    return "bytes_share" in table.columns and bool(table["bytes_share"].notna().all())


def x_axis(ax, bytes_axis: bool) -> None:
    """Label the x axis; the bytes axis runs from the full cache (1) on the left to less memory on the right."""
    ax.set_xlabel(BYTES_AXIS if bytes_axis else RATIO_AXIS)
    if bytes_axis:
        ax.invert_xaxis()


def draw_cache(run: CacheRun):
    """NLL (left) and attention mass kept (right) against the share of the context cache's bytes each cell stores, a
    line per press from the full cache; a press the same at every ratio (KIVI: bits, not the ratio) as one point.
    Runs before bytes were counted: against the ratio, as they were drawn."""
    plt = pyplot()
    table = run.table
    full = table[table["press"] == "full"].iloc[0]
    mass = run.head_stats.groupby(["press", "ratio"], sort=False)["mass_kept"].mean()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10.0, 5.4), layout="constrained")
    presses = [press for press in dict.fromkeys(table["press"]) if press != "full"]
    unknown = [press for press in presses if press not in PRESS_STYLES and wrapped(press) not in PRESS_STYLES]
    bytes_axis = by_bytes(table)
    x_column, x_full = ("bytes_share", 1.0) if bytes_axis else ("ratio", 0.0)
    measured = [column for column in ("nll", "kl", "top1", "kept", "saved", "bytes_share", "key_channel_ratio")
                if column in table.columns]
    once = same_at_every_ratio(table, measured)
    missing: dict[str, list[str]] = {"every token kept": [], "rows are not tokens": [],
                                     "compressed while decoding": []}
    for press in presses:
        rows = table[table["press"] == press].sort_values("ratio")
        alone = press in once  # one cell: no line from the full cache, one marker
        if alone:
            rows = rows.iloc[:1]
        xs = list(rows[x_column]) if alone else [x_full, *rows[x_column]]
        color, marker = press_style(press, unknown.index(press) if press in unknown else 0)
        style_of = dict(color=color, marker=marker, markersize=7.5 if alone else 4.5, linewidth=1.3, zorder=3,
                        linestyle="none" if alone else "--" if wrapped(press) else "-")
        channel = bool((rows["key_channel_ratio"] > 0).any())
        label = f"{press} (key channels)" if channel else press
        label += " (any ratio)" if alone else ""
        left.plot(xs, [*([] if alone else [full["nll"]]), *rows["nll"]], label=label, gid=f"nll:{press}", **style_of)
        kept = [mass.get((press, ratio), np.nan) for ratio in rows["ratio"]]
        every = channel or ("kept_share" in rows.columns and bool((rows["kept_share"] >= 1).all()))
        if every:  # keeps every token (ThinK, a low-rank K and V, KIVI): its mass says nothing
            missing["every token kept"].append(press)
        elif wrapped(press) and np.isnan(np.asarray(kept, dtype=float)).all():  # its cache changes as it decodes
            missing["compressed while decoding"].append(press)
        elif np.isnan(np.asarray(kept, dtype=float)).all():  # rows that are not tokens (Linformer's E·K)
            missing["rows are not tokens"].append(press)
        else:
            right.plot(xs, [*([] if alone else [mass.get(("full", 0.0), 1.0)]), *kept], label=label,
                       gid=f"mass:{press}", **style_of)
    left.axhline(full["nll"], label="full cache", gid="full", zorder=1, **FULL_STYLE)
    left.set_ylabel("Continuation NLL (nats/token)")
    left.set_title("Next-token NLL of the continuation")
    right.set_ylabel("Attention mass on kept context tokens")
    right.set_title("Share of the attention on the context that stays\n(mean over layers and heads)")
    right.set_ylim(-0.02, 1.02)
    for ax in (left, right):
        x_axis(ax, bytes_axis)
        ax.grid(alpha=0.25, linewidth=0.6)
    panel_legend(left, "one point: the same at every ratio" if once else None)
    why = [f"{', '.join(presses)} ({reason})" for reason, presses in missing.items() if presses]
    panel_legend(right, f"not drawn: {'; '.join(why)}" if why else None)
    meta = run.meta
    figure.suptitle(f"KV-cache compression after an exact prefill — {run.label}, context {meta['context']}, "
                    f"continuation {meta['continuation']}, {plural(meta.get('scored', meta.get('samples', 0)), 'sequence')}",
                    fontsize=10.5)
    return figure


def plot_cache(run: CacheRun, out: str | Path | None = None) -> list[Path]:
    """Write the view into directory `out` (default <run directory>/figures). Returns the paths."""
    return style.save(draw_cache(run), plot_folder(run, out) / "cache_nll_vs_ratio")


#: the colour of each axis in the axis map
AXIS_COLOURS = {"tokens": "tab:green", "channels": "tab:pink", "rank": "#e6ab02", "bits": "#6a3d9a"}


#: the axis map's cell text in points: readable at the figure's size (5.5 was not)
CELL_FONT = 8.0


def text_on(colour: str) -> str:
    """Black or white, whichever contrasts more with `colour` (WCAG's relative luminance): the numbers stay
    readable on the dark bits purple as on the light rank yellow."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    luminance = float(linear @ [0.2126, 0.7152, 0.0722])
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def compact_types(types: str) -> str:
    """A key/value head's query-head types, repeats counted: 'sink+sink+local' → 'sink×2+local' (fits its cell)."""
    counts = dict.fromkeys(types.split("+"), 0)
    for kind in types.split("+"):
        counts[kind] += 1
    return "+".join(kind if count == 1 else f"{kind}×{count}" for kind, count in counts.items())


def draw_axes(run: CacheRun):
    """The axis map: per byte budget a panel of layers × key/value heads, each cell coloured by the axis whose best
    press loses least there, labelled with its output error (and its head types when a heads run was joined)."""
    from matplotlib.colors import ListedColormap

    from ..kv.axes import AXES

    plt = pyplot()
    best = run.axes[run.axes["best"].astype(bool)]
    budgets = sorted(best["budget"].unique())
    layers, kv_heads = int(run.axes["layer"].max()) + 1, int(run.axes["kv_head"].max()) + 1
    typed = "head_types" in best.columns and bool(best["head_types"].notna().any())
    figure, panels = plt.subplots(1, len(budgets), squeeze=False, layout="constrained",
                                  figsize=(1.2 + 1.4 * kv_heads * len(budgets), 1.4 + (0.5 if typed else 0.3) * layers))
    colours = ListedColormap([AXIS_COLOURS[axis] for axis in AXES])
    for ax, budget in zip(panels[0], budgets):
        cells = best[best["budget"] == budget]
        grid = np.full((layers, kv_heads), np.nan)
        grid[cells["layer"].to_numpy(int), cells["kv_head"].to_numpy(int)] = [AXES.index(a) for a in cells["axis"]]
        ax.imshow(grid, cmap=colours, vmin=-0.5, vmax=len(AXES) - 0.5, aspect="auto", interpolation="nearest")
        for row in cells.itertuples():
            types = getattr(row, "head_types", None)
            label = f"{row.out_err:.2f}" + (f"\n{compact_types(types)}" if isinstance(types, str) else "")
            ax.text(row.kv_head, row.layer, label, ha="center", va="center", fontsize=CELL_FONT, linespacing=1.0,
                    color=text_on(AXIS_COLOURS[row.axis]), gid=f"cell:{budget}")
        ax.set_xticks(range(kv_heads))
        ax.set_xlabel("Key/value head")
        ax.set_title(f"{budget:g} of the bytes", fontsize=9)
    panels[0][0].set_ylabel("Layer")
    handles = [plt.Rectangle((0, 0), 1, 1, color=AXIS_COLOURS[axis]) for axis in AXES]
    figure.legend(handles, AXES, loc="outside lower center", ncols=len(AXES), frameon=False, fontsize=8)
    figure.suptitle(f"The axis that loses least per head (relative output error) — {run.label}, context "
                    f"{run.meta['context']}", fontsize=10)
    return figure


def plot(run: CacheRun, out: str | Path | None = None) -> list[Path]:
    found = plot_cache(run, out)
    if run.axes is not None and run.axes["best"].astype(bool).any():
        found += style.save(draw_axes(run), plot_folder(run, out) / "cache_axes")
    return found
