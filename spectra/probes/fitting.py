"""The calibration pass of `spectra approx --fit-samples N`: fit projections on the first N sequences, once.

The loop streams sequences 0 … N + S − 1; the first N calibrate and are never evaluated. This probe keeps their
q, k, v per layer (a light copy: no mask, no P), and when the last calibration batch has gone by it builds,
for every fitted method and budget, its projections (`nn.fit.pca_projections`, `nn.fit.fit_projections`) into
`fitted`, a dict the per-head probe and end to end read by reference. It then measures every method on the
calibration sequences themselves (`heads_calibration.csv`: beside the held-out `heads.csv`, the gap shows how
much fixed projections overfit) and lets the copies go. Its results: the projections (`projections.npz`,
loadable with `spectra.nn.projections.load_projections`) and each fit's history (`fit_history.csv`).

A run can be checkpointed only once the fit is done (before, its state would be the calibration tensors
themselves); an interrupted calibration starts again on --resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..config import FitInit, Sharing
from ..methods import Layer
from ..methods.fitted import sharing_of
from ..nn.calibration import Calibration
from ..nn.fit import fit_projections, pca_projections
from ..nn.projections import Projections, projections_arrays, projections_from_arrays
from ..stats import State, tagged
from .approx import HeadProbe
from .base import Probe


class Fitting(Probe):
    """Calibration sequences in, fitted projections out (see the module docstring)."""

    def __init__(self, options: Any, layers: int, heads: int, n: int, *, seed: int = 0,
                 notify: Callable[[str], None] = print) -> None:
        self.options, self.layers, self.heads, self.n, self.seed, self.notify = options, layers, heads, n, seed, notify
        self.boundary = options.fit_samples
        self.labels = [label for label in options.methods if label.startswith(("linformer-pca", "linformer-fit"))]
        self.fitted: dict[tuple[str, int], Projections] = {}
        self.history = pd.DataFrame()
        self.calibration = HeadProbe(options, layers, heads, seed=seed, fitted=self.fitted,
                                     file="heads_calibration.csv")
        self.records: dict[int, list[Captured]] = {}
        self.done = False

    def update(self, captured: Captured) -> None:
        index = captured.sequence_index()
        if min(index) >= self.boundary:
            self.fit()  # the first evaluated batch: the calibration is complete
            return
        light = Captured(captured.layer, captured.q.detach().cpu().clone(), captured.key.detach().cpu().clone(),
                         captured.value.detach().cpu().clone(), captured.valid.cpu(), captured.scaling,
                         captured.causal, None, captured.index)
        self.records.setdefault(captured.layer, []).append(light)

    def after_batch(self, batch) -> None:
        if max(batch.index) >= self.boundary - 1:
            self.fit()

    def ready(self) -> bool:
        return self.done

    def fit(self) -> None:
        """Fit every method's projections at every budget on the calibration kept so far (once)."""
        if self.done:
            return
        calibrations = [Calibration.of(records) for _, records in sorted(self.records.items())]
        count = calibrations[0].sequences if calibrations else 0
        held = round(count * self.options.fit_validation)
        self.notify(f"calibration: {count} sequences, {sum(c.nbytes for c in calibrations) / 2**20:.0f} MiB of q, k, "
                    f"v; fitting {len(self.labels)} method(s) at {len(self.options.fit_budgets)} budget(s) "
                    f"({held} sequences held out to choose the fit's step)")
        histories = []
        for label in self.labels:
            for budget in self.options.fit_budgets:
                sharing = sharing_of(label)
                shape = (calibrations, self.layers, self.heads, budget, self.n, sharing)
                if label.startswith("linformer-pca"):
                    self.fitted[(label, budget)] = pca_projections(*shape)
                    continue
                init = pca_projections(*shape) if self.options.fit_init == FitInit.PCA else None
                groups = 1 if sharing == Sharing.LAYERWISE else len(calibrations)
                fit = fit_projections(*shape, init=init, steps=self.options.fit_steps, lr=self.options.fit_lr,
                                      seed=self.seed, validation=self.options.fit_validation,
                                      progress=self._timing(f"{label} at k = {budget}", groups))
                self.fitted[(label, budget)] = fit.projections
                histories.append(fit.history.assign(method=label, budget=budget))
                kept = ", ".join(f"{step}" for step in fit.best_step.values())
                self.notify(f"fitted {label} at k = {budget}: kept step(s) {kept} of {self.options.fit_steps}")
        self.history = pd.concat(histories, ignore_index=True) if histories else pd.DataFrame()
        if len(self.history):
            self.history = self.history[["method", "budget", *[c for c in self.history.columns
                                                                if c not in ("method", "budget")]]]
        with torch.inference_mode():
            for records in self.records.values():
                for record in records:
                    self.calibration.measure(Layer.of(record, use_p=False, seed=self.seed,
                                                      projection=self.options.projection,
                                                      fixed=self.options.fixed_projection, fitted=self.fitted))
        self.records, self.done = {}, True

    def _timing(self, what: str, groups: int) -> Callable[[dict], None]:
        """A fit's progress callback: once its first group (layer) is fitted, one line with the time it took and
        what the rest will take, so a long fit is not silent."""
        started, steps, said = time.perf_counter(), self.options.fit_steps, []

        def progress(row: dict) -> None:
            if row["step"] == steps and not said and groups > 1:
                took = time.perf_counter() - started
                said.append(took)
                self.notify(f"fitting {what}: the first of {groups} layers took {took:.0f} s; about "
                            f"{took * (groups - 1) / 60:.1f} min more")

        return progress

    def state(self) -> State:
        arrays = {f"fitted.{key}": value for key, value in projections_arrays(self.fitted).items()}
        history = {f"history.{column}": self.history[column].to_numpy() for column in self.history.columns
                   if column != "method"}
        if len(self.history):
            history["history.method"] = np.array([self.labels.index(m) for m in self.history["method"]])
        return {**tagged(arrays), **tagged(history), **self.calibration.state()}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.calibration.load_state(arrays)
        fitted = {key[len("fitted."):]: value for key, value in arrays.items() if key.startswith("fitted.")}
        self.fitted.clear()
        self.fitted.update(projections_from_arrays(fitted))
        columns = {key[len("history."):]: value for key, value in arrays.items() if key.startswith("history.")}
        if columns:
            frame = pd.DataFrame(columns)
            frame["method"] = [self.labels[int(i)] for i in frame["method"]]
            self.history = frame[["method", *[c for c in frame.columns if c != "method"]]]
        self.done = True

    def tables(self) -> dict[str, pd.DataFrame]:
        tables = dict(self.calibration.tables())
        if len(self.history):
            tables["fit_history.csv"] = self.history
        return tables

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        return {"projections.npz": projections_arrays(self.fitted)} if self.fitted else {}

    def describe(self) -> dict:
        return {"calibration": {"sequences": [0, self.boundary], "fitted": sorted({label for label, _ in self.fitted})}}
