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
from spectra.kv.presses import n_kept

import tiny

CONTEXT, CONTINUATION = 70, 8
QUIET = dict(progress=None, notify=lambda line: None)
SETTINGS = dict(context=CONTEXT, continuation=CONTINUATION, presses="streaming,snapkv,think", ratios="0.5,0.25",
                samples=3, batch_size=2, **QUIET)


class Stop(Exception):
    """Raised from a progress callback: an interrupt after some batches."""


def interrupted_and_resumed(llama_dir, text_file, tmp_path, settings: dict, after: int):
    """A run stopped once `after` sequences are done (its checkpoint left), then resumed to the end."""
    def interrupt(done, total):
        if done >= after:
            raise Stop

    with pytest.raises(Stop):
        spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "cut", **{**settings, "progress": interrupt})
    assert (tmp_path / "cut.partial" / "checkpoint.npz").exists()
    return spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "cut", resume=True, **settings)


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
                             ({"continuation": 1}, "continuation must be an integer ≥ 2"),
                             ({"presses": "knorm,compactor", "context": 12},
                              "compactor compresses contexts of at least 13 tokens: it needs context ≥ 13, got 12"),
                             ({"presses": "decoding(knorm)", "compression_interval": 0},
                              "compression_interval must be an integer ≥ 1, got 0"),
                             ({"presses": "knorm", "compression_interval": 8},
                              "compression_interval paces the decoding presses, but none is among presses")):
        with pytest.raises(SpectraError, match=message):
            CacheOptions(**options)


def test_the_model_shape_is_checked_before_it_loads() -> None:
    cache, config = REGISTRY["cache"], RunConfig("m", "d")
    with pytest.raises(SpectraError, match="tiny-bert is an encoder: a key–value cache belongs to a decoder"):
        cache.check(config, cache.resolve(config, CacheOptions()), Shape(2, 4, 512, False, "tiny-bert"))
    with pytest.raises(SpectraError, match="context 1024 \\+ continuation 128 = 1152 tokens exceeds what tiny can "
                                           "embed \\(512 positions\\)"):
        cache.check(config, cache.resolve(config, CacheOptions()), Shape(2, 4, 512, True, "tiny"))
    cache.check(config, cache.resolve(config, CacheOptions(context=300, continuation=12)), Shape(2, 4, 512, True, "tiny"))


@pytest.mark.parametrize("case", ["ratio", "press", "encoder", "no-rope", "no-rope-rerotation", "positions", "loki-window", "short-context",
                                  "fit-none", "fit-all", "decoding-scorer", "interval"])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(case, llama_dir, gpt2_dir, bert_dir, text_file,
                                                                      tmp_path, monkeypatch, capsys) -> None:
    model, extra, message = {
        "ratio": (llama_dir, ["--ratios", "0.5,1.0"], "--ratios must lie in [0, 1)"),
        "press": (llama_dir, ["--presses", "knorm,h2o"], "unknown press 'h2o'"),
        "encoder": (bert_dir, [], "is an encoder"),
        "no-rope": (gpt2_dir, ["--presses", "knorm,think"], "think reads rotary positions, but tiny-gpt2 has no "
                                                            "rotary position embedding"),
        "no-rope-rerotation": (gpt2_dir, ["--presses", "key_rerotation(knorm)"],
                               "key_rerotation(knorm) reads rotary positions, but tiny-gpt2 has no rotary position "
                               "embedding"),
        "positions": (llama_dir, ["--context", "100", "--continuation", "40"],
                      "--context 100 + --continuation 40 = 140 tokens exceeds what tiny-llama can embed"),
        "loki-window": (llama_dir, ["--presses", "loki", "--context", "64"], "loki reads the last 64 context queries"),
        "short-context": (llama_dir, ["--presses", "adakv(expected_attention)", "--context", "4"],
                          "adakv(expected_attention) compresses contexts of at least 5 tokens: it needs --context ≥ 5"),
        "fit-none": (llama_dir, ["--presses", "knorm", "--fit-samples", "2"], "but none is among --presses"),
        "fit-all": (llama_dir, ["--presses", "lowrank", "--fit-samples", "1000"], "a shorter --context + --continuation"),
        "decoding-scorer": (llama_dir, ["--presses", "decoding(snapkv)"],
                            "decoding wraps a decodable press, and 'snapkv' is not one"),
        "interval": (llama_dir, ["--presses", "decoding(tova)", "--compression-interval", "0"],
                     "--compression-interval must be an integer ≥ 1, got 0"),
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
    # bytes of the context cache, all 2 layers × 2 key/value heads, float32, d = 8: a token's key and value 64 bytes
    whole = 2 * 2 * CONTEXT * 64
    assert table.loc[("full", 0.0), "bytes"] == whole and table.loc[("full", 0.0), "bytes_share"] == 1
    for ratio in (0.25, 0.5):
        assert table.loc[("snapkv", ratio), "bytes"] == 2 * 2 * n_kept(CONTEXT, ratio) * 64
    # ThinK at 0.5: 4 of 8 key channels, every value, a 1-byte channel mask per head
    assert think["bytes"] == 2 * 2 * (CONTEXT * (4 + 8) * 4 + 1) and think["bytes_share"] == think["bytes"] / whole
    assert list(table["axis"]) == ["none"] + ["tokens"] * 4 + ["channels"] * 2
    heads = finished.head_stats
    assert list(heads.columns[:4]) == ["press", "ratio", "layer", "head"] and len(heads) == 7 * 2 * 4
    full = heads[heads["press"] == "full"]
    assert (full["mass_kept"] == 1).all() and full["out_err"].max() < 1e-6
    assert (full["bytes_share"] == 1).all()
    assert np.allclose(heads.loc[heads["press"] == "think", "bytes_share"],
                       np.repeat(table.loc["think", "bytes_share"].to_numpy(), 2 * 4))
    streaming = heads[(heads["press"] == "streaming") & (heads["ratio"] == 0.5)]
    assert streaming["mass_kept"].between(0, 1).all() and (streaming["out_err"] > 0).all()
    per_sequence = finished.sequences.groupby(["press", "ratio"], sort=False)["nll"].mean()
    np.testing.assert_allclose(per_sequence.to_numpy(), finished.table["nll"].to_numpy(), rtol=1e-12)


def test_a_resumed_run_equals_an_uninterrupted_one(llama_dir, text_file, tmp_path) -> None:
    settings = {**SETTINGS, "batch_size": 1, "checkpoint_seconds": 0.0}
    whole = spectra.cache(str(llama_dir), str(text_file), out=tmp_path / "whole", **settings)
    resumed = interrupted_and_resumed(llama_dir, text_file, tmp_path, settings, after=2)
    for name in ("table", "head_stats", "sequences"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), check_exact=True, obj=name)


