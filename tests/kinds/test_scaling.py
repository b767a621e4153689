"""`spectra scaling`: its tables equal separate analyze (and approx) runs at each n, the model loads once,
finished lengths are reused with --resume, and bad input fails before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from tiny import run_cli

import spectra
from spectra import models
from spectra.errors import SpectraError
from spectra.growth import growth
from spectra.kinds.scaling import default_budgets, parse_lengths

QUIET = dict(progress=None, notify=lambda line: None)
ARGS = dict(samples=4, batch_size=2, **QUIET)


@pytest.fixture(scope="module")
def scaled(roberta_dir, text_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    run = spectra.scaling(str(roberta_dir), str(text_file), lengths="16,40,64", bootstrap=20, out=root / "run",
                          approx_target=0.3, methods=["svd", "pool-mean"], **ARGS)
    return run, root


def test_tables_equal_separate_analyze_runs(scaled, roberta_dir, text_file) -> None:
    run, root = scaled
    assert run.lengths == [16, 40, 64] and run.meta["kind"] == "scaling"
    for n in run.lengths:
        alone = spectra.analyze(str(roberta_dir), str(text_file), length=n, bootstrap=20, out=root / f"alone{n}",
                                **ARGS)
        rows = run.table[run.table["n"] == n].reset_index(drop=True)
        metrics = alone.metrics
        for column, source in (("rank90", "rank90_mean"), ("rank99", "rank99_mean"), ("erank", "erank_mean"),
                               ("c_quarter", "c_at_mean")):
            assert np.abs(rows[column].to_numpy() - metrics[source].to_numpy()).max() <= 1e-12, (n, column)
        assert (rows["quarter"] == n // 4).all() and np.allclose(rows["rank90_share"], metrics["rank90_mean"] / n)
        fixed = run.c_fixed[run.c_fixed["n"] == n]
        assert sorted(fixed["budget"].unique()) == [b for b in (32, 64, 128) if b < n]
        for row in fixed.itertuples():
            assert abs(row.c - alone.cum_mean[row.layer, row.head, row.budget - 1]) <= 1e-12


def test_exponents_are_the_fits_of_the_table_with_bootstrap_intervals(scaled) -> None:
    run, _ = scaled
    table, exponents = run.table, run.exponents
    runs = run.runs()
    for metric in ("rank90", "rank99"):
        fits = exponents[(exponents["metric"] == metric) & (exponents["method"] == "")]
        assert list(fits["scope"].unique()) == ["pooled", "layer", "head"] and len(fits) == 1 + 2 + 8
        pooled = fits[fits["scope"] == "pooled"].iloc[0]
        means = table.groupby("n")[metric].mean().to_numpy()
        boots = np.stack([np.load(runs[n].path / "bootstrap.npz")["replicates"][..., ("rank90", "rank99").index(metric)]
                          .mean(axis=(1, 2)) for n in run.lengths], axis=1)
        want = growth(run.lengths, means, boots, sequences=4)
        assert pooled["alpha"] == pytest.approx(want.alpha, abs=1e-12)
        assert (pooled["alpha_low"], pooled["alpha_high"]) == (pytest.approx(want.alpha_low), pytest.approx(want.alpha_high))
        head = fits[(fits["scope"] == "head") & (fits["layer"] == 1) & (fits["head"] == 2)].iloc[0]
        values = table[(table["layer"] == 1) & (table["head"] == 2)][metric].to_numpy()
        assert head["alpha"] == pytest.approx(growth(run.lengths, values).alpha, abs=1e-12)


def test_k_needed_equals_separate_approx_runs(scaled, roberta_dir, text_file) -> None:
    run, root = scaled
    needed = run.k_needed
    for n in run.lengths:
        alone = spectra.approx(str(roberta_dir), str(text_file), length=n, budget=default_budgets(n),
                               methods=["svd", "pool-mean"], target=0.3, out=root / f"approx{n}", **ARGS)
        want = alone.k_needed().sort_values(["method", "layer"]).reset_index(drop=True)
        got = needed[(needed["n"] == n) & needed["layer"].notna()].sort_values(["method", "layer"]).reset_index(drop=True)
        assert np.array_equal(got["k_needed"].to_numpy(dtype=float), want["k_needed"].to_numpy(dtype=float),
                              equal_nan=True)
        layer_means = alone.per_layer("out_err").groupby(["method", "budget"])["out_err"].mean()
        for method in ("svd", "pool-mean"):
            reached = [b for b in default_budgets(n) if layer_means[(method, b)] <= 0.3]
            pooled = needed[(needed["n"] == n) & needed["layer"].isna() & (needed["method"] == method)]["k_needed"]
            assert (pooled.iloc[0] if reached else np.nan) == pytest.approx(min(reached) if reached else np.nan,
                                                                             nan_ok=True)
    assert set(run.exponents[run.exponents["metric"] == "k_needed"]["method"]) == {"svd", "pool-mean"}


def test_the_model_loads_once_and_finished_lengths_are_reused(roberta_dir, text_file, tmp_path, monkeypatch) -> None:
    calls = []
    load = models._load
    monkeypatch.setattr(models, "_load", lambda *a, **k: calls.append(1) or load(*a, **k))
    lines = []
    first = spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32], bootstrap=0, out=tmp_path / "s",
                            samples=4, batch_size=2, progress=None, notify=lines.append)
    assert len(calls) == 1, "one load for every length"
    stamp = (tmp_path / "s" / "n16" / "metrics.csv").stat().st_mtime_ns
    more = spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32, 48], bootstrap=0, out=tmp_path / "s",
                           samples=4, batch_size=2, resume=True, progress=None, notify=lines.append)
    assert (tmp_path / "s" / "n16" / "metrics.csv").stat().st_mtime_ns == stamp
    assert any("n16 is already complete" in line for line in lines)
    pd.testing.assert_frame_equal(more.table[more.table["n"] < 48].reset_index(drop=True), first.table)
    assert math_isnan_all(more.exponents["alpha_low"]), "no bootstrap, no interval"
    calls.clear()
    again = spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32, 48], bootstrap=0, out=tmp_path / "s",
                            samples=4, batch_size=2, resume=True, progress=None, notify=lines.append)
    assert not calls, "a finished sweep is read back without loading the model"
    pd.testing.assert_frame_equal(again.table, more.table)
    with pytest.raises(SpectraError, match="already exists; pass overwrite=True"):
        spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32], out=tmp_path / "s", **ARGS)


def math_isnan_all(values: pd.Series) -> bool:
    return bool(np.isnan(values.to_numpy(dtype=float)).all())


def test_bad_lengths_fail_before_anything_is_written(roberta_dir, text_file, tmp_path) -> None:
    for lengths, message in (("64", "at least two different lengths"), ("4,16", "at least 8 tokens"),
                             ("16,x", "not a list of sequence lengths")):
        with pytest.raises(SpectraError, match=message):
            parse_lengths(lengths)
    with pytest.raises(SpectraError, match="128 exceeds what tiny-roberta can embed"):
        spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 128], out=tmp_path / "long", **ARGS)
    assert not (tmp_path / "long").exists()
    with pytest.raises(SpectraError, match="approx_target must be a relative error"):
        spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32], approx_target=1.5, out=tmp_path / "t",
                        **ARGS)


def test_the_command_prints_the_exponents_and_draws(scaled, monkeypatch, capsys, tmp_path) -> None:
    run, _ = scaled
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["plot", str(run.path)], monkeypatch, capsys)
    assert code == 0 and "rank_vs_n.png" in out and "c_fixed_vs_n.png" in out
    code, out, err = run_cli(["scaling", "model", "--lengths", "64"], monkeypatch, capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "at least two different lengths" in err
    meta = json.loads((run.path / "run.json").read_text())
    assert meta["runs"] == {"16": "n16", "40": "n40", "64": "n64"} and meta["settings"]["lengths"] == [16, 40, 64]


def test_an_interrupted_sweep_says_to_run_the_scaling_command_again(roberta_dir, text_file, tmp_path, monkeypatch,
                                                                    capsys) -> None:
    """Ctrl-C inside the second length: the hint names the scaling command with --resume (not the analyze run
    inside it), and that command continues the sweep where it stopped."""
    import os
    import signal

    from spectra.sources import ModelSource

    monkeypatch.chdir(tmp_path)
    real, calls = ModelSource.run, []

    def run(self, batch, observe):
        calls.append(1)
        real(self, batch, observe)
        if len(calls) == 3:  # the first batch at n = 24
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ModelSource, "run", run)
    args = ["scaling", str(roberta_dir), "--data", str(text_file), "--lengths", "16,24", "--samples", "4",
            "--batch-size", "2", "--bootstrap", "0", "--out", "sweep"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 130 and "Traceback" not in err, err
    assert lines[-1] == ("interrupted after 2 sequences (n = 24, length 2 of 2); the lengths done are kept: continue "
                         "with the same spectra scaling command and --resume")
    code, out, err = run_cli([*args, "--resume"], monkeypatch, capsys)
    assert code == 0 and "resuming sweep/n24.partial after 2 sequences" in err and "nothing to resume" not in err
    assert spectra.load_run(tmp_path / "sweep").lengths == [16, 24]


def test_resume_with_nothing_to_resume_says_so_once(roberta_dir, text_file, tmp_path) -> None:
    lines: list[str] = []
    spectra.scaling(roberta_dir, text_file, lengths=[16, 24], bootstrap=0, out=tmp_path / "new", resume=True,
                    samples=2, batch_size=2, progress=None, notify=lines.append)
    assert [line for line in lines if "resume" in line] == [f"nothing to resume in {tmp_path / 'new'}; starting a new "
                                                            "run"]
