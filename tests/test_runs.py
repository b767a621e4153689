"""Reading runs back: anything that is not a finished spectra run, or is damaged, is one line naming it."""

from __future__ import annotations

import pytest

from spectra.errors import SpectraError
from spectra.kinds import load_run


def test_loading_something_else_is_one_line(tmp_path) -> None:
    with pytest.raises(SpectraError, match="is not a spectra run directory: it has no run.json"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text('{"kind": "analyze"}')
    with pytest.raises(SpectraError, match="curves.npz is missing: the run directory is incomplete"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(SpectraError, match="run.json is not readable"):
        load_run(tmp_path)


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated", b"\x93NUMPY random bytes"])
def test_a_damaged_npz_is_one_line(tmp_path, damage) -> None:
    (tmp_path / "run.json").write_text('{"kind": "analyze", "at": 1}')
    (tmp_path / "metrics.csv").write_text("layer,head\n0,0\n")
    (tmp_path / "curves.npz").write_bytes(damage)
    with pytest.raises(SpectraError, match="curves.npz is damaged or not written by spectra"):
        load_run(tmp_path)


def test_a_run_shows_itself_in_one_short_line_and_lists_what_it_holds(roberta_dir, text_file, tmp_path) -> None:
    """repr: kind, model, data, n (or lengths), what was measured, each table's rows×columns and array's shape,
    where it lives — one line instead of screens of DataFrame; dir(): the run's own fields, properties and methods."""
    import spectra

    quiet = dict(samples=2, progress=None, notify=lambda line: None)
    analyzed = spectra.analyze(roberta_dir, text_file, length=16, out=tmp_path / "a", **quiet)
    rows, columns = analyzed.metrics.shape
    assert repr(analyzed) == (f"Run(kind='analyze', model='tiny-roberta', data='corpus', n=16, samples=2, "
                              f"metrics={rows}×{columns}, cum_mean/cum_std/sigma_mean/sigma_std=2×4×16, "
                              f"path='{tmp_path / 'a'}')")
    assert dir(analyzed) == ["at", "causal", "cum_mean", "cum_std", "curves", "heads", "label", "layers", "meta",
                             "metrics", "n", "path", "qkv", "sigma_mean", "sigma_std"]
    approx = spectra.approx(roberta_dir, text_file, budget=4, methods="svd", length=16, out=tmp_path / "b", **quiet)
    assert repr(approx) == (f"ApproxRun(kind='approx', model='tiny-roberta', data='corpus', n=16, samples=2, "
                            f"methods=['svd'], budget=[4], head_stats={'×'.join(map(str, approx.head_stats.shape))}, "
                            f"path='{tmp_path / 'b'}')")
    assert {"head_stats", "end_to_end", "per_layer", "k_needed", "projections"} <= set(dir(approx))
    assert not any(name.startswith("_") for name in dir(approx))
    theorems = spectra.theorems(None, synthetic=True, budget=4, eps=0.5, length=16, d=4, out=tmp_path / "c", **quiet)
    shown = repr(theorems)
    assert shown.startswith("TheoremRun(kind='theorems', model='gaussian(d=4)', data='synthetic', n=16, samples=2, "
                            "budget=[4], eps=[0.5], theorem1=") and len(shown) < 400 and "\n" not in shown
    assert "tables" in dir(theorems)
    sweep = spectra.scaling(roberta_dir, text_file, lengths=[16, 24], bootstrap=0, out=tmp_path / "d", **quiet)
    shown = repr(sweep)
    assert shown.startswith("ScalingRun(kind='scaling', model='tiny-roberta', data='corpus', lengths=[16, 24], "
                            "samples=2, table=") and "exponents=" in shown and len(shown) < 300
    assert "runs" in dir(sweep) and "lengths" in dir(sweep)
