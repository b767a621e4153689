"""The window the windowed presses protect: where SnapKV and Loki, which always keep the last WINDOW context tokens
(the queries they score with), keep nothing but that window, and what a run says about it.

At a ratio whose kept count is no more than the window, such a press's scores choose nothing: it keeps window tokens
only. `spectra cache` warns before such a run (`window_note`, `window_choosing_length`) and its printout says it
again; the task study refuses a context no longer than the window (`windowed_presses`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...registry import PRESSES
from .base import WINDOW, n_kept


def window_filled(length: int, ratios: Sequence[float]) -> list[tuple[float, int]]:
    """(ratio, tokens kept) for each ratio at which a windowed press (snapkv, loki) keeps no more than the WINDOW
    last context tokens it always protects: there it keeps tokens of the window only, whatever its scores — the
    whole window when exactly WINDOW are kept (snapkv and loki then keep the same cache), else the ones
    torch.topk's tie-break among the equally protected tokens picks (which depends on the other scores)."""
    return [(ratio, n_kept(length, ratio)) for ratio in ratios if n_kept(length, ratio) <= min(WINDOW, length)]


def window_note(length: int, ratios: Sequence[float], presses: Sequence[str]) -> str | None:
    """What a cache run says where the windowed presses among `presses` keep only tokens of their window
    (`window_filled`), or None: the ratios, the tokens kept, and that their scores choose nothing there."""
    windowed = windowed_presses(presses)
    filled = window_filled(length, ratios)
    if not windowed or not filled:
        return None
    one, both = len(filled) == 1, len(windowed) > 1
    ratios_text, kept = (", ".join(f"{value:g}" for value in values) for values in zip(*filled))
    return (f"{'ratio' if one else 'ratios'} {ratios_text} {'keeps' if one else 'keep'} {kept} tokens, no more than "
            f"the {WINDOW}-token window that {' and '.join(windowed)} {'always keep' if both else 'always keeps'}: "
            f"{'their' if both else 'its'} scores choose nothing there (below {WINDOW} kept, torch.topk's tie-break "
            f"picks which window tokens stay){', so loki tells nothing snapkv does not' if both else ''}")


def windowed_presses(presses: Iterable[str] | None = None) -> list[str]:
    """The presses declared `windowed` (among `presses`, or all), in listing order: those that read the prefill's last
    WINDOW queries and always keep the window's tokens (a press wrapping one, `adakv(snapkv)`, is not listed)."""
    chosen = None if presses is None else set(presses)
    return [name for name in PRESSES if PRESSES.facts(name).get("windowed") and (chosen is None or name in chosen)]


def window_choosing_length(ratios: Sequence[float]) -> int:
    """The shortest context at which a windowed press keeps more than its WINDOW at every one of `ratios`."""
    length = WINDOW + 1
    while window_filled(length, ratios):
        length += 1
    return length
