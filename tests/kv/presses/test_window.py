"""Where the windowed presses keep only their window, and what a run says about it."""

from __future__ import annotations

from spectra.kv.presses.window import window_choosing_length, window_filled, window_note


def test_the_ratios_where_the_window_fills_the_budget() -> None:
    """kvpress keeps int(L(1 − r)) tokens; where that is no more than the 64-token window snapkv and loki always keep,
    their scores choose nothing. At L = 128 (issue 33) that is 0.5, 0.75 and 0.9; r = 0.9 needs L ≥ 651 to choose
    (1 − 0.9 is 0.0999…, so 650 keeps 64)."""
    assert window_filled(128, [0.25, 0.5, 0.75, 0.9]) == [(0.5, 64), (0.75, 32), (0.9, 12)]
    first = next(length for length in range(65, 10_000) if int(length * (1 - 0.9)) > 64)
    assert window_choosing_length([0.25, 0.9]) == first == 651
    assert window_note(128, [0.25], ["snapkv", "loki"]) is None
    assert window_note(128, [0.5], ["knorm"]) is None, "only the windowed presses"
    assert window_note(128, [0.5], ["snapkv"]).startswith("ratio 0.5 keeps 64 tokens, no more than the 64-token "
                                                          "window that snapkv always keeps: its scores choose nothing")
