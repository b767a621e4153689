"""spectra/kinds/pressbase.py: the options both studies of a compressed cache share are checked once, in one line
each, and the refusals a press puts on a model hold for the NLL study and the task study alike."""

from __future__ import annotations

import re

import pytest

from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.kv.passes import PASSES
from spectra.kinds.pressbase import (DEFAULT_INTERVAL, PressOptions, PressStudy, default_presses, press_lines,
                                     ratio_meanings, rotary)
from spectra.registry import PRESSES, takes_argument


def test_the_ratios_help_says_what_each_press_declares_its_ratio_is() -> None:
    """Issue 37, item 4: a ratio means tokens, key channels, rank, a share of heads or nothing (kivi) depending on the
    press; each press declares it (its axis, or `ratio_means`) and --ratios' help is written from the declarations,
    in `spectra cache --help` and `spectra evaluate --help` alike."""
    text = ratio_meanings()
    assert text.startswith("for most, the share of cached tokens removed; for think, the share of key channels "
                           "removed (half of it saved: keys are half the cache); for lowrank, the share of principal "
                           "directions removed; for linformer, the share of cached rows removed, the rows kept "
                           "capped at the head dimension (so beyond L ≈ d/(1 − r) every ratio keeps d rows); for "
                           "kivi2, kivi4, kivi8, ignored (the bits are in the name); for chunkkv(<scorer>), the share "
                           "of its 20-token chunks removed; for duo(<pattern>), the share of key/value heads made "
                           "streaming")
    with PRESSES.extended({"halfbits": (object(), {"axis": "bits"}), "heads": (object(), {"ratio_means": "heads"})}):
        assert ratio_meanings() == text + "; for halfbits, the share of bits removed; for heads, heads"
    help_text = " ".join(REGISTRY["cache"].options.__dataclass_fields__["ratios"].metadata["help"].split())
    assert text in help_text and help_text.startswith("Comma-separated compression ratios in [0, 1), as each press")
    assert REGISTRY["evaluate"].options.__dataclass_fields__["ratios"].metadata["help"] == \
        REGISTRY["cache"].options.__dataclass_fields__["ratios"].metadata["help"]


def test_the_press_listing_has_every_press_once_with_its_summary_and_peer() -> None:
    """Issue 38: the rows `spectra cache --help` and `spectra evaluate --help` list after their options, from the
    declarations: each press as written on the command line, what it keeps, and the kvpress class it equals."""
    rows = press_lines()
    names = [name for name, _ in rows]
    assert names == [PRESSES.listing_of(name) if takes_argument(entry) else name
                     for name, entry in PRESSES.entries().items()]
    assert len(set(names)) == len(names) == len(PRESSES) >= 30 and "decoding(<decodable>)" in names
    shown = dict(rows)
    assert shown["snapkv"] == "the keys the last 64 queries attend to (kvpress: SnapKVPress)"
    assert shown["adakv(<scorer>)"] == ("a scorer's best tokens, the layer's budget shared by its heads "
                                        "(kvpress: AdaKVPress)")
    assert shown["loki"].endswith("(spectra's own)") and shown["kivi2"].startswith("every token at 2 bits")
    own = [name for name, line in rows if line.endswith("(spectra's own)")]
    assert own == ["pca_leverage", "loki", "lowrank", "linformer", "kivi2", "kivi4", "kivi8", "headbudget(<run>)",
                   "mixed(<cache run>)"]
    assert all(re.search(r"\S \(kvpress: [A-Za-z]+Press\)$", line) for name, line in rows if name not in own)
    for name in ("cache", "evaluate"):
        assert REGISTRY[name].listings() == {"Presses": rows}
    assert REGISTRY["analyze"].listings() == {}


def test_the_shared_options_are_checked_once_for_both_studies() -> None:
    options = PressOptions(presses="knorm,decoding(tova)", ratios="0.5,0.25,0.5,0", compression_interval=16)
    assert options.presses == ("knorm", "decoding(tova)") and options.ratios == (0.25, 0.5)
    assert options.decoding_presses == ("decoding(tova)",) and options.calibrating_presses == ()
    assert PressOptions(presses="lowrank").calibrating_presses == ("lowrank",)
    for bad, message in ((dict(ratios="1.0"), "must lie in [0, 1)"), (dict(ratios="0"), "holds no ratio above 0"),
                         (dict(compression_interval=0), "must be an integer ≥ 1"),
                         (dict(presses="knorm", compression_interval=DEFAULT_INTERVAL + 1), "paces the decoding"),
                         (dict(presses="nosuch"), "nosuch")):
        with pytest.raises(SpectraError, match=re.escape(message)):
            PressOptions(**bad)
    for name in ("cache", "evaluate"):
        study = REGISTRY[name]
        assert isinstance(study, PressStudy) and issubclass(study.options, PressOptions)
        assert study.options(presses="knorm").presses == ("knorm",)


