"""`spectra scaling`: does the budget a head needs grow with the sequence length n?

One `analyze` run per n in the run directory (`n64/`, `n128/`, …; finished ones are reused and interrupted ones
continue with --resume, the model is loaded once), then, per (layer, head) and n: the ranks holding 90% and
99% of P's nuclear norm, the effective rank, c at fixed budgets (32, 64, 128 where < n) and c at n/4; and the
growth exponent α of rank ∝ n^α per head, per layer and pooled, with a bootstrap interval (`spectra.growth`).
With a target error, also one `approx` run per n (`approx-n64/`, …) and the smallest budget per n whose
per-layer mean head-output error reaches it, with its exponent.

Tables (tidy, in the run directory): scaling.csv, c_fixed.csv, exponents.csv and, with a target, k_needed.csv.
Loads as `runs.ScalingRun`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import checkpoints
from ..config import Place, RunConfig, check_budget, indices, layers_label
from ..errors import Interrupted, SpectraError, spell
from ..growth import growth
from ..inputs import several
from ..options import option
from ..reporter import Reporter
from ..rundir import RunDir, default_dir, versions, write_meta, write_table
from .base import REGISTRY, Analysis, load_run, model_source, register

if TYPE_CHECKING:  # pandas (and the read side) are imported where a table is made: --help does not pay for them
    import pandas as pd

    from ..report.analyze import Run
    from ..report.approx import ApproxRun

#: the fixed budgets at which c is compared across n (those ≤ n)
FIXED_BUDGETS = (32, 64, 128)
#: the metrics whose growth is fitted (bootstrapped by the analyze runs)
GROWING = ("rank90", "rank99")


def parse_lengths(lengths: Any) -> tuple[int, ...]:
    """'64,128,256', one integer or several → sorted distinct lengths; at least two, each ≥ 8."""
    try:
        values = sorted({int(part) for part in several(lengths, "--lengths")})
    except (TypeError, ValueError):
        raise SpectraError(f"{spell('--lengths')} '{lengths}' is not a list of sequence lengths like "
                           f"{spell('64,128,256,512', '(64, 128, 256, 512)')}") from None
    if len(values) < 2:
        raise SpectraError(f"{spell('--lengths')} needs at least two different lengths to see growth, got {values}")
    if values[0] < 8:
        raise SpectraError(f"{spell('--lengths')} must be at least 8 tokens each, got {values[0]}")
    return tuple(values)


def default_budgets(n: int) -> tuple[int, ...]:
    """The approx budgets tried at length n: powers of two from 4 up to n/2, and n/2 itself."""
    budgets = {2 ** i for i in range(2, 20) if 2 ** i <= n // 2} | {max(1, n // 2)}
    return tuple(sorted(budgets))


@dataclass(frozen=True)
class ScalingOptions:
    """The lengths to analyse and how; with `approx_target`, the approx runs at each length."""

    lengths: tuple[int, ...] = option((64, 128, 256, 512), "Sequence lengths n, comma-separated (at least two); one "
                                      "analyze run each.")
    bootstrap: int = option(200, "Bootstrap replicates over sequences for the interval of the growth exponent "
                            "(0: none).")
    spectrum_device: Place = option(Place.AUTO, "Where the singular values are computed (speed only).",
                                    identity=False)
    layers: tuple[int, ...] | None = option(None, "Spectra of these layers only, e.g. 0,14,29 (long n: each "
                                            "spectrum costs O(n³)).")
    heads: tuple[int, ...] | None = option(None, "Spectra of these heads only, e.g. 0-3.")
    approx_target: float | None = option(None, "Also run approx at each n and report the smallest budget whose "
                                         "per-layer mean head-output error reaches this.")
    methods: tuple[str, ...] = option(("svd",), "Methods for --approx-target, comma-separated: any of {methods}.")
    budget: tuple[int, ...] | None = option(None, "Budgets tried with --approx-target (default: powers of two up "
                                            "to n/2).")
    approx_samples: int | None = option(None, "Sequences per approx run (default: --samples).")
    fit_samples: int = option(0, "Calibration sequences for fitted methods with --approx-target.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", parse_lengths(self.lengths))
        object.__setattr__(self, "layers", indices(self.layers, "layer"))
        object.__setattr__(self, "heads", indices(self.heads, "head"))
        object.__setattr__(self, "methods", tuple(several(self.methods, "--methods")))
        if self.approx_target is not None and not 0 < self.approx_target < 1:
            raise SpectraError(f"{spell('--approx-target')} must be a relative error in (0, 1), got "
                               f"{self.approx_target}")
        if self.budget is not None:
            budget = tuple(sorted(set(several(self.budget, spell("--budget"), int))))
            object.__setattr__(self, "budget", tuple(check_budget(b, self.lengths[-1]) for b in budget))

    def analyze(self) -> Any:
        """The options of the analyze run at each length (the registered analysis's own dataclass)."""
        return REGISTRY["analyze"].options(spectrum_device=self.spectrum_device, layers=self.layers,
                                           heads=self.heads, bootstrap=self.bootstrap)

    def approx(self, n: int) -> Any:
        """The options of the approx run at length n."""
        budget = tuple(b for b in self.budget or default_budgets(n) if b <= n)
        return REGISTRY["approx"].options(budget=budget, methods=self.methods, layers=self.layers,
                                          target=self.approx_target, fit_samples=self.fit_samples)


class Scaling(Analysis):
    """Does the budget a head needs grow with n? Analyze at several lengths and fit rank ∝ n^α, with intervals."""

    name = "scaling"
    run_type = "ScalingRun"
    summary = "Does the budget a head needs grow with n? Analyze at several lengths and fit rank ∝ n^α, with intervals."
    options = ScalingOptions
    run_fields = tuple(name for name in Analysis.run_fields if name != "length")
    defaults = {"samples": 100}
    outputs = {"scaling.csv": ("layer", "head", "n"), "c_fixed.csv": ("layer", "head", "n", "budget"),
               "exponents.csv": ("metric", "method", "scope", "layer", "head")}

    def check(self, config: RunConfig, options: ScalingOptions, shape: checkpoints.Shape) -> None:
        super().check(replace(config, length=options.lengths[-1]), options.analyze(), shape)
        REGISTRY["analyze"].check(config, options.analyze(), shape)

    def load(self, path: Path, meta: dict[str, Any]):
        """The scaling run with its analyze run at each n (each read back through the registry)."""
        analyses = {int(n): load_run(path / name, "analyze") for n, name in meta["runs"].items()}
        return self.read_side().load(path, meta, analyses)

    def run(self, config: RunConfig, options: ScalingOptions, reporter: Reporter) -> Path:
        """Analyze (and approx) at each length into sub-directories, then the growth tables and run.json."""
        from .. import models

        lengths = options.lengths
        config = replace(config, length=lengths[-1])
        found = checkpoints.inspect(config.model, config.gguf_file)
        self.check(config, options, found.shape())
        root = Path(config.out) if config.out is not None else default_dir(
            replace(config, length=lengths[0]).default_out(f"to{lengths[-1]}-scaling", found.label), found.where)
        target = RunDir(root, overwrite=config.overwrite, resume=config.resume)
        if config.resume and not root.exists():
            reporter.notify(f"nothing to resume in {root}; starting a new run")
        started = time.perf_counter()
        parts = [f"{kind}{n}" for n in lengths
                 for kind in ("n", *(("approx-n",) if options.approx_target is not None else ()))]
        finished = config.resume and all((root / part / "run.json").exists() for part in parts)  # only read
        with models.reusing(), target.claimed():
            if not finished:  # the longest n fits the model and the data: fail before any run
                model_source(config, config.device).start()
            analyzed, approximated = self.sweep(config, options, reporter, root)
            tables = scaling_tables(analyzed)
            if approximated:
                import pandas as pd

                tables["k_needed.csv"] = k_needed_table(approximated, options.approx_target)
                tables["exponents.csv"] = pd.concat([tables["exponents.csv"],
                                                     k_needed_exponents(tables["k_needed.csv"])], ignore_index=True)
            root.mkdir(parents=True, exist_ok=True)
            for name, frame in tables.items():
                write_table(root / name, frame)
            write_meta(root, self.record(config, options, analyzed[lengths[-1]].meta, bool(approximated),
                                         time.perf_counter() - started))
        return root

    def sweep(self, config: RunConfig, options: ScalingOptions, reporter: Reporter,
              root: Path) -> tuple[dict[int, Run], dict[int, ApproxRun]]:
        """The analyze (and approx) run at each length, each resumed only if it exists, finished or interrupted:
        a sweep continued with --resume starts the lengths it never reached without saying there was nothing to
        resume."""
        analyzed: dict[int, Run] = {}
        approximated: dict[int, ApproxRun] = {}

        def at(n: int, part: Path, **changes: Any) -> RunConfig:
            begun = config.resume and (part.exists() or part.with_name(part.name + ".partial").exists())
            return replace(config, length=n, out=str(part), resume=begun, **changes)

        for step, n in enumerate(options.lengths, 1):
            reporter.notify(f"n = {n} ({step} of {len(options.lengths)})")
            try:
                analyzed[n] = load_run(REGISTRY["analyze"].run(at(n, root / f"n{n}"), options.analyze(), reporter))
                if options.approx_target is not None:
                    approx_config = at(n, root / f"approx-n{n}", samples=options.approx_samples or config.samples)
                    approximated[n] = load_run(REGISTRY["approx"].run(approx_config, options.approx(n), reporter))
            except Interrupted as stopped:  # the hint names this command, not the run inside it
                how_far = stopped.marked.split(";")[0]
                again = spell("the same spectra scaling command and --resume",
                              "spectra.scaling(…) with the same arguments and resume=True")
                raise Interrupted(f"{how_far} (n = {n}, length {step} of {len(options.lengths)}); the lengths done "
                                  f"are kept: continue with {again}") from None
        return analyzed, approximated

    def record(self, config: RunConfig, options: ScalingOptions, first: dict[str, Any], approximated: bool,
               seconds: float) -> dict[str, Any]:
        """The sweep's run.json: its settings, the model and data of its runs, where they are."""
        settings = config.settings({"bootstrap": options.bootstrap,
                                    "layers": layers_label(first.get("layers")),
                                    "heads": layers_label(first.get("heads"))})
        del settings["length"]
        lengths = list(options.lengths)
        return {
            "kind": "scaling",
            "settings": {**settings, "lengths": lengths},
            "lengths": lengths,
            "model": first["model"],
            "data": {key: value for key, value in first["data"].items() if key in ("name", "source", "split", "mode")},
            "runs": {str(n): f"n{n}" for n in lengths},
            **({"approx_runs": {str(n): f"approx-n{n}" for n in lengths}, "target": options.approx_target,
                "methods": list(options.methods)} if approximated else {}),
            "samples": config.samples,
            "fixed_budgets": [b for b in FIXED_BUDGETS if b < lengths[-1]],
            "status": "complete",
            "wall_seconds": seconds,
            "versions": versions(),
        }


register(Scaling())


# ---------------------------------------------------------------- tables


def scaling_tables(runs: dict[int, Run]) -> dict[str, pd.DataFrame]:
    """scaling.csv, c_fixed.csv and exponents.csv of analyze runs at several n (keyed by n)."""
    import pandas as pd

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
    import pandas as pd

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
    import pandas as pd

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
    import pandas as pd

    rows = []
    for method, rows_of in table[table["layer"].isna()].groupby("method", sort=False):
        fit = growth(rows_of["n"].to_numpy(), rows_of["k_needed"].to_numpy(dtype=float))
        rows.append({"metric": "k_needed", "method": method, "scope": "pooled", "layer": pd.NA, "head": pd.NA,
                     **fit.row(), "better": fit.better})
    return pd.DataFrame(rows).astype({"layer": "Int64", "head": "Int64"})
