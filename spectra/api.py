"""The public analyses: short functions that turn keyword options into a `loop.Job` and load the finished run.

- `analyze`: singular spectra of P for every layer and head (`probes.spectrum`);
- `approx`: how well each method stands in at each budget, per head and end to end (`probes.approx`,
  `probes.endtoend`);
- `theorems`: Theorems 1 and 2 against a model's attention or Gaussian q, k, v (`probes.theorems`).

Their keyword signatures are the API users read; the options are validated once, in `spectra.config`.
"""

from __future__ import annotations

import os
from itertools import islice
from typing import TYPE_CHECKING, Callable, Iterable

from . import checkpoints, distributed
from .config import (AnalyzeOptions, ApproxOptions, Output, RunConfig, SyntheticConfig, TheoremOptions,
                     check_budget, layers_label, parse_layers)
from .errors import SpectraError, option
from .inputs import budgets_or_default, path_text, several
from .loop import Job, Progress, Reporter, execute
from .runs import ApproxRun, Run, TheoremRun, load_run
from .spectrum import sink_start

if TYPE_CHECKING:
    from .sources import ModelSource

DEFAULT_METHODS = ("svd", "jl", "linformer", "pool-mean", "pool-max")
#: the budgets approx and theorems use when none are given
APPROX_BUDGETS, THEOREM_BUDGETS = (128,), (16, 32, 64, 128, 256)
#: a path: a str or an os.PathLike such as pathlib.Path
PathLike = str | os.PathLike