def test_the_default_presses_leave_out_those_running_a_whole_model_pass_and_all_brings_them() -> None:
    """Issue 38: by default --presses (and the API's `presses`) runs every press named alone but those whose facts say
    they run a whole-model pass of their own after the prefill (KVzip's reconstruction, KVCompose's replay, KVgrad's
    attribution: a few prefills more each) — a press declared later with such a fact too; `all` is every press named
    alone, with other names beside it."""
    alone = PRESSES.bare()
    passes = [name for name in alone if any(PASSES[read].whole_model for read in PRESSES.facts(name).get("reads", ()))]
    assert set(passes) >= {"kvzip", "kvcompose", "kvgrad"}
    for name in ("cache", "evaluate"):
        options = REGISTRY[name].options
        assert options().presses == tuple(press for press in alone if press not in passes)
        assert options(presses="all").presses == alone
        assert options(presses=["knorm", "all", "adakv(snapkv)"]).presses == (
            "knorm", *(press for press in alone if press != "knorm"), "adakv(snapkv)")
        text = " ".join(options.__dataclass_fields__["presses"].metadata["help"].split())
        assert text.endswith("Default: every press named alone but those running a whole-model pass of their own "
                             "(kvgrad, kvzip, kvcompose); all: every press named alone.")
    with PRESSES.extended({"replayed": (object(), {"reads": ("composition",)}), "plain": (object(), {"axis": "tokens"})}):
        assert "replayed" not in default_presses() and "plain" in default_presses()
    with pytest.raises(SpectraError, match=re.escape("unknown press 'every'; valid presses: streaming, knorm")
                       + ".*, all \\(every press named alone\\), kvpress-leaderboard, .*, "
                       "kvpress:<name> \\(kvpress's registry names\\)$"):
        PressOptions(presses="every")


def test_rotary_reads_the_config_fields_of_rope() -> None:
    assert rotary({"rope_theta": 10000.0}) and rotary({"rope_parameters": {"rope_type": "default"}})
    assert not rotary({"hidden_size": 8}) and not rotary({"rope_theta": None})


def test_an_encoder_is_refused_by_either_study_in_its_words(bert_dir) -> None:
    from spectra import checkpoints
    from spectra.config import RunConfig

    shape = checkpoints.inspect(str(bert_dir), None).shape()
    for name, words in (("cache", "a key–value cache belongs to a decoder"),
                        ("evaluate", "the task study decodes answers with a decoder")):
        study = REGISTRY[name]
        with pytest.raises(SpectraError, match=f"is an encoder: {words}"):
            PressStudy.check(study, RunConfig(model=str(bert_dir)), study.options(presses="knorm"), shape)


