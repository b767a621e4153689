"""`spectra cache` as a registered analysis: bad input refused in one line before the model loads, the full cache's
NLL equal to the model's own next-token loss (computed here with transformers' eager attention), the tables'
bookkeeping (tokens kept, channel ratio, memory saved), and a resumed run equal to an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import spectra
from spectra import data
from spectra.checkpoints import Shape
from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.kinds.cache import CacheOptions
from spectra.presses import n_kept

import tiny

CONTEXT, CONTINUATION = 70, 8
QUIET = dict(progress=None, notify=lambda line: None)
SETTINGS = dict(context=CONTEXT, continuation=CONTINUATION, presses="streaming,snapkv,think", ratios="0.5,0.25",
                samples=3, batch_size=2, **QUIET)


class Stop(Exception):
    """Raised from a progress callback: an interrupt after some batches."""


@pytest.fixture(scope="module")
def finished(llama_dir, text_file, tmp_path_factory):
    return spectra.cache(str(llama_dir), str(text_file), out=tmp_path_factory.mktemp("runs") / "cache", **SETTINGS)


def test_options_are_checked_in_one_line() -> None:
    assert CacheOptions(ratios="0.5,0,0.25,0.5", presses="tova").ratios == (0.25, 0.5)
    for options, message in (({"ratios": "0.5,1"}, "ratios must lie in \\[0, 1\\)"),
                             ({"ratios": -0.1}, "ratios must lie in \\[0, 1\\)"),
                             ({"ratios": 0}, "holds no ratio above 0"),
                             ({"presses": "h2o"}, "unknown press 'h2o'; valid presses: streaming"),
                             ({"context": 64}, "snapkv reads the last 64 context queries: it needs context > 64"),
                             ({"continuation": 1}, "continuation must be an integer ≥ 2")):
        with pytest.raises(SpectraError, match=message):
            CacheOptions(**options)


def test_the_model_shape_is_checked_before_it_loads() -> None:
    cache, config = REGISTRY["cache"], RunConfig("m", "d")
    with pytest.raises(SpectraError, match="tiny-bert is an encoder: a key–value cache belongs to a decoder"):
        cache.check(config, CacheOptions(), Shape(2, 4, 512, False, "tiny-bert"))
    with pytest.raises(SpectraError, match="context 1024 \\+ continuation 128 = 1152 tokens exceeds what tiny can "
                                           "embed \\(512 positions\\)"):
        cache.check(config, CacheOptions(), Shape(2, 4, 512, True, "tiny"))
    cache.check(config, CacheOptions(context=300, continuation=12), Shape(2, 4, 512, True, "tiny"))


@pytest.mark.parametrize("case", ["ratio", "press", "encoder", "no-rope", "positions"])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(case, llama_dir, gpt2_dir, bert_dir, text_file,
                                                                      tmp_path, monkeypatch, capsys) -> None:
    model, extra, message = {
        "ratio": (llama_dir, ["--ratios", "0.5,1.0"], "--ratios must lie in [0, 1)"),
        "press": (llama_dir, ["--presses", "knorm,h2o"], "unknown press 'h2o'"),
        "encoder": (bert_dir, [], "is an encoder"),
        "no-rope": (gpt2_dir, ["--presses", "knorm,think"], "think prunes rotary key channels, but tiny-gpt2 has no "
                                                            "rotary position embedding"),
        "positions": (llama_dir, ["--context", "100", "--continuation", "40"],
                      "--context 100 + --continuation 40 = 140 tokens exceeds what tiny-llama can embed"),
    }[case]
    out = tmp_path / "run"
    code, stdout, stderr = tiny.run_cli(["cache", str(model), "--data", str(text_file), "--out", str(out),
                                         "--context", "70", "--continuation", "8", *extra], monkeypatch, capsys)
    assert code == 2 and message in stderr and stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert not out.exists() and not out.with_name("run.partial").exists()


def test_the_full_cache_row_is_the_models_own_next_token_loss(finished, llama_dir, text_file) -> None:
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file))
    sequences = list(zip(range(3), data.sequences(tokenizer, corpus, CONTEXT + CONTINUATION, "pack")))
    full = finished.sequences[finished.sequences["press"] == "full"].set_index("sequence")["nll"]
    losses = []
    for index, ids in sequences:
        ids = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, CONTEXT - 1: -1]
        loss = torch.nn.functional.cross_entropy(logits.double(), ids[0, CONTEXT:], reduction="none")
        losses.append(loss)
        assert full[index] == pytest.approx(loss.mean().item(), abs=1e-5)
    row = finished.table.set_index(["press", "ratio"]).loc[("full", 0.0)]
    assert row["nll"] == pytest.approx(torch.cat(losses).mean().item(), abs=1e-5)
    assert row["ppl"] == pytest.approx(np.exp(row["nll"])) and row["kl"] == 0 and row["top1"] == 1
    assert row["tokens"] == 3 * CONTINUATION and row["sequences"] == 3


def test_the_tables_count_what_each_press_keeps(finished) -> None:
    table = finished.table.set_index(["press", "ratio"])
    assert list(finished.table.columns[:3]) == ["press", "ratio", "nll"]
    assert list(table.index) == [("full", 0.0), *((press, ratio) for press in ("streaming", "snapkv", "think")
                                                  for ratio in (0.25, 0.5))]
    for press in ("streaming", "snapkv"):
        for ratio in (0.25, 0.5):
            row = table.loc[(press, ratio)]
            assert row["kept"] == n_kept(CONTEXT, ratio) and row["key_channel_ratio"] == 0
            assert row["saved"] == pytest.approx(1 - n_kept(CONTEXT, ratio) / CONTEXT)
            assert row["kl"] > 0 and 0 <= row["top1"] <= 1
    think = table.loc[("think", 0.5)]
    assert think["kept"] == CONTEXT and think["key_channel_ratio"] == 0.5 and think["saved"] == pytest.approx(0.25)
    heads = finished.heads
    assert list(heads.columns[:4]) == ["press", "ratio", "layer", "head"] and len(heads) == 7 * 2 * 4
    full = heads[heads["press"] == "full"]
    assert (full["mass_kept"] == 1).all() and full["out_err"].max() < 1e-6
    streaming = heads[(heads["press"] == "streaming") & (heads["ratio"] == 0.5)]
    assert streaming["mass_kept"].between(0, 1).all() and (streaming["out_err"] > 0).all()
    per_sequence = finished.sequences.groupby(["press", "ratio"], sort=False)["nll"].mean()
    np.testing.assert_allclose(per_sequence.to_numpy(), finished.table["nll"].to_numpy(), rtol=1e-12)


def test_a_resumed_run_equals_an_uninterrupted_one(llama_dir, text_file, tmp_path) -> None:
    settings = {**SETTINGS, "batch_size": 1, "checkpoint_seconds": 0.0}
    whole = spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "whole", **settings)

    def interrupt(done, total):
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "cut", **{**settings, "progress": interrupt})
    assert (tmp_path / "cut.partial" / "checkpoint.npz").exists()
    resumed = spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "cut", resume=True, **settings)
    for name in ("table", "heads", "sequences"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), check_exact=True, obj=name)


def test_a_finished_run_reprints_and_plots(finished, monkeypatch, capsys, tmp_path) -> None:
    code, stdout, _ = tiny.run_cli(["cache", str(finished.path), "--plot"], monkeypatch, capsys)
    assert code == 0 and "snapkv" in stdout and "cache_nll_vs_ratio.png" in stdout
    assert spectra.load_run(finished.path).table.equals(finished.table)