def test_a_finished_run_reprints_and_plots(finished, monkeypatch, capsys, tmp_path) -> None:
    code, stdout, _ = tiny.run_cli(["cache", str(finished.path), "--plot"], monkeypatch, capsys)
    assert code == 0 and "snapkv" in stdout and "cache_nll_vs_ratio.png" in stdout
    assert spectra.load_run(finished.path).table.equals(finished.table)


# --- calibration (--fit-samples): loki and lowrank fitted on the first sequences, frozen for the evaluated ones ---

FIT = dict(context=CONTEXT, continuation=CONTINUATION, presses="loki,lowrank", ratios="0.5", samples=2,
           fit_samples=2, batch_size=1, **QUIET)


@pytest.fixture(scope="module")
def calibrated(llama_dir, text_file, tmp_path_factory):
    return spectra.cache(str(llama_dir), str(text_file), out=tmp_path_factory.mktemp("runs") / "fit", **FIT)


def eager_prefills(llama_dir, text_file, indices):
    """Per sequence: its tokens, and per layer the context's pre-RoPE keys (the model's own k_proj), post-RoPE keys
    and values (transformers' own cache after an eager prefill), each (H_kv, L, d) in float64 numpy."""
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file))
    found, pre = [], {}
    hooks = [layer.self_attn.k_proj.register_forward_hook(
        lambda module, args, output, i=i: pre.__setitem__(i, output)) for i, layer in enumerate(model.model.layers)]
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    for index, ids in zip(range(max(indices) + 1), data.sequences(tokenizer, corpus, CONTEXT + CONTINUATION, "pack")):
        if index not in indices:
            continue
        ids = torch.tensor([ids])
        with torch.no_grad():
            past = model(input_ids=ids[:, :CONTEXT], use_cache=True).past_key_values
        layers = [(pre[i][0].unflatten(-1, (heads, dim)).transpose(0, 1).double().numpy(),
                   past.layers[i].keys[0].double().numpy(), past.layers[i].values[0].double().numpy())
                  for i in range(len(model.model.layers))]
        found.append((ids, layers))
    for hook in hooks:
        hook.remove()
    return model, found


