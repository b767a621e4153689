"""The cache probe: sequences shorter than context + continuation are skipped and counted, the variants' batched
continuation gives the numbers one variant at a time gives (its state round-trips: tests/kinds/test_cache.py
resumes a run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spectra
import spectra.models
from spectra.probes import cache as probe_module

QUIET = dict(progress=None, notify=lambda line: None)


def run(llama_dir, text_file, out, **options):
    settings = dict(context=70, continuation=6, presses="knorm,tova", ratios="0.5", samples=2, **QUIET)
    return spectra.cache(str(llama_dir), str(text_file), out=out, **{**settings, **options})


def test_short_sequences_are_skipped_and_counted(llama_dir, tmp_path) -> None:
    corpus = tmp_path / "short.txt"
    words = "the quick brown fox jumps over the lazy dog and runs away".split()
    corpus.write_text("\n".join([" ".join(words * 12), "a short line", " ".join(words * 10)]) + "\n")
    finished = run(llama_dir, corpus, tmp_path / "run", mode="truncate", samples=3, seed=1)
    assert finished.meta["skipped"] == 1 and finished.meta["scored"] == 2
    assert finished.sequences["sequence"].nunique() == 2
    assert finished.table["sequences"].eq(2).all()


def test_one_variant_at_a_time_gives_the_batched_numbers(llama_dir, text_file, tmp_path, monkeypatch) -> None:
    batched = run(llama_dir, text_file, tmp_path / "batched")
    monkeypatch.setattr(probe_module, "LOGIT_BYTES", 1)  # one (press, ratio) per continuation forward pass
    alone = run(llama_dir, text_file, tmp_path / "alone")
    for column in ("nll", "kl", "top1", "kept"):
        np.testing.assert_allclose(alone.table[column], batched.table[column], atol=1e-5, err_msg=column)


def test_presses_see_the_keys_before_rope_and_the_prefill_rows(llama_dir, text_file, tmp_path, monkeypatch) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from spectra.kv import presses
    from spectra.kv.presses.eviction import Knorm

    seen = []

    class Recording(Knorm):
        def compress(self, prefill, ratio):
            seen.append(prefill)
            return super().compress(prefill, ratio)

    monkeypatch.setitem(presses.REGISTRY, "knorm", Recording())
    run(llama_dir, text_file, tmp_path / "run", samples=1, presses="knorm,observed")  # observed reads `received`
    assert [prefill.layer for prefill in seen] == [0, 1] and all(prefill.index == 0 for prefill in seen)
    model = spectra.models.load(str(llama_dir), device="cpu").model
    for prefill in seen:
        assert prefill.key.shape == prefill.key_pre.shape == (2, 70, 8) and prefill.q.shape == (4, 64, 8)
        cos, sin = model.rotary_emb(prefill.key_pre, torch.arange(70)[None])
        _, rotated = apply_rotary_pos_emb(prefill.key_pre[None], prefill.key_pre[None], cos, sin)
        torch.testing.assert_close(rotated[0], prefill.key, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(prefill.window.sum(-1).numpy(), 1, atol=1e-5)
        np.testing.assert_allclose(prefill.read("received").sum(-1).numpy(), 70, rtol=1e-5)


def test_a_press_reading_queries_sees_them_before_rope(llama_dir, text_file, tmp_path, monkeypatch) -> None:
    """A press reading `query_pre` (expected_attention) gets every context query before RoPE and the model's RoPE:
    rotated, they are the post-RoPE queries of its window; a run without one keeps none."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from spectra.kv import presses
    from spectra.kv.presses.eviction import Knorm
    from spectra.kv.presses.expected import ExpectedAttention

    seen = []

    class Recording(ExpectedAttention):
        def compress(self, prefill, ratio):
            seen.append(prefill)
            return super().compress(prefill, ratio)

    class Plain(Knorm):
        def compress(self, prefill, ratio):
            seen.append(prefill)
            return super().compress(prefill, ratio)

    monkeypatch.setitem(presses.REGISTRY, "expected_attention", Recording())
    monkeypatch.setitem(presses.REGISTRY, "knorm", Plain())
    run(llama_dir, text_file, tmp_path / "run", samples=1, presses="knorm,expected_attention")
    assert len(seen) == 4 and all("query_pre" in prefill.passes for prefill in seen)
    for prefill in seen:
        query_pre = prefill.read("query_pre")
        assert query_pre.shape == (4, 70, 8)
        cos, sin = prefill.rope(torch.arange(70))
        rotated, _ = apply_rotary_pos_emb(query_pre[None], query_pre[None], cos[None], sin[None])
        torch.testing.assert_close(rotated[0, :, -64:], prefill.q, atol=1e-5, rtol=1e-5)
    seen.clear()
    run(llama_dir, text_file, tmp_path / "plain", samples=1, presses="knorm")
    assert len(seen) == 2 and all(not prefill.passes for prefill in seen)


