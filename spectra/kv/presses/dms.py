"""`dms(<scorer>,<threshold>)`: kvpress 0.5.5's DMSPress (after Dynamic Memory Sparsification, Łańcucki et al. 2025,
arXiv:2506.05345): a scorer's scores against a threshold instead of a ratio, so each key/value head keeps as many
tokens as score at least the threshold.

kvpress's `DMSPress(press, threshold, sliding_window_size=128, decoding=False)` wraps a ScorerPress. After the prefill
of L context tokens it scores every one of them (H_kv, L) and, where L exceeds the window W = 128, masks the pairs
(key/value head h, position j) with j < L − W whose score is strictly below the threshold — per head, as AdaKV masks,
so each head keeps its own count and the last W tokens stay in every head. kvpress keeps the masked pairs in its cache
behind a fake key whose attention weight underflows to zero; here they are dropped (`presses.per_head`), the same
attention up to float rounding. Its `decoding=True` (evicting the answer's own tokens as they leave the window) is not
reproduced: kvpress's leaderboard runs it on the prefill only (the default), as here.

The threshold is the press's: what it keeps depends on the context, not on a ratio, so a cell's ratio does not change
it (`ratio_means`) and what it compressed is measured — each cell's stored bytes (`bytes_share`) and each head's kept
share. kvpress's leaderboard runs `DMSPress(KVzapPress(model_type=…))` at thresholds −3 to −6 on Qwen3-8B and −6 to −9
on Llama-3.1-8B (`kv.configurations`: `kvpress:kvzap_linear`, `kvpress:kvzap_mlp`); here `dms(kvzap(DIR),-6)`.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, ScorerPress, Wrapper, per_head, register
from .fields import configured, settings

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 77

#: kvpress's sliding_window_size: the last context tokens no threshold evicts
SLIDING_WINDOW = 128


def above_threshold(scores: torch.Tensor, threshold: float, window: int = SLIDING_WINDOW) -> torch.Tensor:
    """(H_kv, L) bool: the pairs DMSPress keeps — every one of the last `window` positions, and before them those
    whose score is not below `threshold` (kvpress masks `scores < threshold` among the first L − window)."""
    length = scores.shape[-1]
    protected = torch.arange(length, device=scores.device) >= length - window
    return protected | ~(scores < threshold)


@register
class DMS(Wrapper):
    """`dms(<scorer>,<threshold>)`: the scorer's pairs scoring at least the threshold, the last 128 tokens kept in
    every head (see the module docstring)."""

    name, summary = "dms", "a scorer's pairs scoring at least a threshold, the last 128 tokens kept (DMS)"
    guide = ("kvpress's `DMSPress` (Dynamic Memory Sparsification's threshold rule, `sliding_window_size` 128, on the "
             "prefill) over any scorer ({scorers}) or `kvzap(DIR)`: the pairs of every key/value head whose score lies "
             "below the threshold are evicted, except the last 128 context tokens, so each head keeps what the "
             "context makes it keep. The threshold is written after the scorer, `dms(kvzap(DIR),-6)` — kvpress's "
             "leaderboard runs KVzap's surrogates at −3 to −6 on Qwen3-8B and −6 to −9 on Llama-3.1-8B "
             "(`kvpress:kvzap_linear(DIR,-6)`, `kvpress:kvzap_mlp(DIR,-6)`); a scorer's scale decides which "
             "thresholds mean anything. The run's ratios do not change it: each cell records the bytes it stored and "
             "each head's kept share, and a leaderboard ranks it at a ratio only where those bytes reached it.")
    wraps, number, peer = "scorer", "threshold", "DMSPress"
    ratio_means = "ignored: the threshold in its name sets what each head keeps (its cells' bytes are measured)"
    fields = {"sliding_window_size": 128}
    sliding_window_size = SLIDING_WINDOW

    def __init__(self, inner: ScorerPress | None = None, threshold: float | None = None) -> None:
        super().__init__(inner)
        self.threshold = threshold
        if inner is not None and threshold is not None:
            self.name = f"dms({inner.name},{threshold:g})"  # type: ignore[misc]

    def bind(self, inner: Press, threshold: float) -> DMS:  # type: ignore[override]
        """This press around the scorer `inner` at `threshold` (the registry checked both)."""
        return type(self)(super().bind(inner).inner, float(threshold))

    def fresh(self) -> Press:
        return configured(type(self)(None if self.inner is None else self.inner.fresh(), self.threshold),
                          **settings(self))

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        if self.threshold is None:
            raise ValueError("dms needs a scorer and a threshold: name it as dms(<scorer>,<threshold>)")
        keep = above_threshold(self.scores(prefill, ratio), self.threshold, self.sliding_window_size)
        return per_head(prefill, keep)