def test_an_artifact_of_another_shape_is_refused_before_the_model_loads_or_anything_is_written(
        llama_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    """qfilter(DIR) and expected_attention_stats(DIR) are held to the model's layers and heads before it loads, and
    to its head dimension once it has (the tiny Llama: 2 layers, 4 heads over 2 key/value heads of 8 dimensions)."""
    import torch

    from spectra import models
    from spectra.kv import artifacts

    from ..tiny import run_cli

    deep = artifacts.write(tmp_path / "deep", {"q_filters": torch.zeros(5, 2, 8)},
                           {"num_layers": 5, "num_kv_heads": 2, "kv_head_dim": 8})
    wide = artifacts.write(tmp_path / "wide", {"query_mean": torch.zeros(2, 9, 8), "query_cov": torch.zeros(2, 9, 8, 8)},
                           {"num_layers": 2, "num_heads": 9, "head_dim": 8})
    narrow = artifacts.write(tmp_path / "narrow", {"q_filters": torch.zeros(2, 2, 4)},
                             {"num_layers": 2, "num_kv_heads": 2, "kv_head_dim": 4})
    cut = artifacts.write(tmp_path / "cut", {"q_filters": torch.zeros(2, 2, 8)},
                          {"num_layers": 2, "num_kv_heads": 2, "kv_head_dim": 8})
    whole = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(whole[:len(whole) // 2])  # issue 55: a traceback once the model loaded
    with monkeypatch.context() as patch:
        patch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
        for press, message in ((f"qfilter({deep})", "is 5 layers × 2 key/value heads × 8 head dimensions, but "
                                                    r"\S+ has 2 layers × 2 key/value heads;"),
                               (f"expected_attention_stats({wide})", "9 query heads .* has 2 layers × 4 query heads"),
                               (f"qfilter({cut})", r"model.safetensors is cut short: its tensors take 128 bytes")):
            code, out, err = run_cli(["cache", str(llama_dir), "--data", str(text_file), "--presses", press,
                                      "--out", str(tmp_path / "run")], monkeypatch, capsys)
            assert code == 2 and re.search(message, err) and err.count("\n") == 1, err
    code, out, err = run_cli(["cache", str(llama_dir), "--data", str(text_file), "--presses", f"qfilter({narrow})",
                              "--context", "40", "--continuation", "8", "--samples", "1", "--out",
                              str(tmp_path / "run")], monkeypatch, capsys)
    assert code == 2 and "× 4 head dimensions, but" in err and "× 8 head dimensions" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_a_budget_curve_of_another_shape_is_refused_by_either_study_before_the_model_loads(tmp_path) -> None:
    """lukv(FILE): the curve's layers × key/value heads are checked against the model's shape (read off its header
    or config, before it loads), as duo's pattern is."""
    import numpy as np

    from spectra.checkpoints import Shape
    from spectra.config import RunConfig

    path = tmp_path / "curve.npy"
    np.save(path, np.zeros((99, 30, 2)))
    for name in ("cache", "evaluate"):
        study = REGISTRY[name]
        options = study.options(presses=f"lukv({path})")
        with pytest.raises(SpectraError, match=rf"^{path} is a budget curve for 30 layers × 2 key/value heads, but "
                                               r"SmolLM2 has 30 × 3$"):
            PressStudy.check(study, RunConfig(model="m.gguf"), options, Shape(30, 9, 8192, True, "SmolLM2",
                                                                             kv_heads=3))
        PressStudy.check(study, RunConfig(model="m.gguf"), options, Shape(30, 9, 8192, True, "SmolLM2", kv_heads=2))


def test_a_press_sharing_its_budget_across_layers_is_refused_by_that_fact(tmp_path) -> None:
    """Issue 52: `--local-layers compress|kvpress` refuses a press whose budget is shared by every (global) layer's
    heads — a local layer keeping its window is no part of it — by the fact its class declares (`across_layers`:
    headbudget, kvzip), not by its name: headbudget's line is unchanged, any press declaring the fact is refused the
    same way, a press wrapping one (adakv(<scorer>)) inherits the fact, and `keep` refuses none of them. (kvzip,
    kvgrad and kvcompose share theirs too, refused first for their whole-model pass.)"""
    from spectra.config import LocalLayers
    from spectra.kinds.pressbase import local_refusal

    from ..anatomy.test_headweights import fake_run

    folder, _ = fake_run(tmp_path / "run", layers=2)
    budget = f"headbudget({folder})"
    why = "shares its budget among the global layers' heads, a local layer keeping its window"
    assert PRESSES.having("across_layers") & set(PRESSES.bare()) == {"kvzip", "kvgrad", "kvcompose"}
    assert PRESSES.facts(budget)["across_layers"]
    for mode in (LocalLayers.COMPRESS, LocalLayers.KVPRESS):
        assert local_refusal(mode, ("knorm", budget)) == (budget, why)
    with PRESSES.extended({"pooled": (object(), {"across_layers": True, "scorer": True})}):
        for mode in (LocalLayers.COMPRESS, LocalLayers.KVPRESS):
            assert local_refusal(mode, ("knorm", "pooled")) == ("pooled", why)
            assert local_refusal(mode, ("adakv(pooled)",)) == ("adakv(pooled)", why)
        assert local_refusal(LocalLayers.KEEP, ("pooled", "adakv(pooled)")) is None
    assert local_refusal(LocalLayers.KEEP, (budget, "kvzip")) is None
    with pytest.raises(SpectraError, match=re.escape(f"local_layers compress: {budget} {why}; leave it out, or keep "
                                                     "the local layers' windows (local_layers='keep')")):
        PressOptions(presses=budget, local_layers="compress")