def statistics(npz, press: str, layer: int, tensor: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and biased covariance per head from a run's calibration.npz sums."""
    total, second = npz[f"{press}|{layer}|{tensor}|sum"], npz[f"{press}|{layer}|{tensor}|second"]
    count = int(npz[f"{press}|{layer}|{tensor}|count"])
    mean = total / count
    return mean, second / count - mean[..., :, None] * mean[..., None, :]


def numpy_fit(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    pooled = np.concatenate(rows, axis=1)  # (H_kv, N, d)
    return pooled.mean(1), np.stack([np.cov(x, rowvar=False, bias=True) for x in pooled])


def test_calibrated_bases_are_the_calibration_sequences_pca(calibrated, llama_dir, text_file) -> None:
    _, found = eager_prefills(llama_dir, text_file, {0, 1})
    npz = np.load(calibrated.path / "calibration.npz")
    for layer in range(2):
        for press, tensor, column in (("loki", "key_pre", 0), ("lowrank", "key", 1), ("lowrank", "value", 2)):
            mean, covariance = statistics(npz, press, layer, tensor)
            want_mean, want_covariance = numpy_fit([layers[layer][column] for _, layers in found])
            np.testing.assert_allclose(mean, want_mean, atol=1e-5)
            np.testing.assert_allclose(covariance, want_covariance, atol=1e-5)
            for got, want in zip(covariance, want_covariance):  # loki's rank-2 basis spans the same plane
                top = [np.linalg.eigh(c)[1][:, ::-1][:, :2] for c in (got, want)]
                np.testing.assert_allclose(top[0] @ top[0].T, top[1] @ top[1].T, atol=1e-4)
    assert int(npz["loki|0|key_pre|count"]) == 2 * CONTEXT


def test_calibration_sequences_are_not_evaluated(calibrated) -> None:
    table = calibrated.table.set_index(["press", "ratio"])
    assert (table["sequences"] == 2).all() and (table["tokens"] == 2 * CONTINUATION).all()
    assert sorted(calibrated.sequences["sequence"].unique()) == [2, 3]
    assert calibrated.meta["calibration"] == {"sequences": [0, 2], "used": 2, "presses": ["loki", "lowrank"]}
    assert calibrated.meta["evaluation"] == [2, 4]
    assert calibrated.meta["samples"] == 2 and calibrated.meta["sequences"] == 4, "samples: the evaluated ones"
    assert not spectra.kv.presses.REGISTRY["loki"].moments.sums and not spectra.kv.presses.REGISTRY["lowrank"].moments.sums


def numpy_lowrank(rows: np.ndarray, mean: np.ndarray, covariance: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    out = []
    for x, mu, c, rank in zip(rows, mean, covariance, ranks):
        basis = np.linalg.eigh(c)[1][:, ::-1][:, :rank]
        out.append(mu + (x - mu) @ basis @ basis.T)
    return np.stack(out)


def test_evaluated_lowrank_is_the_dense_continuation_with_the_frozen_fit(calibrated, llama_dir, text_file) -> None:
    model, calibration = eager_prefills(llama_dir, text_file, {0, 1})
    _, evaluated = eager_prefills(llama_dir, text_file, {2, 3})
    fits = {(layer, column): numpy_fit([layers[layer][column] for _, layers in calibration])
            for layer in range(2) for column in (1, 2)}
    got = calibrated.sequences.set_index(["press", "ratio", "sequence"])["nll"]
    for sequence, (ids, layers) in zip((2, 3), evaluated):
        with torch.no_grad():
            prefill = model(input_ids=ids[:, :CONTEXT], use_cache=True)
        past = prefill.past_key_values
        for layer in range(2):
            shares = []  # relative eigenvalues of keys and values, every head: the 0.5 · 2·d·H_kv largest kept
            for column in (1, 2):
                values = np.linalg.eigvalsh(fits[(layer, column)][1])[:, ::-1].clip(0)
                shares.append(values / values.sum(-1, keepdims=True))
            shares = np.stack(shares)
            chosen = np.zeros(shares.size, bool)
            chosen[np.argsort(-shares.ravel(), kind="stable")[: round(0.5 * shares.size)]] = True
            ranks = chosen.reshape(shares.shape).sum(-1)
            for column, name, rank in ((1, "keys", ranks[0]), (2, "values", ranks[1])):
                rebuilt = numpy_lowrank(layers[layer][column], *fits[(layer, column)], rank)
                setattr(past.layers[layer], name, torch.from_numpy(rebuilt).float()[None])
        with torch.no_grad():
            rest = model(input_ids=ids[:, CONTEXT:-1], past_key_values=past).logits[0]
        logits = torch.cat([prefill.logits[0, -1:], rest]).double()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, CONTEXT:], reduction="none").mean().item()
        assert got[("lowrank", 0.5, sequence)] == pytest.approx(nll, abs=1e-4)


def test_a_resumed_calibrated_run_equals_an_uninterrupted_one(calibrated, llama_dir, text_file, tmp_path) -> None:
    settings = {**FIT, "checkpoint_seconds": 0.0}
    # stopped inside the calibration: the checkpoint holds the sums of one sequence
    resumed = interrupted_and_resumed(llama_dir, text_file, tmp_path, settings, after=1)
    for name in ("table", "head_stats", "sequences"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(calibrated, name), check_exact=True, obj=name)
    for key, value in np.load(calibrated.path / "calibration.npz").items():
        np.testing.assert_array_equal(np.load(resumed.path / "calibration.npz")[key], value)


def test_fit_samples_is_checked_in_one_line() -> None:
    assert CacheOptions(presses="snapkv,loki", fit_samples=4).calibrating_presses == ("loki",)
    for options, message in (({"presses": "snapkv", "fit_samples": 4}, "fit.samples calibrates the presses that fit "
                                                                       "\\(loki, lowrank\\), but none is among"),
                             ({"fit_samples": -1}, "fit.samples must be an integer ≥ 0"),
                             ({"presses": "lowrank,loki", "context": 40}, "loki reads the last 64 context queries")):
        with pytest.raises(SpectraError, match=message):
            CacheOptions(**options)


def test_where_the_window_fills_the_budget_the_run_says_so(llama_dir, text_file, tmp_path, monkeypatch,
                                                            capsys) -> None:
    """At --context 80 a ratio of 0.2 keeps 64 tokens and 0.5 keeps 40: no more than the 64-token window snapkv and
    loki always keep, so their scores choose nothing (issue 33: loki equalled snapkv at --context 128). The run says
    so before it starts (stderr) and beside its table. With exactly 64 kept both keep the whole window: the same
    cache, so the same numbers; below it torch.topk's tie-break among the protected tokens picks which stay."""
    out = tmp_path / "run"
    code, stdout, stderr = tiny.run_cli(["cache", str(llama_dir), "--data", str(text_file), "--out", str(out),
                                         "--context", "80", "--continuation", "8", "--presses", "snapkv,loki",
                                         "--ratios", "0.2,0.5", "--samples", "2"], monkeypatch, capsys)
    assert code == 0, stderr
    warning = next(line for line in stderr.splitlines() if line.startswith("warning:"))
    assert warning == ("warning: at a context of 80 tokens, ratios 0.2, 0.5 keep 64, 40 tokens, no more than the "
                       "64-token window that snapkv and loki always keep: their scores choose nothing there (below 64 "
                       "kept, torch.topk's tie-break picks which window tokens stay), so loki tells nothing snapkv "
                       "does not; a context of 130 tokens or more lets them choose at every ratio")
    assert ("Ratios 0.2, 0.5 keep 64, 40 tokens, no more than the 64-token window that snapkv and loki always keep: "
            "their scores choose nothing there (below 64 kept, torch.topk's tie-break picks which window tokens "
            "stay), so loki tells nothing snapkv does not") in " ".join(stdout.split()), "and beside the table"
    rows = spectra.load_run(out).sequences.set_index(["press", "ratio", "sequence"])["nll"]
    assert (rows.loc["loki", 0.2] == rows.loc["snapkv", 0.2]).all(), "the whole window: the same cache"
    assert n_kept(80, 0.2) == 64 and n_kept(129, 0.5) == 64 < n_kept(130, 0.5)
    quiet = tiny.run_cli(["cache", str(llama_dir), "--data", str(text_file), "--out", str(tmp_path / "long"),
                          "--context", "100", "--continuation", "8", "--presses", "snapkv,loki", "--ratios", "0.25",
                          "--samples", "1"], monkeypatch, capsys)
    assert quiet[0] == 0 and "-token window" not in quiet[1] + quiet[2], "75 kept: they choose"


def test_a_pattern_or_run_of_another_shape_is_refused_before_the_model_loads(llama_dir, text_file, tmp_path,
                                                                            monkeypatch) -> None:
    import numpy as np

    from spectra.kv import headpattern
    from spectra import models

    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    pattern = headpattern.write(tmp_path / "duo", np.ones((5, 2)), 4, 8)  # the tiny Llama: 2 layers × 2 KV heads
    with pytest.raises(SpectraError, match=r"duo is 5 layers × 2 key/value heads, but .* has 2 × 2"):
        spectra.cache(str(llama_dir), str(text_file), presses=f"duo({pattern})", out=tmp_path / "run", context=80, continuation=8,
                      **QUIET)
    with pytest.raises(SpectraError, match="wraps a scorer press"):
        spectra.cache(str(llama_dir), str(text_file), presses="adakv(think)", out=tmp_path / "run", **QUIET)


def test_a_pattern_is_checked_against_the_key_value_heads_the_shape_tells(tmp_path, text_file) -> None:
    """The kind reads the key/value heads off the model's shape, whichever source told them (a GGUF header, a
    config.json, the loaded model): it reads no model file itself."""
    import numpy as np

    from spectra.kv import headpattern

    pattern = headpattern.write(tmp_path / "duo", np.ones((30, 2)), 4, 8)
    config = RunConfig("m.gguf", str(text_file))
    options = REGISTRY["cache"].resolve(config, CacheOptions(presses=f"duo({pattern})"))
    with pytest.raises(SpectraError, match=r"duo is 30 layers × 2 key/value heads, but SmolLM2 has 30 × 3"):
        REGISTRY["cache"].check(config, options, Shape(30, 9, 8192, True, "SmolLM2", kv_heads=3))
    REGISTRY["cache"].check(config, options, Shape(30, 9, 8192, True, "SmolLM2", kv_heads=2))
    REGISTRY["cache"].check(config, options, Shape(name="a hub id before it loads"))


def test_a_pattern_of_another_shape_is_refused_on_a_gguf_file_before_it_loads(tmp_path, text_file,
                                                                             monkeypatch) -> None:
    import numpy as np

    from spectra.kv import headpattern
    from spectra import models

    folder, name = tiny.smollm2()
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    pattern = headpattern.write(tmp_path / "duo", np.ones((30, 2)), 4, 8)  # SmolLM2: 30 layers × 3 KV heads
    with pytest.raises(SpectraError, match=r"duo is 30 layers × 2 key/value heads, but .* has 30 × 3"):
        spectra.cache(f"{folder}/{name}", str(text_file), presses=f"duo({pattern})", out=tmp_path / "run",
                      context=80, continuation=8, **QUIET)


def test_the_axis_map_options_are_checked_in_one_line(tmp_path) -> None:
    assert CacheOptions(bytes_kept="0.5,0.25,0.5").bytes_kept == (0.25, 0.5)
    for options, message in (({"bytes_kept": "0"}, "bytes.kept must lie in \\(0, 1\\]"),
                             ({"bytes_kept": 1.5}, "bytes.kept must lie in \\(0, 1\\]"),
                             ({"heads_run": str(tmp_path)}, "heads.run is joined to the axis map: give (--)?bytes.kept")):
        with pytest.raises(SpectraError, match=message):
            CacheOptions(**options)


def test_the_axis_map_is_each_key_value_heads_least_loss_within_the_bytes(llama_dir, text_file, tmp_path,
                                                                           monkeypatch, capsys) -> None:
    heads = spectra.heads(str(llama_dir), str(text_file), length=32, samples=2, window=8, recent=8,
                          out=tmp_path / "heads", **QUIET)
    run = spectra.cache(str(llama_dir), str(text_file), context=CONTEXT, continuation=CONTINUATION,
                        presses="snapkv,think,lowrank,composed(snapkv,think)", ratios="0.25,0.5,0.75", samples=2,
                        bytes_kept="0.6,0.9", heads_run=str(heads.path), out=tmp_path / "cache", **QUIET)
    axes, stats = run.axes, run.head_stats
    chain = run.table[run.table["press"] == "composed(snapkv,think)"]  # tokens then key channels: both axes named
    assert (chain["axis"] == "tokens+channels").all() and (chain["key_channel_ratio"] == chain["ratio"]).all()
    assert set(axes["axis"]) <= {"tokens", "channels", "rank"}, "a chain across axes is no single axis of the map"
    assert set(axes["budget"]) == {0.6, 0.9} and len(axes[axes["best"]]) == 2 * 2 * 2  # budgets × layers × KV heads
    for row in axes.itertuples():  # the tiny Llama: 4 query heads over 2 key/value heads
        mine = stats[(stats["layer"] == row.layer) & (stats["head"] // 2 == row.kv_head)]
        pressed = mine[mine["press"].map({"snapkv": "tokens", "think": "channels", "lowrank": "rank"}) == row.axis]
        per_cell = pressed.groupby(["press", "ratio"])[["out_err", "bytes_share"]].mean()
        fits = per_cell[per_cell["bytes_share"] <= row.budget + 1e-9]
        assert row.out_err == pytest.approx(fits["out_err"].min(), rel=1e-12)
        assert row.bytes_share <= row.budget + 1e-9
        same = axes[(axes["budget"] == row.budget) & (axes["layer"] == row.layer) & (axes["kv_head"] == row.kv_head)]
        assert row.best == (row.out_err == same["out_err"].min())
    assert "channels" in set(axes[axes["budget"] == 0.9]["axis"]) and "channels" not in set(
        axes[axes["budget"] == 0.6]["axis"]), "ThinK stores every value: more than 0.6 of the bytes at ≤ 0.75"
    diagnosis = heads.diagnosis
    first = axes.iloc[0]
    group = diagnosis[(diagnosis["layer"] == first["layer"]) & (diagnosis["kv_head"] == first["kv_head"])]
    assert first["head_types"] == "+".join(group.sort_values("head")["head_type"])
    assert first["retrieval"] == pytest.approx(group["retrieval"].max())
    REGISTRY["cache"].show(spectra.load_run(run.path))
    assert "best_heads" in capsys.readouterr().out
    saved = []
    from spectra.report.plots import style

    monkeypatch.setattr(style, "save", lambda figure, out: saved.append(str(out)) or [out])
    REGISTRY["cache"].plot(spectra.load_run(run.path), tmp_path / "figures")
    assert saved[-1].endswith("cache_axes")


def test_a_ratio_the_axis_map_lacks_is_refused_before_the_model_loads(llama_dir, text_file, tmp_path, monkeypatch,
                                                                      capsys) -> None:
    """Issue 41, defect 1: `mixed(RUN)` at a ratio whose budget the map lacks was a traceback after the prefill."""
    from spectra import models

    axes = tmp_path / "axes"
    axes.mkdir()
    pd.DataFrame([{"budget": budget, "layer": layer, "kv_head": head, "press": "knorm", "ratio": 1 - budget,
                   "best": True} for budget in (0.3, 0.6) for layer in (0, 1) for head in (0, 1)]
                 ).to_csv(axes / "cache_axes.csv", index=False)
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    code, _, stderr = tiny.run_cli(["cache", str(llama_dir), "--data", str(text_file), "--presses",
                                    f"tova,kivi4,mixed({axes})", "--ratios", "0.5", "--out", str(tmp_path / "run")],
                                   monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert f"mixed({axes}) plays the byte budgets of its axis map, 0.3, 0.6 (ratios 0.4,0.7), but --ratios 0.5 " \
           "asks for 0.5: pass ratios among 0.4,0.7, or map 0.5 first with --bytes-kept 0.5" in stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


@pytest.mark.parametrize("data, args, message", [
    ("text", ["--query-aware"], "--query-aware appends a task record's question to the context compressed (the task "
                                "study, spectra evaluate); corpus.txt is a text corpus, which runs the NLL study and "
                                "has no question. Drop it, or give a task file"),
    ("tasks", ["--context", "512"], "--context belongs to the NLL study of text; tasks.jsonl is a task file, which "
                                    "runs the task study (spectra evaluate): each record holds its context, question "
                                    "and answer. Drop --context, or give a text corpus"),
    ("tasks", ["--context", "1024"], "Drop --context, or give a text corpus"),  # the default's value, typed: refused
    ("tasks", ["--context", "300", "--continuation", "12"], "--context and --continuation belong to the NLL study"),
])
def test_an_option_of_the_other_protocol_is_refused_before_the_model_loads(data, args, message, llama_dir, text_file,
                                                                           tmp_path, monkeypatch, capsys) -> None:
    """Issue 41, defect 8: --query-aware on a text corpus ran a whole text run recording query_aware: true, and
    --context on a task file was recorded though no record used it."""
    import task_files

    from spectra import models

    given = text_file if data == "text" else task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=2))
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    code, _, stderr = tiny.run_cli(["cache", str(llama_dir), "--data", str(given), "--presses", "knorm",
                                    "--ratios", "0.5", "--out", str(tmp_path / "run"), *args], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == (["tasks.jsonl"] if data == "tasks" else [])


def test_each_protocol_records_only_its_own_options(llama_dir, text_file, tmp_path) -> None:
    """A text run records the NLL protocol's context and continuation (their defaults when not given); a task run
    records none, as it uses none."""
    import task_files

    resolved = REGISTRY["cache"].resolve(RunConfig("m", str(text_file)), CacheOptions(continuation=4))
    assert (resolved.context, resolved.continuation) == (1024, 4)
    settings = dict(presses="knorm", ratios=0.5, samples=1, **QUIET)
    text = spectra.cache(str(llama_dir), str(text_file), context=80, continuation=8, out=tmp_path / "text",
                         **settings)
    assert (text.meta["context"], text.meta["continuation"], text.meta["query_aware"]) == (80, 8, False)
    file = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=1))
    chat = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    run = spectra.cache(str(chat), str(file), query_aware=True, out=tmp_path / "tasks", **settings)
    assert run.meta["query_aware"] is True and "context" not in run.meta and "continuation" not in run.meta


def test_a_corpus_evaluates_16_sequences_unless_told(monkeypatch, capsys) -> None:
    """--samples has no fixed default here: a text corpus takes 16 sequences, a task file all its records."""
    cache = REGISTRY["cache"]
    for samples, evaluated in ((None, 16), (3, 3)):
        config = RunConfig(data="imdb", samples=samples)
        assert cache.configured(config, cache.resolve(config, CacheOptions())).samples == evaluated
    code, stdout, _ = tiny.run_cli(["cache", "--help"], monkeypatch, capsys)
    assert code == 0 and "Sequences of a text corpus (default 16); records of a task file (default: all)" in " ".join(
        stdout.split())


WINDOW = 8  # the tiny Gemma 3's sliding window (tiny.save_gemma3): two local layers before a global one


def gemma_reference(eager, ids: torch.Tensor, mode: str, context: int, ratio: float) -> torch.Tensor:
    """The continuation's NLL (C,) by transformers' own Gemma 3 (eager attention): the context prefilled into its
    cache, each layer's cache then compressed by a forward hook as kvpress writes it (Knorm's −‖k‖, torch.topk's rows
    in topk's order; 'full': nothing) — keep: a local layer cut to its last W − 1 tokens; compress: those scored
    alone; kvpress: every layer's whole context —, and the continuation fed in one pass with each layer's mask
    written by hand: a row seen by the queries whose window holds its position (kvpress: rows counted by index, the
    queries at m + i)."""
    import inspect

    from transformers import DynamicCache

    cache, positions = DynamicCache(), {}

    def press(module, args, kwargs, output):
        local = module.sliding_window is not None and mode != "kvpress"
        first = context - min(context, WINDOW - 1) if local else 0
        whole = mode == "full" or (local and mode == "keep")

        def rank(keys: torch.Tensor) -> torch.Tensor:
            if whole:
                return torch.arange(keys.shape[2]).expand(1, keys.shape[1], -1)
            return (-keys.float().norm(dim=-1)).topk(n_kept(keys.shape[2], ratio), dim=-1).indices

        tiny.compress_layer(cache, module.layer_idx, first, rank, positions)
        return output

    name = "cache" if "cache" in inspect.signature(eager.model.forward).parameters else "past_key_values"
    hooks = [layer.self_attn.register_forward_hook(press, with_kwargs=True) for layer in eager.model.layers]
    with torch.no_grad():
        first = eager(input_ids=ids[None, :context], **{name: cache}).logits[0, -1:]
        for hook in hooks:
            hook.remove()
        masked = tiny.window_mask(cache, positions, mode == "kvpress", WINDOW)
        hooks = [layer.self_attn.register_forward_pre_hook(masked, with_kwargs=True) for layer in eager.model.layers]
        rest = eager(input_ids=ids[None, context:-1], position_ids=torch.arange(context, ids.shape[-1] - 1)[None],
                     **{name: cache}).logits[0]
    for hook in hooks:
        hook.remove()
    logits = torch.cat([first, rest]).double()
    return torch.nn.functional.cross_entropy(logits, ids[context:], reduction="none")


@pytest.mark.parametrize("mode", ["keep", "compress", "kvpress"])
def test_a_sliding_window_model_is_scored_as_its_own_cache_attends(mode, tmp_path) -> None:
    """Issue 52: `spectra cache` on text runs on a tiny Gemma 3 (local layers of window 8 before a global one) under
    each `--local-layers` mode, and every number is the model's own: the full cache's NLL is transformers' eager
    forward over context + continuation, knorm's that model's with its cache compressed by hooks and masks written
    by hand; a local layer's bytes are its window's (keep, compress) or the whole context's (kvpress), the full cache
    losing nothing in any layer (attention mass 1, output error 0) and keep leaving every local layer as it is."""
    context, continuation, ratio = 40, 12, 0.5
    model_dir = tiny.save_gemma3(tmp_path / "gemma")
    text = tiny.write_text(tmp_path / "t.txt")
    # keep: also decoding(knorm), fed the continuation step by step and due only after it: the full cache's NLL
    decoding = dict(presses="knorm,decoding(knorm)", compression_interval=64) if mode == "keep" else {}
    settings = {"presses": "knorm", **QUIET, **decoding}
    run = spectra.cache(str(model_dir), str(text), context=context, continuation=continuation, ratios=str(ratio),
                        samples=2, local_layers=mode, out=tmp_path / "run", **settings)
    assert run.meta["local_layers"] == mode
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    nll = run.sequences.set_index(["press", "sequence"])["nll"]
    sequences = data.sequences(tokenizer, data.open_corpus(str(text)), context + continuation, "pack")
    for index, ids in zip(range(2), sequences):
        ids = torch.tensor(ids)
        with torch.no_grad():
            own = eager(input_ids=ids[None]).logits[0, context - 1:-1].double()
        loss = torch.nn.functional.cross_entropy(own, ids[context:], reduction="none")
        assert nll[("full", index)] == pytest.approx(loss.mean().item(), abs=1e-5)
        assert nll[("full", index)] == pytest.approx(gemma_reference(eager, ids, "full", context, 0).mean().item(),
                                                     abs=1e-5)
        assert nll[("knorm", index)] == pytest.approx(
            gemma_reference(eager, ids, mode, context, ratio).mean().item(), abs=1e-5), index
        if decoding:
            assert nll[("decoding(knorm)", index)] == pytest.approx(nll[("full", index)], abs=1e-5)
    row = 16 * 2 * 4  # one key/value head: a key and a value of 16 float32
    local = context if mode == "kvpress" else WINDOW - 1
    kept = {"keep": WINDOW - 1, "compress": n_kept(WINDOW - 1, ratio), "kvpress": n_kept(context, ratio)}[mode]
    table = run.table.set_index("press")
    assert table.loc["full", "bytes"] == (2 * local + context) * row
    assert table.loc["knorm", "bytes"] == (2 * kept + n_kept(context, ratio)) * row
    heads = run.head_stats
    full = heads[heads["press"] == "full"]
    assert (full["mass_kept"] == 1).all() and full["out_err"].max() < 1e-6 and (full["bytes_share"] == 1).all()
    local_heads = heads[(heads["press"] == "knorm") & (heads["layer"] < 2)]
    if mode == "keep":
        assert (local_heads["mass_kept"] == 1).all() and local_heads["out_err"].max() < 1e-6
    assert np.allclose(local_heads["bytes_share"], kept / local)


def test_local_layers_on_a_model_without_them_is_refused_before_it_loads(llama_dir, text_file, tmp_path,
                                                                          monkeypatch, capsys) -> None:
    """`--local-layers compress|kvpress` asks what a press does to sliding-window layers: on the tiny Llama, which
    has none, `spectra cache` refuses it in one line, exit 2, before the model loads."""
    monkeypatch.setattr(spectra.models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    code, _, stderr = tiny.run_cli(["cache", str(llama_dir), "--data", str(text_file), "--presses", "knorm",
                                    "--local-layers", "compress", "--out", str(tmp_path / "run")], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "--local-layers compress compresses sliding-window layers, but tiny-llama has none" in stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # the real Gemma 3 270M: its GGUF dequantized once into the session's model cache, on a CPU
def test_the_real_gemma3_full_cache_nll_is_its_own_forward(tmp_path) -> None:
    """Issue 52 on the real model (skipped without its package): the NLL study on a context longer than the sliding
    window (600 > 512) — the full cache's NLL is transformers' eager forward over context and continuation, and
    knorm under `--local-layers keep` leaves every local layer its window (bytes share 1, output error 0)."""
    from spectra import modelcache

    path = tiny.gemma3_270m()
    context, continuation = 600, 16
    text = tmp_path / "licences.txt"
    text.write_text(tiny.licence_text())
    run = spectra.cache(path, str(text), context=context, continuation=continuation, presses="knorm", ratios="0.5",
                        samples=1, out=tmp_path / "run", **QUIET)
    where = modelcache.entry(path).directory
    tokenizer = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, attn_implementation="eager").eval()
    ids = torch.tensor([next(iter(data.sequences(tokenizer, data.open_corpus(str(text)), context + continuation,
                                                 "pack")))])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, context - 1:-1].double()
    loss = torch.nn.functional.cross_entropy(logits, ids[0, context:])
    table = run.table.set_index("press")
    assert table.loc["full", "nll"] == pytest.approx(loss.item(), abs=1e-4)
    local = [layer for layer, kind in enumerate(model.config.layer_types) if kind == "sliding_attention"]
    heads = run.head_stats.set_index(["press", "layer"]).loc["knorm"]
    assert np.allclose(heads.loc[local, "bytes_share"], 1) and heads.loc[local, "out_err"].max() < 1e-4
    assert table.loc["knorm", "bytes_share"] < 1