def test_a_decoding_press_is_the_full_cache_until_it_compresses(llama_dir, text_file, tmp_path) -> None:
    """decoding(knorm) compresses nothing after the prefill: paced beyond the continuation it is the full cache; paced
    every 2 tokens it keeps the ratio's rows and saves the memory those rows save at each token, and its NLL is the
    teacher-forced dense reference's (tests/test_decoding.py) so here only: it differs from the full cache."""
    presses = "knorm,decoding(knorm),decoding(tova)"
    distant = run(llama_dir, text_file, tmp_path / "distant", presses=presses, compression_interval=6)
    table = distant.table.set_index(["press", "ratio"])
    for press in ("decoding(knorm)", "decoding(tova)"):
        for column in ("nll", "kl", "top1"):
            np.testing.assert_allclose(table.loc[(press, 0.5), column], table.loc[("full", 0.0), column], atol=1e-6)
    often = run(llama_dir, text_file, tmp_path / "often", presses=presses, compression_interval=2)
    table = often.table.set_index(["press", "ratio"])
    row = table.loc[("decoding(knorm)", 0.5)]
    assert row["kept"] == 35 and row["nll"] != table.loc[("full", 0.0), "nll"]
    # 5 fed tokens (C − 1), from 70 cached rows; compressions to 35 after tokens 2 and 4
    attended = np.array([71, 72, 36, 37, 36])
    np.testing.assert_allclose(row["saved"], np.mean(1 - attended / np.arange(71, 76)), rtol=1e-12)
    heads = often.head_stats
    assert heads[heads["press"] == "decoding(knorm)"][["mass_kept", "out_err"]].isna().all().all()


def test_a_press_that_reconstructs_is_measured_after_the_pass_as_it_would_be_before(llama_dir, text_file, tmp_path,
                                                                                     monkeypatch) -> None:
    """A press reading `reconstruction` compresses every layer after the forward pass (the reconstruction pass needs
    all of them): knorm declared so, under tova's name, gives knorm's numbers (its own rows of every table), and
    sees the pass's scores."""
    from spectra.kv import presses
    from spectra.kv.presses.eviction import Knorm

    seen = []

    class Late(Knorm):
        reads = ("reconstruction",)

        def compress(self, prefill, ratio):
            seen.append(prefill)
            return super().compress(prefill, ratio)

    monkeypatch.setitem(presses.REGISTRY, "tova", Late())
    finished = run(llama_dir, text_file, tmp_path / "run", presses="knorm,tova,kvzip")
    assert len(seen) == 2 * 2 and all("reconstruction" in prefill.passes for prefill in seen)
    assert [prefill.layer for prefill in seen] == [0, 1, 0, 1]
    assert seen[0].read("reconstruction").shape == (2, 2, 70)
    assert seen[0].read("reconstruction") is seen[1].read("reconstruction")
    for table, keys in ((finished.table, []), (finished.head_stats, ["layer", "head"])):
        numbers = [column for column in table.columns if table[column].dtype.kind == "f" and column != "ratio"]
        knorm = table[table["press"] == "knorm"].sort_values(keys or ["ratio"])[numbers].to_numpy()
        late = table[table["press"] == "tova"].sort_values(keys or ["ratio"])[numbers].to_numpy()
        np.testing.assert_allclose(late, knorm, rtol=1e-5, atol=1e-6)
    kvzip = finished.table.set_index("press").loc["kvzip"]
    assert kvzip["kept_share"] == pytest.approx(0.5) and kvzip["nll"] != finished.table["nll"].iloc[0]


def test_a_press_that_composes_gets_the_replay_pass_alone(llama_dir, text_file, tmp_path, monkeypatch) -> None:
    """kvcompose reads `composition`: its cells wait for KVCompose's replay pass, which reaches every layer's prefill
    (one tensor for all), while KVzip's reconstruction pass, which no press of the run reads, is not run."""
    from spectra.kv import composition, reconstruction

    passes = []
    replay, rebuild = composition.scores, reconstruction.scores
    monkeypatch.setattr(composition, "scores", lambda *args, **kwargs: passes.append("replay") or replay(*args,
                                                                                                         **kwargs))
    monkeypatch.setattr(reconstruction, "scores", lambda *args, **kwargs: passes.append("kvzip") or rebuild(*args,
                                                                                                           **kwargs))
    finished = run(llama_dir, text_file, tmp_path / "run", presses="knorm,kvcompose")
    assert passes == ["replay", "replay"], "one replay pass per sequence, no reconstruction"
    row = finished.table.set_index("press").loc["kvcompose"]
    assert 0.4 < row["kept_share"] < 0.6 and row["nll"] != finished.table["nll"].iloc[0]
