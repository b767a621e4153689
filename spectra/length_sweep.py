"""`spectra scaling`: does the k a head needs grow with the sequence length n?

One `analyze` run per n in the run directory (`n64/`, `n128/`, …; finished ones are reused and interrupted ones
continue with --resume, the model is loaded once), then, per (layer, head) and n: the ranks holding 90% and
99% of P's nuclear norm, the effective rank, c at fixed budgets (32, 64, 128 where < n) and c at n/4; and the
growth exponent α of rank ∝ n^α per head, per layer and pooled, with a bootstrap interval (`spectra.growth`).
With a target error, also one `approx` run per n (`approx-n64/`, …) and the smallest budget per n whose
per-layer mean head-output error reaches it, with its exponent.

Tables (tidy, in the run directory): scaling.csv, c_fixed.csv, exponents.csv and, with a target, k_needed.csv.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from . import checkpoints, models
from .config import RunConfig, check_budget, layers_label
from .errors import Interrupted, SpectraError, option
from .growth import growth
from .inputs import path_text, several
from .loop import Progress, versions
from .rundir import RunDir, default_dir, write_json, write_table
from .runs import ApproxRun, Run, ScalingRun, load_run

#: the fixed budgets at which c is compared across n (those ≤ n)
FIXED_BUDGETS = (32, 64, 128)
#: the metrics whose growth is fitted (bootstrapped by the analyze runs)
GROWING = ("rank90", "rank99")


def parse_lengths(lengths: str | int | Iterable[int]) -> tuple[int, ...]:
    """'64,128,256', one integer or several → sorted distinct lengths; at least two, each ≥ 8."""
    try:
        values = sorted({int(part) for part in several(lengths, "--lengths")})
    except (TypeError, ValueError):
        raise SpectraError(f"{option('--lengths')} '{lengths}' is not a list of sequence lengths like "
                           f"{option('64,128,256,512', '(64, 128, 256, 512)')}") from None
    if len(values) < 2:
        raise SpectraError(f"{option('--lengths')} needs at least two different lengths to see growth, got {values}")
    if values[0] < 8:
        raise SpectraError(f"{option('--lengths')} must be at least 8 tokens each, got {values[0]}")
    return tuple(values)


def default_budgets(n: int) -> tuple[int, ...]:
    """The approx budgets tried at length n: powers of two from 4 up to n/2, and n/2 itself."""
    budgets = {2 ** i for i in range(2, 20) if 2 ** i <= n // 2} | {max(1, n // 2)}
    return tuple(sorted(budgets))


def scaling(
    model: str | os.PathLike,
    data_source: str | os.PathLike = "imdb",
    *,
    lengths: str | int | Iterable[int] = (64, 128, 256, 512),
    samples: int = 100,
    mode: str = "pack",
    batch_size: int = 8,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    spectrum: str = "exact",
    spectrum_device: str = "auto",
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    bootstrap: int = 200,
    approx_target: float | None = None,
    methods: str | Iterable[str] = ("svd",),
    budgets: int | Iterable[int] | None = None,
    approx_samples: int | None = None,
    fit_samples: int = 0,
    device: str = "auto",
    dtype: str = "float32",
    gguf_file: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> ScalingRun:
    """Analyze `model` at each of `lengths` and fit how the needed rank grows with n (see the module docstring).

    `bootstrap` replicates give α's interval (0: no interval). `approx_target` adds approx runs of `methods` at
    `budgets` (default: powers of two up to n/2) on `approx_samples` sequences (default `samples`), after
    `fit_samples` calibration sequences for fitted methods. `lengths`, `layers`, `heads`, `methods` and `budgets`
    take one value or several; paths may be str or `pathlib.Path`. Returns the loaded scaling run.
    """
    from .api import analyze, approx
    from .sources import ModelSource

    lengths = parse_lengths(lengths)
    config = RunConfig(model, data_source, lengths[-1], samples, mode, batch_size, seed, split, text_column, device,
                       dtype, trust_remote_code, gguf_file)
    model, data_source, gguf_file = config.model, config.data, config.gguf_file
    if approx_target is not None and not 0 < approx_target < 1:
        raise SpectraError(f"{option('--approx-target')} must be a relative error in (0, 1), got {approx_target}")
    methods = several(methods, "--methods")
    chosen_budgets = None if budgets is None else tuple(sorted(set(several(budgets, option("--k", "budgets"), int))))
    for budget in chosen_budgets or ():
        check_budget(budget, lengths[-1])
    found = checkpoints.inspect(model, gguf_file)
    root = Path(path_text(out)) if out is not None else default_dir(
        replace(config, length=lengths[0]).default_out(f"to{lengths[-1]}-scaling", found.label), found.where)
    target = RunDir(root, overwrite=overwrite, resume=resume)
    if resume and not root.exists():
        notify(f"nothing to resume in {root}; starting a new run")
    common = dict(mode=mode, batch_size=batch_size, seed=seed, split=split, text_column=text_column, device=device,
                  dtype=dtype, gguf_file=gguf_file, trust_remote_code=trust_remote_code, progress=progress,
                  checkpoint_seconds=checkpoint_seconds, notify=notify, overwrite=overwrite)

    def started_at(part: Path) -> bool:
        """Whether a length's run exists, finished or interrupted: only such a run is resumed (a sweep continued
        with --resume starts the lengths it never reached without saying there was nothing to resume)."""
        return resume and (part.exists() or part.with_name(part.name + ".partial").exists())

    started = time.perf_counter()
    parts = [f"{kind}{n}" for n in lengths for kind in ("n", *(("approx-n",) if approx_target is not None else ()))]
    finished = resume and all((root / part / "run.json").exists() for part in parts)  # a finished sweep is only read
    with models.reusing(), target.claimed():
        if not finished:  # the longest n fits the model and the data: fail before any run
            ModelSource(config, config.device).start()
        analyzed: dict[int, Run] = {}
        approximated: dict[int, ApproxRun] = {}
        for step, n in enumerate(lengths, 1):
            notify(f"n = {n} ({step} of {len(lengths)})")
            try:
                analyzed[n] = analyze(model, data_source, length=n, samples=samples, spectrum=spectrum,
                                      spectrum_device=spectrum_device, layers=layers, heads=heads, bootstrap=bootstrap,
                                      out=root / f"n{n}", resume=started_at(root / f"n{n}"), **common)
                if approx_target is not None:
                    approximated[n] = approx(model, data_source, length=n, samples=approx_samples or samples,
                                             budgets=[b for b in chosen_budgets or default_budgets(n) if b <= n],
                                             methods=methods, layers=layers, target=approx_target,
                                             fit_samples=fit_samples, out=root / f"approx-n{n}",
                                             resume=started_at(root / f"approx-n{n}"), **common)
            except Interrupted as stopped:  # the hint names this command, not the run inside it
                how_far = stopped.marked.split(";")[0]
                again = option("the same spectra scaling command and --resume",
                               "spectra.scaling(…) with the same arguments and resume=True")
                raise Interrupted(f"{how_far} (n = {n}, length {step} of {len(lengths)}); the lengths done are kept: "
                                  f"continue with {again}") from None
        tables = scaling_tables(analyzed)
        if approximated:
            tables["k_needed.csv"] = k_needed_table(approximated, approx_target)
            tables["exponents.csv"] = pd.concat([tables["exponents.csv"], k_needed_exponents(tables["k_needed.csv"])],
                                                ignore_index=True)
        root.mkdir(parents=True, exist_ok=True)
        for name, frame in tables.items():
            write_table(root / name, frame)
        first = analyzed[lengths[-1]].meta
        settings = config.settings({"spectrum": spectrum, "bootstrap": bootstrap,
                                    "layers": layers_label(first.get("layers")), "heads": layers_label(first.get("heads"))})
        del settings["length"]
        write_json(root / "run.json", {
            "kind": "scaling",
            "settings": {**settings, "lengths": list(lengths)},
            "lengths": list(lengths),
            "model": first["model"],
            "data": {key: value for key, value in first["data"].items() if key in ("name", "source", "split", "mode")},
            "runs": {str(n): f"n{n}" for n in lengths},
            **({"approx_runs": {str(n): f"approx-n{n}" for n in lengths}, "target": approx_target,
                "methods": list(methods)} if approximated else {}),
            "samples": samples,
            "fixed_budgets": [b for b in FIXED_BUDGETS if b < lengths[-1]],
            "status": "complete",
            "wall_seconds": time.perf_counter() - started,
            "versions": versions(),
        })
    return load_run(root)


# ---------------------------------------------------------------- tables


def scaling_tables(runs: dict[int, Run]) -> dict[str, pd.DataFrame]:
    """scaling.csv, c_fixed.csv and exponents.csv of analyze runs at several n (keyed by n)."""
    rows, fixed = [], []
    for n, run in sorted(runs.items()):
        metrics = run.metrics
        layer, head = metrics["layer"].to_numpy(), metrics["head"].to_numpy()
        rows.append(pd.DataFrame({
            "layer": layer, "head": head, "n": n, "sequences": metrics["sequences"],
            "rank90": metrics["rank90_mean"], "rank99": metrics["rank99_mean"], "erank": metrics["erank_mean"],
            "rank90_share": metrics["rank90_mean"] / n, "c_quarter": metrics["c_at_mean"], "quarter": run.at,
        }))
        for budget in FIXED_BUDGETS:
            if budget < n:  # c at k = n is 1
                fixed.append(pd.DataFrame({"layer": layer, "head": head, "n": n, "budget": budget,
                                           "c": run.cum_mean[layer, head, budget - 1]}))
    table = pd.concat(rows, ignore_index=True)
    c_fixed = pd.concat(fixed, ignore_index=True) if fixed else pd.DataFrame(columns=["layer", "head", "n", "budget", "c"])
    return {"scaling.csv": table, "c_fixed.csv": c_fixed, "exponents.csv": exponents(runs)}


def _replicates(run: Run) -> tuple[list[str], np.ndarray] | None:
    path = run.path / "bootstrap.npz"
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        return [str(name) for name in arrays["metrics"]], arrays["replicates"]


def exponents(runs: dict[int, Run]) -> pd.DataFrame:
    """The growth of rank90 and rank99 with n: per head, per layer (mean over its measured heads) and pooled
    (mean over every measured head), with the bootstrap interval of α when the runs kept replicates."""
    lengths = sorted(runs)
    measured = [np.isfinite(runs[n].cum_mean[..., 0]) for n in lengths]
    chosen = np.logical_and.reduce(measured)  # (layers, heads) measured at every n
    sequences = min(int(runs[n].metrics["sequences"].min()) for n in lengths)  # what the replicates resample
    rows = []
    for metric in GROWING:
        grids, boots = [], []
        for n in lengths:
            run = runs[n]
            grid = np.full(chosen.shape, np.nan)
            grid[run.metrics["layer"], run.metrics["head"]] = run.metrics[f"{metric}_mean"]
            grids.append(grid)
            found = _replicates(run)
            boots.append(None if found is None or metric not in found[0] else found[1][..., found[0].index(metric)])
        values = np.stack(grids)  # (lengths, layers, heads)
        boot = np.stack(boots, axis=1) if all(b is not None for b in boots) and len({b.shape[0] for b in boots}) == 1 else None
        scopes = [("pooled", None, None, chosen)]
        scopes += [("layer", layer, None, chosen & (np.arange(chosen.shape[0])[:, None] == layer))
                   for layer in range(chosen.shape[0]) if chosen[layer].any()]
        scopes += [("head", layer, head, None) for layer, head in zip(*np.nonzero(chosen))]
        for scope, layer, head, mask in scopes:
            if head is not None:
                y, replicates = values[:, layer, head], None if boot is None else boot[:, :, layer, head]
            else:
                y = values[:, mask].mean(axis=1)
                replicates = None if boot is None else boot[:, :, mask].mean(axis=2)
            fit = growth(lengths, y, replicates, sequences)
            rows.append({"metric": metric, "method": "", "scope": scope, "layer": layer, "head": head, **fit.row(),
                         "better": fit.better})
    frame = pd.DataFrame(rows)
    return frame.astype({"layer": "Int64", "head": "Int64"})


def k_needed_table(runs: dict[int, ApproxRun], target: float) -> pd.DataFrame:
    """Per (method, n, layer) the smallest budget whose per-layer mean head-output error is ≤ target, and a
    pooled row (layer empty) for the mean over layers; NaN where no budget tried reaches it."""
    frames = []
    for n, run in sorted(runs.items()):
        per_layer = run.k_needed(target)
        per_layer.insert(1, "n", n)
        layer_means = run.per_layer("out_err")
        pooled = layer_means.groupby(["method", "budget"], sort=False)["out_err"].mean().reset_index()
        reached = pooled[pooled["out_err"] <= target].groupby("method", sort=False)["budget"].min()
        methods = pooled["method"].drop_duplicates()
        frames += [per_layer, pd.DataFrame({"method": methods.to_numpy(), "n": n, "layer": pd.NA,
                                            "k_needed": methods.map(reached).to_numpy(dtype=float)})]
    frame = pd.concat(frames, ignore_index=True).astype({"layer": "Int64"})
    frame["target"] = target
    return frame


def k_needed_exponents(table: pd.DataFrame) -> pd.DataFrame:
    """The growth of the pooled k needed with n, per method (no interval: the budget grid is coarse)."""
    rows = []
    for method, rows_of in table[table["layer"].isna()].groupby("method", sort=False):
        fit = growth(rows_of["n"].to_numpy(), rows_of["k_needed"].to_numpy(dtype=float))
        rows.append({"metric": "k_needed", "method": method, "scope": "pooled", "layer": pd.NA, "head": pd.NA,
                     **fit.row(), "better": fit.better})
    return pd.DataFrame(rows).astype({"layer": "Int64", "head": "Int64"})
