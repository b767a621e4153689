"""The calibration pass of `spectra approx --fit-samples N`: fit every calibrating method on the first N sequences, once.

The loop streams sequences 0 … N + S − 1; the first N calibrate and are never evaluated. This probe keeps their
q, k, v per layer (a light copy: no mask, no P), and when the last calibration batch has gone by it hands them
(`nn.calibration.Calibration`, one per layer) and the run's fit settings to each method that says it
`calibrates` — the run's own fresh instance of it, in `fitted`, which the per-head probe and end to end read by
reference. It then measures every method on the calibration sequences themselves (`heads_calibration.csv`:
beside the held-out `heads.csv`, the gap shows how much fitted parameters overfit) and lets the copies go. Its
results: the fitted parameters (`projections.npz`; a Linformer's load with
`spectra.nn.projections.load_projections`) and each fit's history (`fit_history.csv`).

Whether a method may be fitted on a decoder's causal attention is the method's to say (`Method.causal`): the
Linformer's eq. 7 mixes every key into each projected key and is refused there before any work,
`fastformer-fit-causal` is fitted on the causal attention itself (each calibration's target is the causal P V).
A run can be checkpointed only once the fit is done (before, its state would be the calibration tensors
themselves); an interrupted calibration starts again on --resume.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..errors import InternalError, SpectraError
from ..methods import REGISTRY, Calibrated, Layer
from ..reporter import Reporter, plural
from ..nn.calibration import Calibration
from ..nn.descent import FitSettings, held_out
from ..stats import State, tagged
from .approx import ApproxProbe
from .base import Probe


class Fitting(Probe):
    """Calibration sequences in, fitted methods out (see the module docstring)."""

    def __init__(self, options: Any, layers: int, heads: int, n: int, *, seed: int = 0, causal: bool = False,
                 reporter: Reporter = Reporter()) -> None:
        """`causal`: the model's attention is causal (a decoder's), so every method fitted must be causal too."""
        self.options, self.layers, self.heads, self.n, self.reporter = options, layers, heads, n, reporter
        self.fit_samples = options.fit_samples
        self.settings = FitSettings.of(options, seed)
        calibrating = [REGISTRY[label] for label in options.methods if REGISTRY[label].calibrates]
        refused = [method.label for method in calibrating if causal and not method.causal]
        if refused:
            usable = ", ".join(label for label, method in REGISTRY.items() if method.calibrates and method.causal)
            raise SpectraError(f"{refused[0]} cannot be fitted on a decoder's causal attention: it lets each query "
                               f"see later tokens; the fitted methods for decoders: {usable}")
        self.fitted: dict[str, Calibrated] = {method.label: method.fresh() for method in calibrating}
        self.labels = list(self.fitted)
        self.history = pd.DataFrame()
        self.calibration = ApproxProbe(options, layers, heads, seed=seed, fitted=self.fitted,
                                     file="heads_calibration.csv", calibration=True)
        self.records: dict[int, list[Captured]] = {}
        self.done = False

    def update(self, captured: Captured) -> None:
        if min(captured.sequence_index()) >= self.fit_samples:
            return  # an evaluated batch: the fit was done after the last calibration batch (`after_batch`)
        if captured.causal and any(not method.causal for method in self.fitted.values()):
            raise InternalError(f"layer {captured.layer} is causal but the fitting probe was made for a bidirectional "
                                "model")
        light = Captured(captured.layer, captured.q.detach().cpu().clone(), captured.key.detach().cpu().clone(),
                         captured.value.detach().cpu().clone(), captured.valid.cpu(), captured.scaling,
                         captured.causal, None, captured.index)
        self.records.setdefault(captured.layer, []).append(light)

    def after_batch(self, batch) -> None:
        if max(batch.index) >= self.fit_samples - 1:
            self.fit()

    def ready(self) -> bool:
        return self.done

    def fit(self) -> None:
        """Fit every calibrating method on the calibration kept so far (once), then measure it there."""
        if self.done:
            return
        calibrations = [Calibration.of(records) for _, records in sorted(self.records.items())]
        count = calibrations[0].sequences if calibrations else 0
        held = held_out(count, self.options.fit_validation)
        self.reporter.notify(f"calibration: {plural(count, 'sequence')}, "
                             f"{sum(c.nbytes for c in calibrations) / 2**20:.0f} MiB of q, k, v; fitting "
                             f"{plural(len(self.labels), 'method')} at {plural(len(self.options.fit_budgets), 'budget')} "
                             f"({plural(held, 'sequence')} held out to choose the fit's step)")
        histories = []
        for label, method in self.fitted.items():
            history = method.fit(calibrations, layers=self.layers, heads=self.heads, n=self.n,
                                 settings=self.settings, reporter=self.reporter)
            if len(history):
                histories.append(history.assign(method=label))
        self.history = pd.concat(histories, ignore_index=True) if histories else pd.DataFrame()
        if len(self.history):
            self.history = self.history[["method", "budget", *[c for c in self.history.columns
                                                                if c not in ("method", "budget")]]]
        with torch.inference_mode():
            for records in self.records.values():
                for record in records:
                    self.calibration.measure(Layer.of(record, use_p=False), self.calibration.draws(record))
        self.records, self.done = {}, True

    def fitted_arrays(self) -> dict[str, np.ndarray]:
        """Every fitted method's parameters as arrays, in the order of their entries' names ("<label>|<budget>"
        for a Linformer's projections; a stable sort keeps each entry's own order), so a run writes the same file
        whether or not its state went through a checkpoint."""
        found = {key: value for method in self.fitted.values() for key, value in method.arrays().items()}
        return dict(sorted(found.items(), key=lambda item: item[0].rsplit("|", 1)[0]))

    def state(self) -> State:
        arrays = {f"fitted.{key}": value for key, value in self.fitted_arrays().items()}
        history = {f"history.{column}": self.history[column].to_numpy() for column in self.history.columns
                   if column != "method"}
        if len(self.history):
            history["history.method"] = np.array([self.labels.index(m) for m in self.history["method"]])
        return {**tagged(arrays), **tagged(history), **self.calibration.state()}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.calibration.load_state(arrays)
        fitted = {key[len("fitted."):]: value for key, value in arrays.items() if key.startswith("fitted.")}
        for method in self.fitted.values():
            method.load_arrays(fitted)
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
        found = self.fitted_arrays()
        return {"projections.npz": found} if found else {}

    def describe(self) -> dict:
        fitted = sorted(label for label, method in self.fitted.items() if method.fitted)
        return {"calibration": {"sequences": [0, self.fit_samples], "fitted": fitted}}
