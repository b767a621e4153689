"""`dms(<scorer>,<threshold>)` against kvpress 0.5.5's DMSPress rule written here in numpy, on random scores: the
pairs (key/value head, position) kvpress masks — its scores buffer cut after L − sliding_window_size tokens, those
below the threshold listed by `torch.where` as (batch, head, token) — are exactly the ones dropped; the window kept;
the bytes per head; the ratio ignored; the refusals; and KVzap's surrogate inside it (checked before the model loads
with kvzap's own, tests/kv/presses/test_kvzap.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, ScorerPress
from spectra.kv.presses.base import row_bytes
from spectra.kv.presses.dms import DMS, SLIDING_WINDOW
from spectra.kv.presses.fields import configured
from spectra.registry import PRESSES, press_names

from .conftest import KV_HEADS, make_prefill
from .test_kvzap import numpy_scores, with_hidden, write_surrogate


class Given(ScorerPress):
    """A scorer returning the scores it is given (H_kv, L)."""

    name = "given"

    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    def score(self, prefill, ratio: float) -> torch.Tensor:
        return torch.from_numpy(self.scores)


def kvpress_masked(scores: np.ndarray, threshold: float, window: int = 128) -> set[tuple[int, int]]:
    """The (head, token) pairs kvpress's DMSPress.forward_hook masks after a prefill of L tokens: with the scores
    buffer longer than the window, its first L − window scores compared with the threshold, every pair below listed."""
    heads, length = scores.shape
    if length <= window:
        return set()
    evictable = scores[:, :length - window]
    return {(head, token) for head in range(heads) for token in range(length - window)
            if evictable[head, token] < threshold}


@pytest.mark.parametrize("length, window", [(300, 128), (100, 128), (300, 16), (129, 128)])
@pytest.mark.parametrize("quantile", [0.1, 0.5, 0.9])
def test_it_drops_exactly_the_pairs_kvpress_masks(length, window, quantile) -> None:
    prefill, _ = make_prefill(length=length, seed=length + window)
    rng = np.random.default_rng(window)
    scores = rng.standard_normal((KV_HEADS, length)) + np.array([[0.0], [1.0]])  # the heads score differently
    threshold = float(np.quantile(scores, quantile))
    press = configured(DMS(Given(scores), threshold), sliding_window_size=window)
    part = press.compress(prefill, 0.5)
    masked = kvpress_masked(scores, threshold, window)
    dropped = {(int(h), int(j)) for h, j in zip(*np.nonzero(~part.kept_mask(length).numpy()))}
    assert dropped == masked
    counts = np.array([length - sum(1 for head, _ in masked if head == h) for h in range(KV_HEADS)])
    np.testing.assert_array_equal(part.counts().numpy(), counts)
    assert part.kept_mask(length)[:, max(0, length - window):].all(), "the last `window` tokens stay in every head"
    np.testing.assert_array_equal(part.memory(prefill).numpy(), counts * row_bytes(prefill))
    assert part.saved == pytest.approx(1 - counts.sum() / (KV_HEADS * length))
    if length == 300 and quantile == 0.5:
        assert counts[0] < counts[1] and part.valid is not None, "each head keeps its own count"


def test_the_ratio_does_not_change_it_and_a_tie_stays() -> None:
    prefill, _ = make_prefill(length=200)
    scores = np.tile(np.arange(200, dtype=np.float64) - 50.0, (KV_HEADS, 1))  # score j − 50 at position j
    press = DMS(Given(scores), 0.0)
    parts = [press.compress(prefill, ratio) for ratio in (0.1, 0.5, 0.9)]
    for part in parts[1:]:
        assert torch.equal(part.kept, parts[0].kept) and part.valid is None
    assert parts[0].kept[0].tolist() == list(range(50, 200)), "a score equal to the threshold is kept (strict <)"
    assert SLIDING_WINDOW == 128 and PRESSES.facts("dms(knorm,1)")["fields"] == {"sliding_window_size": 128}


def test_it_wraps_any_scorer_by_the_registry_and_inherits_its_facts() -> None:
    press = REGISTRY["dms(snapkv,0.01)"]
    assert type(press) is DMS and press.threshold == 0.01 and press.inner is REGISTRY["snapkv"] and press.windowed
    facts = PRESSES.facts("dms(snapkv,0.01)")
    assert facts["peer"] == "DMSPress" and facts["windowed"] and not facts.get("scorer")
    assert facts["ratio_means"].startswith("ignored")
    prefill, _ = make_prefill(length=300)
    keep = ~torch.from_numpy(np.array([[(h, j) in kvpress_masked(
        REGISTRY["snapkv"].score(prefill, 0.5).numpy(), 0.01) for j in range(300)] for h in range(KV_HEADS)]))
    assert torch.equal(press.compress(prefill, 0.5).kept_mask(300), keep)
    assert PRESSES.listing_of("dms") == "dms(<scorer>,<threshold>)"
    with pytest.raises(ValueError, match=r"dms\(<scorer>,<threshold>\)"):
        REGISTRY["dms"].compress(prefill, 0.5)


@pytest.mark.parametrize("name, message", [
    ("dms(think,-6)", "press 'dms(think,-6)': dms wraps a scorer press, and 'think' is not one; scorers: streaming,"),
    ("dms(knorm,abc)", "press 'dms(knorm,abc)': its threshold 'abc' is not a finite number"),
    ("dms(knorm,nan)", "its threshold 'nan' is not a finite number"),
    ("dms(knorm)", "press 'dms(knorm)': dms takes the press it wraps and then one threshold, e.g. dms(knorm,-6)"),
    ("dms(knorm,-6,-7)", "dms takes the press it wraps and then one threshold"),
    ("dms()", "dms needs a scorer press and its threshold: dms(<scorer>,<threshold>), e.g. dms(streaming,"),
    ("dms", "press 'dms' takes an argument: dms(<scorer>,<threshold>)"),
    ("dms(kvzap,-6)", "dms wraps a scorer press, and 'kvzap' is written kvzap(<artifact>)"),
    ("dms(adakv(knorm),-6)", "dms wraps a scorer press, and 'adakv(knorm)' is not one"),
    ("dms(kvzap(/no/such/dir),-6)", "KVzap surrogate /no/such/dir: no such directory"),
])
def test_a_bad_press_or_threshold_is_one_line(name, message) -> None:
    with pytest.raises(SpectraError) as error:
        press_names([name])
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("width", [None, 5])
def test_kvzaps_surrogate_inside_it(tmp_path, width) -> None:
    """dms(kvzap(DIR),t): the surrogate's scores of the hidden states against t, per layer; it reads the hidden
    states (the prefill keeps them for it) and its threshold is written as given."""
    folder, tensors = write_surrogate(tmp_path / "zap", width)
    name = f"dms(kvzap({folder}),-0.5)"
    press = REGISTRY[name]
    assert PRESSES.facts(name)["hidden"] and name in PRESSES.having("hidden") and press.reads == ("hidden",)
    for layer in range(3):
        prefill, hidden = with_hidden(layer, length=200, seed=layer)
        masked = kvpress_masked(numpy_scores(tensors, layer, hidden), -0.5)
        part = press.compress(prefill, 0.5)
        assert {(int(h), int(j)) for h, j in zip(*np.nonzero(~part.kept_mask(200).numpy()))} == masked
        assert 0 < len(masked) < KV_HEADS * 72


def test_both_protocols_run_it_and_record_what_it_kept(llama_dir, text_file, tmp_path, monkeypatch) -> None:
    """`spectra cache` with dms(kvzap(DIR),t) on a tiny Llama, over text and over a task file: the hidden states
    reach the surrogate in both, and its cells at two ratios are the same cache (the threshold decides)."""
    import spectra
    import task_files

    folder, _ = write_surrogate(tmp_path / "zap", 5, layers=2, dim=32)
    name = f"dms(kvzap({folder}),0)"
    settings = dict(presses=name, ratios=[0.25, 0.5], samples=1, progress=None, notify=lambda line: None)
    monkeypatch.setitem(REGISTRY, name, configured(REGISTRY[name], sliding_window_size=8))  # within the tiny context
    text = spectra.cache(str(llama_dir), str(text_file), context=80, continuation=8, out=tmp_path / "text",
                         **settings)
    rows = text.table.set_index(["press", "ratio"])
    assert rows.loc[(name, 0.25), "nll"] == rows.loc[(name, 0.5), "nll"] != rows.loc[("full", 0.0), "nll"]
    assert 8 <= rows.loc[(name, 0.25), "kept"] < 80
    file = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=1))
    chat = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    run = spectra.cache(str(chat), str(file), out=tmp_path / "tasks", **settings)
    cells = run.examples[run.examples["press"] == name].set_index("ratio")
    assert cells.loc[0.25, "bytes_share"] == cells.loc[0.5, "bytes_share"] < 1.0