def analyze(
    model: PathLike,
    data_source: PathLike = "imdb",
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
    qkv: bool | None = None,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    bootstrap: int = 0,
    device: str = "auto",
    dtype: str = "float32",
    gguf_file: PathLike | None = None,
    out: PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> Run:
    """Singular spectra of P for every layer and head of `model` over `samples` sequences of `data_source`.

    `spectrum_device` and `overlap` say where and when the singular values are computed (see
    `spectra.probes.offload`); they change the speed, not the numbers. `qkv` adds the spectra of queries, keys
    and values (default: for decoders). `layers`, `heads` ("0,3,5-7" or indices) restrict the spectra to those;
    `bootstrap` keeps replicates of the mean ranks. A GGUF checkpoint is MODEL as a `.gguf` file, or its
    directory with `gguf_file`. Paths may be str or `pathlib.Path`. Returns the loaded run; see `spectra.runs.Run`
    for its tables and curves.
    """
    from .probes import Probes
    from .probes.offload import Offloaded
    from .probes.qkv import QKVProbe
    from .probes.spectrum import SpectrumProbe
    from .sources import ModelSource

    config = RunConfig(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device, dtype,
                       trust_remote_code, gguf_file)
    options = AnalyzeOptions(at, spectrum, spectrum_device, overlap, qkv, _indices(layers, "layer"),
                             _indices(heads, "head"), bootstrap).resolved(length)
    found = checkpoints.inspect(config.model, config.gguf_file)

    def build_probe(source: ModelSource) -> Probes:
        loaded = source.loaded
        for chosen, count, name in ((options.layers, source.layers, "--layers"),
                                    (options.heads, source.heads, "--heads")):
            if chosen is not None and (chosen[0] < 0 or chosen[-1] >= count):
                raise SpectraError(f"{option(name)} must lie in 0…{count - 1} for {loaded.name}, got {list(chosen)}")
        spectra_probe = SpectrumProbe(source.layers, source.heads, length, options.at, options.spectrum,
                                      select_layers=options.layers, select_heads=options.heads,
                                      bootstrap=options.bootstrap, seed=seed)
        probes = {"spectrum": Offloaded(spectra_probe, options.spectrum_device, options.overlap, warn=notify)}
        if options.qkv or (options.qkv is None and loaded.causal):
            probes["qkv"] = QKVProbe(loaded.model, loaded.layers, loaded.heads, source.kv_heads, loaded.head_dim)
        return Probes(**probes)

    job = Job(
        "analyze", config.settings(options.identity()), samples, batch_size, config.device,
        config.default_out("analyze", found.label), found.where,
        open_source=lambda where: ModelSource(config, where),
        build_probe=build_probe,
        meta=lambda source: {**options.identity(), "sink_from": sink_start(length)},
    )
    return load_run(execute(job, Output(path_text(out), overwrite, resume), Reporter(progress, notify,
                                                                                   checkpoint_seconds)))


def _indices(chosen: str | int | Iterable[int] | None, what: str) -> tuple[int, ...] | None:
    """'0,3,5-7', one index or several → sorted unique indices; None → all."""
    if chosen is None or isinstance(chosen, str):
        return parse_layers(chosen, what)
    return tuple(sorted(set(several(chosen, f"--{what}s"))))


def check_evaluable(source: ModelSource, fit_samples: int, config: RunConfig) -> None:
    """Refuse calibration sequences that leave none to evaluate: the corpus is read (tokenized, no model pass) up
    to `fit_samples` + 1 sequences, before any calibration or evaluation work."""
    from . import data

    tokenizer = source.loaded.tokenizer
    yielded = sum(1 for _ in islice(data.sequences(tokenizer, source.corpus, config.length, config.mode),
                                    fit_samples + 1))
    if yielded > fit_samples:
        return
    gives = f"{yielded} sequence{'s' if yielded != 1 else ''}"
    asked = option(f"--fit-samples {fit_samples}", f"fit_samples={fit_samples}")
    where = option(f"--length {config.length} --mode {config.mode}", f"length={config.length}, mode='{config.mode}'")
    raise SpectraError(
        f"{asked} leaves no sequence to evaluate: the corpus gives {'only ' if yielded < fit_samples else ''}{gives} "
        f"at {where}; pass fewer calibration sequences ({option('--fit-samples', 'fit_samples')} < {yielded}), more "
        f"text or a smaller {option('--length')}")


def approx(
    model: PathLike,
    data_source: PathLike = "imdb",
    *,
    budgets: int | Iterable[int] | None = None,
    methods: str | Iterable[str] = DEFAULT_METHODS,
    end_to_end: bool = False,
    layers: str | int | Iterable[int] | None = None,
    target: float = 0.1,
    projection: str = "gaussian",
    fixed_projection: bool = False,
    fit_samples: int = 0,
    fit_steps: int = 200,
    fit_lr: float = 0.1,
    fit_init: str = "pooling",
    k_plan: PathLike | dict | None = None,
    length: int = 512,
    samples: int = 1000,
    mode: str = "pack",
    batch_size: int = 8,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    gguf_file: PathLike | None = None,
    out: PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> ApproxRun:
    """How well each method approximates `model`'s attention at each budget k: per head on the exact
    model's own q, k, v, and with `end_to_end` substituted into the forward pass (hidden-state drift and, with a
    language-model head, masked-LM or next-token perplexity). Random methods draw per sequence unless
    `fixed_projection`. Methods that calibrate (linformer-pca, linformer-fit, fastformer-fit) are fitted on the
    first `fit_samples` sequences; `samples` more are evaluated after them. `k_plan` (a `spectra plan-k` JSON file
    or dict) gives each layer its own k, measured beside a uniform k of equal total cost. `budgets` (default 128), `methods` and
    `layers` take one value or several; paths may be str or `pathlib.Path`.
    """
    from . import methods as registry
    from .probes import Probes
    from .probes.approx import HeadProbe
    from .probes.endtoend import EndToEnd
    from .probes.fitting import Fitting
    from .report.plan import read_plan
    from .sources import ModelSource

    labels = registry.expand(several(methods, "--methods"))
    registry.check_calibration(labels, fit_samples)
    chosen = _indices(layers, "layer")
    plan = read_plan(k_plan if isinstance(k_plan, dict) else path_text(k_plan), length) if k_plan is not None else None
    for layer_budget in plan or ():
        check_budget(layer_budget, length)
    budgets = (round(sum(plan) / len(plan)),) if plan else budgets_or_default(budgets, APPROX_BUDGETS, length)
    config = RunConfig(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device, dtype,
                       trust_remote_code, gguf_file)
    options = ApproxOptions(budgets, tuple(labels), end_to_end, chosen, target, projection, fixed_projection,
                            fit_samples, fit_steps, fit_lr, fit_init, k_plan=plan).resolved(length)
    found = checkpoints.inspect(config.model, config.gguf_file)

    def build_probe(source: ModelSource) -> Probes:
        if chosen is not None and (chosen[0] < 0 or chosen[-1] >= source.layers):
            raise SpectraError(f"{option('--layers')} must lie in 0…{source.layers - 1} for {source.loaded.name}, "
                               f"got {list(chosen)}")
        if plan and len(plan) != source.layers:
            raise SpectraError(f"the k plan has {len(plan)} layers but {source.loaded.name} has {source.layers}; "
                               "make the plan with spectra plan-k on a run of this model")
        probes, fitted = {}, None
        if options.fits:
            if distributed.requested():
                raise SpectraError(f"fitted projections ({option('--fit-samples', 'fit_samples')}) are not supported "
                                   "across processes yet; run with a single process")
            check_evaluable(source, options.fit_samples, config)
            probes["fitting"] = Fitting(options, source.layers, source.heads, length, seed=seed,
                                        causal=source.loaded.causal, notify=notify)
            fitted = probes["fitting"].fitted
        fit_samples = options.fit_samples
        probes["heads"] = HeadProbe(options, source.layers, source.heads, seed=seed, fit_samples=fit_samples,
                                    fitted=fitted)
        if plan:
            probes["plan"] = HeadProbe(options, source.layers, source.heads, seed=seed, fit_samples=fit_samples,
                                       fitted=fitted,
                                       budget_of=plan.__getitem__, file="heads_plan.csv")
        if end_to_end:
            loaded = source.loaded
            leaking = [label for label in options.methods if loaded.causal and not registry.REGISTRY[label].causal]
            if leaking:
                usable = ", ".join(label for label, entry in registry.REGISTRY.items() if entry.causal)
                raise SpectraError(
                    f"{leaking[0]} lets each query see future tokens, so it is not a causal approximation of "
                    f"{loaded.name} (a decoder): end to end on a decoder takes causal methods ({usable}); measure "
                    f"{', '.join(leaking)} per head without {option('--end-to-end', 'end_to_end=True')}")
            if loaded.head is None:
                notify(f"{loaded.name} has no language-model head: end to end measures the hidden-state drift only")
            common = dict(seed=seed, projection=options.projection, fixed=options.fixed_projection, fitted=fitted)
            substitutes = {(label, budget): registry.substitute(label, budget, chosen, **common)
                           for label in options.methods for budget in options.budgets}
            if plan:
                substitutes = {(*key, "uniform"): substitute for key, substitute in substitutes.items()}
                substitutes.update({(label, budgets[0], "plan"): registry.substitute(label, plan.__getitem__, chosen,
                                                                                     **common)
                                    for label in options.methods})
            probes["end_to_end"] = EndToEnd(source, substitutes, seed, layers_label(chosen), fit_samples=fit_samples)
        return Probes(**probes)

    job = Job(
        "approx", config.settings(options.identity()), options.fit_samples + samples, batch_size, config.device,
        config.default_out("approx", found.label), found.where,
        open_source=lambda where: ModelSource(config, where, lm_head=end_to_end, boundary=options.fit_samples),
        build_probe=build_probe,
        meta=lambda source: {**options.identity(), "masked_lm": source.loaded.masked_lm,
                             **({"lm_head": source.loaded.head} if source.loaded.head else {}),
                             **({"evaluation": [options.fit_samples, options.fit_samples + samples]}
                                if options.fits else {})},
    )
    return load_run(execute(job, Output(path_text(out), overwrite, resume), Reporter(progress, notify,
                                                                                   checkpoint_seconds)))


def theorems(
    model: PathLike | None,
    data_source: PathLike = "imdb",
    *,
    budgets: int | Iterable[int] | None = None,
    eps: float | Iterable[float] = (0.1, 0.2, 0.3, 0.5),
    synthetic: bool = False,
    draws: int = 1,
    fixed_projection: bool = False,
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
    gguf_file: PathLike | None = None,
    out: PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = 60.0,
    notify: Callable[[str], None] = print,
) -> TheoremRun:
    """Theorems 1 and 2 checked on a model's captured attention, or on Gaussian q, k, v (`synthetic`):
    empirical Pr(error ≤ ε) against the bounds, and the errors of JL, truncated SVD and eq. 7. Each sequence
    gets `draws` fresh random projections (seeded by its index), so every Pr comes with a 95% interval over
    sequences and the spread across draws; `fixed_projection` uses one R per layer and k instead (as before).
    `budgets` (default 16, 32, 64, 128, 256) and `eps` take one value or several; paths may be str or
    `pathlib.Path`."""
    from .probes import Probes
    from .probes.theorems import Theorem1Probe, Theorem2Probe
    from .sources import ModelSource, SyntheticSource

    options = TheoremOptions(budgets_or_default(budgets, THEOREM_BUDGETS, length), several(eps, "--eps", float), draws,
                             fixed_projection).resolved(length)
    meta = {**options.identity(), "synthetic": synthetic}

    def build_probe(source) -> Probes:
        shape = (source.layers, source.heads, length, options.budgets, options.eps)
        draw = dict(seed=seed, draws=options.draws, fixed=options.fixed_projection)
        return Probes(theorem1=Theorem1Probe(*shape, **draw), theorem2=Theorem2Probe(*shape, **draw))

    if synthetic:
        synthetic_config = SyntheticConfig(length, d, heads, samples, batch_size, seed, device)
        job = Job("theorems", synthetic_config.settings(), samples, batch_size, synthetic_config.device,
                  synthetic_config.default_out("theorems"), "synthetic",
                  open_source=lambda where: SyntheticSource(synthetic_config, where),
                  build_probe=build_probe, meta=lambda source: meta)
    else:
        if model is None:
            raise SpectraError(f"give a model, or pass {option('--synthetic', 'synthetic=True')} for Gaussian q, k, v")
        config = RunConfig(model, data_source, length, samples, mode, batch_size, seed, split, text_column, device,
                           dtype, trust_remote_code, gguf_file)
        found = checkpoints.inspect(config.model, config.gguf_file)
        job = Job("theorems", config.settings(options.identity()), samples, batch_size, config.device,
                  config.default_out("theorems", found.label), found.where, open_source=lambda where: ModelSource(config, where),
                  build_probe=build_probe, meta=lambda source: meta)
    return load_run(execute(job, Output(path_text(out), overwrite, resume), Reporter(progress, notify,
                                                                                   checkpoint_seconds)))
