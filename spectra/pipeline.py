"""The one loop every analysis shares: model → token blocks → forward with capture → probes → run directory.

`execute` is that loop; `analyze` (and later `theorems`, `approx`) are short functions that pick the
probe and turn its state into tables.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import pandas as pd
import torch

from . import capture, data, distributed, models
from .errors import SpectraError
from .approximate import HeadProbe, check_budgets, expand_methods, substitute
from .endtoend import EndToEnd
from .offload import Offloaded, check_place
from .runs import ApproxRun, Run, RunDir, TheoremRun, load_run
from .spectrum import METRICS, SPECTRUM_MODES, SpectrumProbe
from .theory import (Theorem1Probe, Theorem2Probe, check_eps, check_sweep, derive_seed, feed, gaussian_qkv)

#: progress(done, total) after every batch; total is the requested number of sequences
Progress = Callable[[int, int], None]


class Resumable(capture.Probe, Protocol):
    """A probe whose whole state is a dict of arrays, so a run can checkpoint and resume it."""

    def state(self) -> dict[str, np.ndarray]: ...

    def load_state(self, arrays: dict[str, np.ndarray]) -> None: ...


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
    device: str = "auto"
    dtype: str = "float32"
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

    def default_out(self, kind: str) -> Path:
        model = Path(self.model).name or self.model
        corpus = Path(self.data).stem if Path(self.data).suffix else self.data
        suffix = "" if kind == "analyze" else f"-{kind}"
        return Path("runs") / f"{model}-{corpus}-n{self.length}{suffix}"


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {}
    for name in ("spectra-attention", "torch", "transformers", "datasets", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def forward(
    loaded: models.Loaded,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    probes: Iterable[capture.Probe] = (),
    substitute: capture.Substitute | None = None,
):
    """One forward pass with capture active; checks every layer went through the capture attention."""
    with torch.inference_mode(), capture.capturing(list(probes), substitute) as state:
        outputs = loaded.model(input_ids=input_ids.to(loaded.device), attention_mask=attention_mask.to(loaded.device),
                               output_hidden_states=loaded.masked_lm)
    if len(state.layers_seen) != loaded.layers:
        raise SpectraError(
            f"the model's attention did not go through transformers' AttentionInterface "
            f"({len(state.layers_seen)} of {loaded.layers} layers seen), so spectra cannot capture it"
        )
    return outputs


#: step(loaded, batch, forward): extra work per batch, e.g. substituted forward passes
Step = Callable[[models.Loaded, data.Batch, Callable[..., Any]], None]


def run_probes(
    loaded: models.Loaded,
    batches: Iterable[data.Batch],
    probes: list[capture.Probe],
    *,
    after_batch: Callable[[int], None] | None = None,
    step: Step | None = None,
) -> int:
    """Forward every batch with the probes active (then `step`, if any); returns the sequences seen."""
    seen = 0
    for batch in batches:
        forward(loaded, batch.input_ids, batch.attention_mask, probes)
        if step is not None:
            step(loaded, batch, lambda ids, mask, substitute: forward(loaded, ids, mask, (), substitute))
        seen += batch.input_ids.shape[0]
        if after_batch is not None:
            after_batch(seen)
    return seen


def execute(
    kind: str,
    settings: Settings,
    make_probe: Callable[[models.Loaded], Resumable],
    results: Callable[[Resumable], tuple[dict[str, pd.DataFrame], dict[str, dict[str, np.ndarray]]]],
    *,
    out: str | Path | None,
    overwrite: bool,
    resume: bool,
    trust_remote_code: bool,
    progress: Progress | None,
    notify: Callable[[str], None],
    checkpoint_seconds: float,
    meta: dict[str, Any] | Callable[[models.Loaded], dict[str, Any]] | None = None,
    masked_lm: bool = False,
    step: Callable[[Resumable], Step | None] | None = None,
) -> Path:
    """Validate everything, stream the sequences through the probe, write the run; returns its path.

    Nothing touches the disk until the first checkpoint, so bad input leaves no trace.
    """
    settings.check()
    target = RunDir(out or settings.default_out(kind), overwrite=overwrite, resume=resume)
    if target.complete:
        notify(f"{target.out} is already complete; loading it")
        return target.out
    recorded = asdict(settings)
    previous = target.checkpoint_meta()
    if previous is not None and previous["settings"] != recorded:
        changed = sorted(key for key, value in recorded.items() if previous["settings"].get(key) != value)
        raise SpectraError(f"cannot resume {target.partial}: it was started with different {', '.join(changed)}")

    device: str | torch.device = settings.device
    if distributed.requested():
        if resume:
            raise SpectraError("--resume is not supported across processes; resume with a single process")
        device = distributed.start(models.pick_device(settings.device))
        checkpoint_seconds = float("inf")  # the shares are combined only at the end
        notify = notify if distributed.is_main() else (lambda line: None)
        progress = progress if distributed.is_main() else None
    corpus = data.open_corpus(settings.data, split=settings.split, text_column=settings.text_column, seed=settings.seed)
    loaded = models.load(settings.model, device=device, dtype=settings.dtype, masked_lm=masked_lm,
                         trust_remote_code=trust_remote_code)
    n = settings.length
    if n > loaded.max_length:
        raise SpectraError(f"--length {n} exceeds what {loaded.name} can embed ({loaded.max_length} tokens)")
    if settings.mode == "pack" and next(data.sequences(loaded.tokenizer, corpus, n, "pack"), None) is None:
        raise SpectraError(
            f"data '{settings.data}' is too short to make one sequence of {n} tokens in pack mode; "
            "use a smaller --length, more text or --mode truncate"
        )

    probe = make_probe(loaded)
    record: dict[str, Any] = {
        "kind": kind,
        "settings": recorded,
        "model": {"name": loaded.name, "source": loaded.source, "revision": loaded.revision,
                  "layers": loaded.layers, "heads": loaded.heads},
        "data": {**corpus.describe(), "mode": settings.mode},
        "n": n,
        **((meta(loaded) if callable(meta) else meta) or {}),
        "device": str(loaded.device),
        "dtype": settings.dtype,
        "versions": _versions(),
    }
    done, elapsed = 0, 0.0
    if previous is not None:
        state, done = target.load_checkpoint()
        probe.load_state(state)
        elapsed = float(previous.get("wall_seconds", 0.0))
        notify(f"resuming {target.partial} after {done} sequences")
    target.begin(record)
    start = last_save = time.perf_counter()

    def after_batch(seen: int) -> None:
        nonlocal last_save
        if time.perf_counter() - last_save >= checkpoint_seconds:
            target.save_checkpoint(probe.state(), done + seen, wall_seconds=elapsed + time.perf_counter() - start)
            last_save = time.perf_counter()
        if progress is not None:  # with several processes: this one's share, scaled
            progress(min(done + seen * distributed.size(), settings.samples), settings.samples)

    if progress is not None:
        progress(done, settings.samples)
    stream = data.batches(loaded.tokenizer, corpus, n, settings.mode, settings.samples, settings.batch_size, skip=done,
                          shard=(distributed.rank(), distributed.size()))
    try:
        seen = run_probes(loaded, stream, [probe], after_batch=after_batch, step=step(probe) if step else None)
        probe.load_state(distributed.reduce_state(probe.state(), loaded.device))
    finally:
        if hasattr(probe, "close"):  # a probe with a worker thread (offload.Offloaded)
            probe.close()
    processed = done + distributed.total(seen, loaded.device)
    if processed < settings.samples:
        notify(f"the corpus yields {processed} sequences of the {settings.samples} asked for; all of them were used")
    record.update(status="complete", samples=processed, wall_seconds=elapsed + time.perf_counter() - start,
                  processes=distributed.size(), **(probe.describe() if hasattr(probe, "describe") else {}))
    if distributed.is_main():
        tables, arrays = results(probe)
        target.finish(record, tables, arrays)
    distributed.barrier()
    return target.out


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
    spectrum: str = "exact",
    spectrum_device: str = "auto",
    overlap: bool | None = None,
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

    `spectrum_device` and `overlap` say where and when the singular values are computed (see
    `spectra.offload`); they change the speed, not the numbers. Returns the loaded run; see
    `spectra.runs.Run` for its tables and curves.
    """
    if at is not None and not 1 <= at <= length:
        raise SpectraError(f"--at must be an index in 1…{length} (the sequence length), got {at}")
    at = at or max(1, length // 4)
    if spectrum not in SPECTRUM_MODES:
        raise SpectraError(f"unknown --spectrum '{spectrum}'; use one of {', '.join(SPECTRUM_MODES)}")
    check_place(spectrum_device)
    settings = Settings(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device, dtype,
                        extra={"at": at, "spectrum": spectrum})
    path = execute(
        "analyze", settings,
        make_probe=lambda loaded: Offloaded(SpectrumProbe(loaded.layers, loaded.heads, length, at, spectrum),
                                            spectrum_device, overlap),
        results=lambda spectra: ({"metrics.csv": metrics_table(spectra.probe)},
                                 {"curves.npz": curves_arrays(spectra.probe)}),
        out=out, overwrite=overwrite, resume=resume, trust_remote_code=trust_remote_code, progress=progress,
        notify=notify, checkpoint_seconds=checkpoint_seconds, meta={"at": at, "spectrum": spectrum},
    )
    return load_run(path)


def metrics_table(probe: SpectrumProbe) -> pd.DataFrame:
    """One row per (layer, head): sequences, then mean and std of every metric."""
    layer, head = np.meshgrid(np.arange(probe.layers), np.arange(probe.heads), indexing="ij")
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


DEFAULT_METHODS = ("svd", "jl", "linformer", "pool-mean", "pool-max")


def parse_layers(text: str | None) -> list[int] | None:
    """'6-11' or '0,3,5-7' → sorted layer indices (0-based); None or 'all' → None (every layer)."""
    if text is None or text.strip() in ("", "all"):
        return None
    layers: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            layers.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SpectraError(f"--layers '{text}' is not a list of layers like 6-11 or 0,3,5-7") from None
    if not layers:
        raise SpectraError(f"--layers '{text}' selects no layer")
    return sorted(layers)


class _ApproxProbe:
    """The per-head probe and, with --end-to-end, the substitution accumulator, checkpointed together."""

    def __init__(self, heads: HeadProbe, end_to_end: EndToEnd | None) -> None:
        self.heads, self.end_to_end = heads, end_to_end

    def update(self, *args, **kwargs) -> None:
        self.heads.update(*args, **kwargs)

    def state(self) -> dict[str, np.ndarray]:
        return {**self.heads.state(), **(self.end_to_end.state() if self.end_to_end else {})}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self.heads.load_state(arrays)
        if self.end_to_end:
            self.end_to_end.load_state(arrays)


def approx(
    model: str,
    data_source: str = "imdb",
    *,
    budgets: Iterable[int] = (128,),
    methods: Iterable[str] = DEFAULT_METHODS,
    end_to_end: bool = False,
    layers: str | Iterable[int] | None = None,
    target: float = 0.1,
    projection: str = "gaussian",
    length: int = 512,
    samples: int = 1000,
    mode: str = "pack",
    batch_size: int = 8,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    out: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> ApproxRun:
    """How well each method approximates `model`'s attention at each budget k: per head on the exact
    model's own q, k, v, and with `end_to_end` substituted into the forward pass (hidden-state drift and,
    when the checkpoint has a masked-LM head, masked-LM perplexity).
    """
    labels = expand_methods(list(methods))
    budgets = check_budgets(list(budgets), length)
    if not 0 < target < 1:
        raise SpectraError(f"--target must be a relative error in (0, 1), got {target}")
    chosen = parse_layers(layers) if isinstance(layers, (str, type(None))) else sorted(set(layers))
    settings = Settings(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device, dtype,
                        extra={"budgets": budgets, "methods": labels, "end_to_end": end_to_end, "layers": chosen,
                               "target": target, "projection": projection})

    def make_probe(loaded: models.Loaded) -> _ApproxProbe:
        if chosen is not None and (chosen[0] < 0 or chosen[-1] >= loaded.layers):
            raise SpectraError(f"--layers must lie in 0…{loaded.layers - 1} for {loaded.name}, got {layers}")
        if end_to_end and not loaded.masked_lm:
            notify(f"{loaded.name} has no masked-LM head: --end-to-end measures the hidden-state drift only")
        heads = HeadProbe(labels, budgets, loaded.layers, loaded.heads, seed=seed, projection=projection,
                          target=target)
        subs = {(label, budget): substitute(label, budget, None if chosen is None else set(chosen), seed=seed,
                                            projection=projection)
                for label in labels for budget in budgets}
        return _ApproxProbe(heads, EndToEnd(subs, seed) if end_to_end else None)

    def results(probe: _ApproxProbe) -> tuple[dict[str, pd.DataFrame], dict]:
        tables = {"heads.csv": probe.heads.table()}
        if probe.end_to_end is not None:
            tables["end_to_end.csv"] = probe.end_to_end.table("all" if chosen is None else layers_label(chosen))
        return tables, {}

    path = execute(
        "approx", settings, make_probe, results,
        out=out, overwrite=overwrite, resume=resume, trust_remote_code=trust_remote_code, progress=progress,
        notify=notify, checkpoint_seconds=checkpoint_seconds, masked_lm=end_to_end,
        meta=lambda loaded: {"budgets": budgets, "methods": labels, "target": target, "projection": projection,
                             "end_to_end": end_to_end, "layers": chosen, "masked_lm": loaded.masked_lm},
        step=lambda probe: probe.end_to_end.step if probe.end_to_end else None,
    )
    return load_run(path)


def layers_label(layers: list[int]) -> str:
    """[6, 7, 8, 11] → '6-8,11'."""
    parts, start = [], layers[0]
    for previous, current in zip(layers, layers[1:] + [None]):
        if current != previous + 1:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = current
    return ",".join(parts)


class _TheoremProbes:
    """Theorem 1 and Theorem 2 probes fed together and checkpointed together."""

    def __init__(self, layers: int, heads: int, n: int, budgets: list[int], eps: list[float], seed: int) -> None:
        self.one = Theorem1Probe(layers, heads, n, budgets, eps, seed=seed)
        self.two = Theorem2Probe(layers, heads, n, budgets, eps, seed=seed)

    def update(self, *args, **kwargs) -> None:
        self.one.update(*args, **kwargs)
        self.two.update(*args, **kwargs)

    def state(self) -> dict[str, np.ndarray]:
        return {**self.one.state(), **self.two.state()}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self.one.load_state(arrays)
        self.two.load_state(arrays)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Each theorem pooled over layers and heads, per layer, and per head."""
        tables = {}
        for name, probe in (("theorem1", self.one), ("theorem2", self.two)):
            tables[f"{name}.csv"] = probe.result(pool=("layer", "head"))
            tables[f"{name}_layers.csv"] = probe.result(pool=("head",))
            tables[f"{name}_heads.csv"] = probe.result()
        return tables


def theorems(
    model: str | None,
    data_source: str = "imdb",
    *,
    budgets: Iterable[int] = (16, 32, 64, 128, 256),
    eps: Iterable[float] = (0.1, 0.2, 0.3, 0.5),
    synthetic: bool = False,
    d: int = 64,
    heads: int = 1,
    length: int = 512,
    samples: int = 100,
    mode: str = "pack",
    batch_size: int = 8,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    out: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> TheoremRun:
    """Theorems 1 and 2 checked on a model's captured attention, or on Gaussian q, k, v (`synthetic`):
    empirical Pr(error ≤ ε) against the bounds, and the errors of JL, truncated SVD and eq. 7."""
    budgets, eps = list(check_sweep(list(budgets), length)), list(check_eps(list(eps)))
    meta = {"budgets": budgets, "eps": eps, "synthetic": synthetic}
    if synthetic:
        return _synthetic_theorems(budgets, eps, d=d, heads=heads, n=length, samples=samples, batch_size=batch_size,
                                   seed=seed, device=device, out=out, overwrite=overwrite, meta=meta,
                                   progress=progress)
    if model is None:
        raise SpectraError("give a model, or pass --synthetic for Gaussian q, k, v")
    settings = Settings(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device, dtype,
                        extra={"budgets": budgets, "eps": eps})
    path = execute(
        "theorems", settings,
        make_probe=lambda loaded: _TheoremProbes(loaded.layers, loaded.heads, length, budgets, eps, seed),
        results=lambda probe: (probe.tables(), {}),
        out=out, overwrite=overwrite, resume=resume, trust_remote_code=trust_remote_code, progress=progress,
        notify=notify, checkpoint_seconds=checkpoint_seconds, meta=meta,
    )
    return load_run(path)


def _synthetic_theorems(budgets: list[int], eps: list[float], *, d: int, heads: int, n: int, samples: int,
                        batch_size: int, seed: int, device: str, out: str | Path | None, overwrite: bool,
                        meta: dict[str, Any], progress: Progress | None) -> TheoremRun:
    """The theorems on i.i.d. N(0, 1) q, k, v of n tokens and d dimensions: no model, no corpus."""
    if samples < 1 or batch_size < 1 or d < 1 or heads < 1:
        raise SpectraError("--samples, --batch-size, --d and --heads must be at least 1")
    target = RunDir(out or Path("runs") / f"synthetic-n{n}-d{d}-theorems", overwrite=overwrite)
    torch_device = models.pick_device(device)
    probes = _TheoremProbes(1, heads, n, budgets, eps, seed)
    target.begin({})
    start, done = time.perf_counter(), 0
    while done < samples:
        batch = min(batch_size, samples - done)
        q, k, v = gaussian_qkv(n, d, heads=heads, batch=batch, seed=derive_seed(seed, done), device=torch_device)
        feed([probes], 0, q, k, v)
        done += batch
        if progress is not None:
            progress(done, samples)
    record = {"kind": "theorems", "settings": {"synthetic": True, "n": n, "d": d, "heads": heads, "samples": samples,
                                               "batch_size": batch_size, "seed": seed},
              "model": {"name": f"gaussian(d={d})", "layers": 1, "heads": heads}, "data": {"name": "synthetic"},
              "n": n, **meta, "samples": samples, "device": str(torch_device), "versions": _versions(),
              "status": "complete", "wall_seconds": time.perf_counter() - start}
    return load_run(target.finish(record, probes.tables(), {}))
