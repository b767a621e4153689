"""benchmarks/kvpress_tasks.py's torch-free helpers, which its worker and kvpress_check.py's run in kvpress's venv:
which presses it seeds torch's global generator for (the leverage sketches spectra replays), and what it builds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kvpress_tasks.py"


def _module():
    spec = importlib.util.spec_from_file_location("kvpress_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_presses_drawing_leverage_sketches_are_seeded() -> None:
    draws = _module().draws_sketches
    for press in ("leverage", "compactor", "adakv(leverage)", "criticalkv(compactor)", "composed(knorm,leverage)",
                  "AdaKVPress(CompactorPress())", "CompactorPress()"):  # the last two: kvpress:<name>'s instances
        assert draws(press), press
    for press in ("pca_leverage", "knorm", "chunk(pca_leverage)", "random", "cam(knorm)", "cur", "kvpress:snapkv",
                  "AdaKVPress(SnapKVPress())"):
        assert not draws(press), press


def test_leverage_is_built_as_kvpress_leverage_score_press() -> None:
    module = _module()
    assert module.KVPRESS_NAMES["leverage"] == "LeverageScorePress" and "pca_leverage" not in module.KVPRESS_NAMES
