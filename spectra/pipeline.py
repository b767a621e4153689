"""The one loop every analysis shares: model → token blocks → forward with capture → probes → run directory."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import torch

from . import capture, data, models
from .errors import SpectraError
from .runs import Run, RunDir, load_run
from .spectrum import METRICS, SpectrumProbe

#: progress(done, total) after every batch; total is the requested number of sequences
Progress = Callable[[int, int], None]


@dataclass
class Settings:
    """What a run was asked for; recorded in run.json and compared on --resume."""

    model: str
    data: str
    length: int = 512
    samples: int = 10000
    mode: str = "pack"
    batch_size: int = 8
    seed: int = 0
    split: str | None = None
    text_column: str | None = None
    at: int | None = None
    device: str = "auto"
    dtype: str = "float32"
    trust_remote_code: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if self.length < 2:
            raise SpectraError(f"--length must be at least 2, got {self.length}")
        if self.samples < 1:
            raise SpectraError(f"--samples must be at least 1, got {self.samples}")
        if self.batch_size < 1:
            raise SpectraError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.mode not in data.MODES:
            raise SpectraError(f"unknown --mode '{self.mode}'; use one of {', '.join(data.MODES)}")
        if self.at is not None and not 1 <= self.at <= self.length:
            raise SpectraError(f"--at must be an index in 1…{self.length} (the sequence length), got {self.at}")

    def comparable(self) -> dict[str, Any]:
        """The settings recorded in run.json; all must match for a checkpoint to be resumed."""
        keep = dict(vars(self))
        keep.pop("trust_remote_code")
        return keep


def default_out(settings: Settings) -> Path:
    model = Path(settings.model).name or settings.model
    corpus = Path(settings.data).stem if Path(settings.data).suffix else settings.data
    return Path("runs") / f"{model.split('/')[-1]}-{corpus}-n{settings.length}"


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    names = ("spectra-attention", "torch", "transformers", "datasets", "numpy")
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def run_probes(
    loaded: models.Loaded,
    batches: Iterable[data.Batch],
    probes: list[capture.Probe],
    *,
    after_batch: Callable[[int], None] | None = None,
    substitute: capture.Substitute | None = None,
) -> int:
    """Forward every batch with capture active; returns the number of sequences seen."""
    seen = 0
    for batch in batches:
        with torch.inference_mode(), capture.capturing(probes, substitute) as state:
            loaded.model(
                input_ids=batch.input_ids.to(loaded.device), attention_mask=batch.attention_mask.to(loaded.device)
            )
        if state.calls == 0 or len(state.layers_seen) != loaded.layers:
            raise SpectraError(
                f"the model's attention did not go through transformers' AttentionInterface "
                f"({len(state.layers_seen)} of {loaded.layers} layers seen), so spectra cannot capture it "
                f"(checked families: roberta, bert)"
            )
        seen += batch.input_ids.shape[0]
        if after_batch is not None:
            after_batch(seen)
    return seen


def analyze(
    model: str,
    data_source: str = "imdb",
    *,
    length: int = 512,
    samples: int = 10000,
    mode: str = "pack",
    batch_size: int = 8,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    at: int | None = None,
    device: str = "auto",
    dtype: str = "float32",
    out: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> Run:
    """Singular spectra of P for every layer and head of `model` over `samples` sequences of `data_source`.

    Returns the loaded run; see `spectra.runs.Run` for its tables and curves.
    """
    settings = Settings(model, data_source, length, samples, mode, batch_size, seed, split, text_column, at,
                        device, dtype, trust_remote_code)
    settings.check()
    settings.at = at or max(1, length // 4)
    target = RunDir(out or default_out(settings), overwrite=overwrite, resume=resume)
    if target.complete:
        notify(f"{target.out} is already complete; loading it")
        return load_run(target.out)
    previous = target.checkpoint_meta()
    if previous is not None and previous["settings"] != settings.comparable():
        changed = sorted(k for k, v in settings.comparable().items() if previous["settings"].get(k) != v)
        raise SpectraError(f"cannot resume {target.partial}: it was started with different {', '.join(changed)}")

    corpus = data.open_corpus(data_source, split=split, text_column=text_column, seed=seed)
    loaded = models.load(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    if length > loaded.max_length:
        raise SpectraError(f"--length {length} exceeds what {loaded.name} can embed ({loaded.max_length} tokens)")
    if mode == "pack" and next(data.sequences(loaded.tokenizer, corpus, length, mode), None) is None:
        raise SpectraError(
            f"data '{data_source}' is too short to make one sequence of {length} tokens in pack mode; "
            "use a smaller --length, more text or --mode truncate"
        )

    probe = SpectrumProbe(loaded.layers, loaded.heads, length, settings.at)
    meta: dict[str, Any] = {
        "kind": "analyze",
        "settings": settings.comparable(),
        "model": {"name": loaded.name, "source": loaded.source, "revision": loaded.revision,
                  "layers": loaded.layers, "heads": loaded.heads},
        "data": {**corpus.describe(), "mode": mode},
        "n": length,
        "at": settings.at,
        "device": str(loaded.device),
        "dtype": dtype,
        "versions": _versions(),
    }
    done, elapsed = 0, 0.0
    if previous is not None:
        state, done = target.load_checkpoint()
        probe.load_state(state)
        elapsed = float(previous.get("wall_seconds", 0.0))
        notify(f"resuming {target.partial} after {done} sequences")
    target.begin(meta)

    start, last_save = time.perf_counter(), time.perf_counter()

    def after_batch(seen: int) -> None:
        nonlocal last_save
        if time.perf_counter() - last_save >= checkpoint_seconds:
            target.save_checkpoint(probe.state(), done + seen, wall_seconds=elapsed + time.perf_counter() - start)
            last_save = time.perf_counter()
        if progress is not None:
            progress(done + seen, samples)

    if progress is not None:
        progress(done, samples)
    stream = data.batches(loaded.tokenizer, corpus, length, mode, samples, batch_size, skip=done)
    processed = done + run_probes(loaded, stream, [probe], after_batch=after_batch)
    if processed < samples:
        notify(f"the corpus yields {processed} sequences of the {samples} asked for; all of them were used")

    meta.update(status="complete", samples=processed, wall_seconds=elapsed + time.perf_counter() - start)
    target.finish(meta, {"metrics.csv": metrics_table(probe)}, {"curves.npz": curves_arrays(probe)})
    return load_run(target.out)


def metrics_table(probe: SpectrumProbe) -> pd.DataFrame:
    """One row per (layer, head): sequences, then mean and std of every metric."""
    layers, heads = probe.layers, probe.heads
    layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    columns: dict[str, np.ndarray] = {
        "layer": layer.ravel(),
        "head": head.ravel(),
        "sequences": probe.metrics.count.ravel().astype(np.int64),
    }
    mean, std = probe.metrics.mean, probe.metrics.std
    for i, name in enumerate(METRICS):
        columns[f"{name}_mean"] = mean[..., i].ravel()
        columns[f"{name}_std"] = std[..., i].ravel()
    return pd.DataFrame(columns)


def curves_arrays(probe: SpectrumProbe) -> dict[str, np.ndarray]:
    return {
        "index": np.arange(1, probe.n + 1),
        "cum_mean": probe.cum.mean,
        "cum_std": probe.cum.std,
        "sigma_mean": probe.sigma.mean,
        "sigma_std": probe.sigma.std,
    }
