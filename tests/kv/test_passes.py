"""The prefill passes, declared once (`kv.passes`): what each press reads is its `reads`, the registry and the engine
loop over the passes, and a pass added to the registry alone is computed for a press reading it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spectra import models
from spectra.kv import passes, prefill
from spectra.kv.passes import PASSES, Pass
from spectra.kv.presses import REGISTRY
from spectra.registry import PRESSES

import tiny

CONTEXT = 20


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu")
    loaded.model.double()
    ids = torch.randint(3, len(loaded.tokenizer), (CONTEXT,), generator=torch.Generator().manual_seed(2))
    return loaded, ids


def test_what_the_presses_read_is_what_each_press_declares() -> None:
    """`read_by`: the passes any named press's class declares in `reads`, in the registry's order; every declared
    pass is one of the registry's, and every pass of the registry is read by some press."""
    for name in PRESSES.bare():
        assert passes.read_by([name]) == tuple(read for read in PASSES if read in REGISTRY[name].reads), name
    assert passes.read_by([]) == ()
    mixed = ["kvgrad", "snapkv", "expected_attention", "observed", "kvcompose", "kvzip"]
    assert passes.read_by(mixed) == ("received", "query_pre", "reconstruction", "composition", "gradient")
    assert passes.read_by(["adakv(observed)", "composed(snapkv,expected_attention)"]) == ("received", "query_pre")
    declared = {read for name in PRESSES.bare() for read in REGISTRY[name].reads}
    assert declared | {"hidden"} == set(PASSES), "hidden: kvzap(DIR), which takes its surrogate"


def test_the_facts_a_pass_implies() -> None:
    """A press holds the name of each pass it reads and `whole_model` where one is a whole-model pass: what the
    default presses leave out and `composed` refuses, in the pass's own words."""
    assert passes.held({"reads": ("gradient",)}) == {"gradient": True, "whole_model": True}
    assert passes.held({"reads": ("received", "query_pre")}) == {"received": True, "query_pre": True}
    assert passes.held({}) == {}
    with pytest.raises(ValueError, match="unknown prefill pass nope"):
        passes.held({"reads": ("nope",)})
    assert PRESSES.having("whole_model") >= {"kvzip", "kvgrad", "kvcompose"}
    assert not PRESSES.having("whole_model") & {"observed", "snapkv", "expected_attention"}
    assert [entry.name for entry in passes.whole_model_passes(PASSES)] == ["reconstruction", "composition",
                                                                           "gradient"]
    assert passes.SAID["whole_model"] == ("runs a whole-model pass of its own (KVzip's reconstruction pass, "
                                          "KVCompose's replay pass, KVgrad's gradient pass)")
    assert [name for name in PASSES if passes.needed([name], "repetition")] == ["reconstruction", "gradient"]


def test_a_layer_pass_on_a_sliding_window_layer_reads_its_window() -> None:
    """The layer passes on one layer against dense formulas: the queries before RoPE from the hooked projection, the
    attention each key received from the causal P — and on a sliding-window layer (`Seen.window`) from the banded P,
    each query seeing its last W keys."""
    q, key = torch.randn(4, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    seen = passes.Seen(q, key, key.clone(), 8 ** -0.5, {"q": torch.randn(5, 32, dtype=torch.float64)}, fused=False)
    found = passes.computed(("received", "query_pre"), seen)
    assert list(found) == ["received", "query_pre"] and found["query_pre"].shape == (4, 5, 8)
    assert torch.equal(found["query_pre"][1], seen.hooked["q"][:, 8:16]), "head h: columns h·d … (h + 1)·d"
    scores = q @ key.repeat_interleave(2, 0).transpose(-1, -2) * 8 ** -0.5
    at = torch.arange(5)
    future = at[None] > at[:, None]
    for window, hidden in ((None, future), (2, future | (at[None] <= at[:, None] - 2))):
        dense = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        received = passes.computed(("received",), dataclasses.replace(seen, window=window))["received"]
        torch.testing.assert_close(received, dense.sum(-2), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(passes.computed(("received",), dataclasses.replace(seen, window=2))["received"],
                              found["received"]), "the window changes what each key received"


def test_a_pass_added_to_the_registry_alone_is_computed_for_a_press_reading_it(llama, monkeypatch) -> None:
    """The engine loops over the registry: a new layer pass — here the attention input under another name, needing
    the input hook — is computed by `prefill.exact` from its entry alone, and a press declaring it reads it."""
    loaded, ids = llama
    monkeypatch.setitem(PASSES, "normed", Pass("normed", "the normed input", "spectra.kv.passes:hidden",
                                               needs=("input",)))
    found = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("normed",))
    want = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("hidden",))
    for part, reference in zip(found, want):
        assert list(part.passes) == ["normed"] and torch.equal(part.read("normed"), reference.read("hidden"))
        with pytest.raises(ValueError, match="lacks 'hidden'"):
            part.read("hidden")
