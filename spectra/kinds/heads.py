"""`spectra heads`: which head is what — a per-head diagnosis of sink, previous-token, local, induction and
retrieval behaviour, the spectra of each head's weights beside the spectrum of its attention, a method map joined
with an approx run, and DuoAttention's head pattern.

Probe: `HeadsProbe` (wrapping `SpectrumProbe` for rank90, c at `at`, the sink mass and the entropy of the same P).
Tables: diagnosis.csv (one row per layer and head; every score defined in `spectra.anatomy.diagnosis`, the weight ranks in
`spectra.anatomy.weights`, the head types in `spectra.anatomy.methodmap`), kv_heads.csv and full_attention_heads.tsv, with
`approx` method_map.csv and rules.csv; metrics.csv; arrays curves.npz, weights.npz. Loads as `runs.HeadsRun`.

Encoders: the induction score is NaN (its protocol asks whether a decoder copies what followed a token's earlier
occurrence; a bidirectional head can read the copied token itself, so the stripe measures nothing of the kind) and
run.json says why; every other score is measured, the local window and the streaming keys of the retrieval score
taken on both sides of the query.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..inputs import path_text
from ..options import identity, option
from ..reporter import Reporter
from .base import Analysis, load_run, register

#: DuoAttention's recent window, the streaming heads' default
DEFAULT_RECENT = 64
ENCODER_INDUCTION = ("not measured: an encoder's heads see the whole sequence, so a head can read the repeated token "
                     "itself in the other copy; TransformerLens's stripe asks a decoder whether it copies what "
                     "followed a token's earlier occurrence")


@dataclass(frozen=True)
class HeadsOptions:
    """What `spectra heads` measures: the thresholds and windows of its scores, the approx run it maps methods
    from, and the share of key/value heads DuoAttention's pattern keeps at full attention."""

    eps: float = option(0.3, "Sink threshold ε: a query counts toward the sink score when its attention on the first "
                        "token exceeds ε (Gu et al.).")
    window: int = option(64, "Local mass: attention within this many positions of the query (|i − j| < window).")
    sinks: int = option(4, "Retrieval score: the first tokens a streaming head keeps (DuoAttention's sink).")
    recent: int | None = option(None, "Retrieval score: the nearest tokens a streaming head keeps (DuoAttention's "
                                "recent window; default 64). With --sinks it must leave the head a key to drop: at "
                                "most --length − 1 − --sinks.")
    at: int | None = option(None, "1-based singular-value index of c@index (default n/4).")
    approx: str | None = option(None, "An approx run of the same model (its directory): per head and budget the "
                                "winning method, and a depth-2 rule predicting it from the diagnosis.", metavar="RUN")
    duo_share: float = option(0.5, "Share of key/value heads full_attention_heads.tsv keeps at full attention (the "
                              "highest retrieval scores); the rest stream.")

    def __post_init__(self) -> None:
        if not 0 < self.eps < 1:
            raise SpectraError(f"{spell('--eps')} must be an attention share in (0, 1), got {self.eps}")
        for name in ("window", "recent"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SpectraError(f"{spell('--' + name)} must be a number of tokens ≥ 1, got {getattr(self, name)}")
        if self.sinks < 0:
            raise SpectraError(f"{spell('--sinks')} must be a number of tokens ≥ 0, got {self.sinks}")
        if not 0 <= self.duo_share <= 1:
            raise SpectraError(f"{spell('--duo-share')} must be a share of heads in [0, 1], got {self.duo_share}")
        approx = path_text(self.approx)
        if approx is not None:
            approx = str(Path(approx).absolute())
        object.__setattr__(self, "approx", approx)

    def resolved(self, n: int) -> HeadsOptions:
        """With `at` checked against n, or set to n/4; `recent` checked against n, or set to its default.

        A streaming head keeps the first `sinks` keys and the `recent` nearest: with sinks + recent ≥ n it keeps
        every key a decoder's query sees, so the retrieval score (its output change) is 0 for every head and the
        head pattern ranks nothing. A `recent` given so long is refused, naming the longest that drops a key
        (n − 1 − sinks); the default is kept as it was (runs at short lengths keep their tables), and said
        (`Heads.warn_recent`)."""
        if self.at is not None and not 1 <= self.at <= n:
            raise SpectraError(f"{spell('--at')} must be an index in 1…{n} (the sequence length), got {self.at}")
        if self.recent is not None and self.sinks + self.recent >= n:
            longest = n - 1 - self.sinks
            fix = (f"give {spell(f'--recent {longest}', f'recent={longest}')} or less" if longest >= 1 else
                   f"give fewer {spell('--sinks')} than {n - 1}")
            raise SpectraError(f"{spell(f'--recent {self.recent}', f'recent={self.recent}')} with "
                               f"{spell(f'--sinks {self.sinks}', f'sinks={self.sinks}')} leaves a streaming head "
                               f"nothing to drop at {spell(f'--length {n}', f'length={n}')} (an encoder's next to "
                               f"nothing), so the retrieval score would measure nothing; {fix}")
        return replace(self, at=self.at or max(1, n // 4), recent=DEFAULT_RECENT if self.recent is None else self.recent)


class Heads(Analysis):
    """Which head is what: sink, previous-token, local, induction and retrieval scores, weight spectra beside
    attention spectra, and the method that wins on each head."""

    name = "heads"
    run_type = "HeadsRun"
    summary = ("Which head is what: sink, previous-token, local, induction and retrieval scores per head, weight "
               "spectra beside attention spectra, a method map and DuoAttention's head pattern.")
    options = HeadsOptions
    detail = ("Print every head's diagnosis (by default: per layer its heads' types, and the heads scoring highest "
              "on each score; diagnosis.csv holds every score of every head).")
    defaults = {"samples": 64}
    work = 14
    outputs = {"diagnosis.csv": ("layer", "head", "kv_head", "sequences"), "metrics.csv": ("layer", "head")}

    def check(self, config: RunConfig, options: HeadsOptions, shape: checkpoints.Shape) -> None:
        super().check(config, options, shape)
        if options.approx is None:
            return
        approx = load_run(options.approx, "approx")
        model = approx.meta.get("model", {})
        for what, theirs, ours in (("layers", model.get("layers"), shape.layers), ("heads", model.get("heads"),
                                                                                   shape.heads)):
            if ours is not None and theirs != ours:
                raise SpectraError(f"{spell('--approx')} {options.approx} is a run of {model.get('name')} with "
                                   f"{theirs} {what}, but {shape.name} has {ours}: give an approx run of this model")

    @staticmethod
    def warn_recent(config: RunConfig, options: HeadsOptions, reporter: Reporter) -> None:
        """Say when the default recent window keeps every key at this length (a given one is refused instead); once
        the run goes ahead (from `probe`), so a refused run still says one line."""
        n = config.length
        if options.sinks + options.recent >= n:
            longest = n - 1 - options.sinks
            reporter.warn(f"at a length of {n} a streaming head keeping the first {options.sinks} and the "
                          f"{options.recent} nearest keys (the default --recent) keeps every key: every retrieval "
                          "score is 0 and full_attention_heads.tsv ranks nothing"
                          + (f"; pass --recent {longest} or less" if longest >= 1 else ""))

    def derived(self, options: HeadsOptions) -> tuple[str, ...]:
        return ("at",) if options.at is None else ()  # n/4 unless given

    def resolve(self, config: RunConfig, options: HeadsOptions) -> HeadsOptions:
        return options.resolved(config.length)

    def meta(self, config: RunConfig, options: HeadsOptions, source) -> dict[str, Any]:
        from ..spectrum import sink_start

        return {**identity(options), "sink_from": sink_start(config.length), **self.induction_note(source.loaded)}

    def probe(self, config: RunConfig, options: HeadsOptions, reporter: Reporter, source):
        """The heads probe, once the model has loaded: its weights read, its induction pass run."""
        from ..probes.heads import HeadsProbe, induction_scores
        from ..probes.spectrum import SpectrumProbe
        from ..anatomy.weights import attention_weights, head_spectra

        self.warn_recent(config, options, reporter)
        loaded = source.loaded
        weights = attention_weights(loaded.model)
        if len(weights) != loaded.layers:
            reporter.warn(f"found the query/key/value and output linears of {len(weights)} of {loaded.layers} "
                          f"layers of {loaded.name}: no weight spectra and no retrieval score")
            weights = None
        spectra = head_spectra(weights, loaded.heads, source.kv_heads) if weights else {}
        induction = induction_scores(source, config.seed) if self.induction_fits(loaded) else None
        approx = None
        if options.approx:
            approx_run = load_run(options.approx, "approx")
            approx = approx_run.head_stats
            if approx_run.meta.get("n") != config.length:
                reporter.notify(f"the approx run measured n = {approx_run.meta.get('n')}, this run n = "
                                f"{config.length}: the method map joins heads measured at two lengths")
        spectrum = SpectrumProbe(loaded.layers, loaded.heads, config.length, options.at, seed=config.seed)
        return HeadsProbe(spectrum, kv_heads=source.kv_heads, eps=options.eps, window=options.window,
                          sinks=options.sinks, recent=options.recent, weights=weights, spectra=spectra,
                          induction=induction, approx=approx, duo_share=options.duo_share, seed=config.seed)

    @staticmethod
    def induction_fits(loaded) -> bool:
        """Whether the induction pass runs: a decoder that can embed the repeated sequences."""
        from ..anatomy.diagnosis import INDUCTION_TOKENS

        return loaded.causal and loaded.max_length >= 1 + 2 * INDUCTION_TOKENS

    def induction_note(self, loaded) -> dict[str, str]:
        """run.json's word on a missing induction score."""
        if not loaded.causal:
            return {"induction": ENCODER_INDUCTION}
        if not self.induction_fits(loaded):
            return {"induction": f"not measured: {loaded.name} embeds {loaded.max_length} tokens, fewer than the "
                                 "101 of the repeated sequences"}
        return {}


register(Heads())
