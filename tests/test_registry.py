"""The registry lists methods and presses from their classes' declarations without importing them, equals what the
files register once imported, refuses a registration its declaration contradicts, and turns user names into labels."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spectra import registry
from spectra.config import Sharing
from spectra.errors import SpectraError
from spectra.kv.passes import held
from spectra.registry import Registry


def test_names_and_facts_are_listed_without_importing_torch() -> None:
    code = ("import sys; from spectra import registry; "
            "print((registry.METHODS.names(), registry.PRESSES.names(), sorted(registry.METHODS.having('causal')))); "
            "print('torch' in sys.modules, 'spectra.methods' in sys.modules, 'spectra.kv.presses' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    assert shown[1] == "False False False", "listing imported a method or press file"
    methods, presses, causal = ast.literal_eval(shown[0])
    assert len(methods) >= 27 and len(presses) >= 19, "a name is missing from the listing"
    assert {"fastformer-fit-causal", "performer-causal", "svd-causal", "topk", "window"} <= set(causal)


def test_the_declarations_are_what_the_files_register() -> None:
    from spectra import methods
    from spectra.kv import presses

    loaded = registry.METHODS.load()
    assert tuple(loaded) == registry.METHODS.names() == tuple(methods.REGISTRY)
    assert registry.METHODS.names()[:4] == ("svd", "svd-causal", "jl", "linformer(none)")
    for label, method in loaded.items():
        facts = registry.METHODS.facts(label)
        assert (facts.get("family", label), bool(facts.get("causal")), bool(facts.get("calibrates"))) == \
            (method.family, method.causal, method.calibrates), label
    assert registry.METHODS.groups("family")["linformer"] == tuple(f"linformer({s.value})" for s in Sharing)
    loaded = registry.PRESSES.load()
    assert tuple(loaded) == registry.PRESSES.names() == tuple(presses.REGISTRY)
    known = ("streaming", "knorm", "snapkv", "tova", "random", "observed", "think", "pca_leverage", "leverage", "loki",
             "lowrank", "linformer", "kivi2", "kivi4", "kivi8", "adakv", "duo", "headbudget", "mixed", "decoding")
    assert [name for name in loaded if name in known] == list(known), "by each file's ORDER, then as written"
    for name, press in loaded.items():  # what the registry read from the source is what the object states, and
        facts = registry.PRESSES.facts(name)  # what that implies: the passes it reads (`kv.passes.held`)
        declared = {key: value for key, value in facts.items() if key in registry.PRESSES.fact_names}
        assert {key: value for key, value in presses.base.facts(press).items() if value} == declared, name
        assert dict(facts) == {**declared, **held(declared)}, name
    assert registry.PRESSES.facts("kivi4") == {"axis": "bits", "ratio_means": "ignored (the bits are in the name)",
                                               "summary": loaded["kivi4"].summary}
    assert "4 bits" in loaded["kivi4"].summary and "2 bits" in registry.PRESSES.facts("kivi2")["summary"]
    assert dict(registry.PRESSES.facts("snapkv")) == {"windowed": True, "scorer": True, "window": 64, "axis": "tokens",
                                                      "summary": "the keys the last 64 queries attend to",
                                                      "peer": "SnapKVPress"}


def test_every_press_states_its_summary_and_its_kvpress_peer_in_its_own_class() -> None:
    """Issue 38: --help lists each press with one line of what it keeps and the kvpress class it equals, read from the
    source: each registered press class writes `peer` in its own body ("" for spectra's own: no class inherits
    another's by forgetting it) and every name has a summary."""
    from spectra.declarations import Package

    folder = Path(registry.__file__).parent / "kv" / "presses"
    classes = [body for module in Package(folder, "spectra.kv.presses").modules.values()
               for body in module.classes.values() if body.registered]
    assert len(classes) >= 30
    assert [body.key for body in classes if "peer" not in body.names] == []
    entries = registry.PRESSES.entries()
    assert [name for name, entry in entries.items() if not entry.facts.get("summary")] == []
    peers = {name: entry.facts.get("peer", "") for name, entry in entries.items()}
    assert {name for name, peer in peers.items() if not peer} == {
        "pca_leverage", "loki", "lowrank", "linformer", "kivi2", "kivi4", "kivi8", "headbudget", "mixed"}
    assert peers["pyramidkv"] == "PyramidKVPress" and peers["decoding"] == "DecodingPress"


def test_a_press_whose_object_contradicts_its_summary_or_peer_is_refused() -> None:
    """The summary and the peer are facts: an instance stating another (a summary computed at run time that drifted
    from the literal --help shows) is refused when it registers."""
    from spectra.kv.presses import base
    from spectra.kv.presses.eviction import SnapKV

    fresh = Registry("press", "spectra.kv.presses", facts=registry.PRESSES.fact_names)
    for field, value in (("summary", "the keys the last 32 queries attend to"), ("peer", "TOVAPress")):
        press = type("Drifted", (SnapKV,), {field: value})()
        with pytest.raises(ValueError, match=f"press 'snapkv' declares .* but is {{'{field}': '{value}'}}"):
            fresh.add("snapkv", press, **base.facts(press))
    fresh.add("snapkv", SnapKV(), **base.facts(SnapKV()))


def test_a_name_with_an_argument_is_its_own_press_not_the_one_it_wraps() -> None:
    """adakv(snapkv) takes snapkv's window but is AdaKVPress, with adakv's summary."""
    facts = registry.PRESSES.facts("adakv(snapkv)")
    assert facts["window"] == 64 and facts["peer"] == "AdaKVPress"
    assert facts["summary"] == registry.PRESSES.facts("adakv")["summary"]
    assert registry.PRESSES.facts("decoding(knorm)")["peer"] == "DecodingPress"
    assert registry.PRESSES.facts("chunk(keydiff)")["peer"] == "ChunkPress"


def test_a_registration_must_match_its_declaration(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "spectra" / "things"
    folder.mkdir(parents=True)
    (folder / "base.py").write_text("class Thing:\n    causal = False\n")
    (folder / "b.py").write_text("from .base import Thing\nORDER = 2\n\n@register\nclass Beta(Thing):\n"
                                 "    name, causal = 'beta', True\n")
    (folder / "a.py").write_text('"""docs"""\nimport os\n\nfrom .base import Thing\n\nORDER = 1\n\n\n@register\n'
                                 'class Alpha(Thing):\n    name = "alpha"\n')
    (folder / "helper.py").write_text("x = 1\n")
    monkeypatch.setattr(registry, "__file__", str(tmp_path / "spectra" / "registry.py"))
    things: Registry[object] = Registry("thing", "spectra.things", facts=("causal",))
    assert things.names() == ("alpha", "beta") and things.having("causal") == {"beta"}
    assert things.entries()["alpha"].module == "spectra.things.a" and things.facts("alpha") == {}
    with pytest.raises(ValueError, match="thing 'beta' declares {'causal': True} but is {'causal': False}"):
        things.add("beta", object(), causal=False)
    things.add("alpha", "A", causal=False)
    assert things["alpha"] == "A"
    with pytest.raises(ValueError, match="registered twice"):
        things.add("alpha", "A")
    with pytest.raises(ValueError, match="'gamma' is registered without a declaration: its class, decorated @register"):
        things.add("gamma", "C")
    with things.extended({"gamma": ("C", {"causal": True})}):
        assert things.names()[-1] == "gamma" and things["gamma"] == "C" and "gamma" in things.having("causal")
    assert "gamma" not in things
    with pytest.raises(KeyError):
        things["delta"]


def test_a_group_fact_left_unstated_is_the_name() -> None:
    """A method whose class states no family is its own group: its object's family, its label, agrees."""
    assert registry.agrees("svd", None, False, "svd") and registry.agrees(False, None, False, "svd")
    assert not registry.agrees("linformer", None, False, "svd") and not registry.agrees(True, None, False, "svd")
    assert registry.agrees(64, 64, True, "snapkv") and not registry.agrees(32, 64, True, "snapkv")


def test_an_imported_registry_lists_what_its_modules_register_in_the_order_of_a_fact(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """Task families: each module registers its objects with their own facts as it loads (no source read); the first
    listing imports every module of the package, and the listing follows the `order` fact whichever module a caller
    imported first."""
    folder = tmp_path / "pkg" / "spectra" / "kinds_of"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    for stem, name, number in (("a", "late", 2), ("b", "early", 0), ("c", "middle", 1)):
        (folder / f"{stem}.py").write_text(f"from spectra.registry import THINGS\nTHINGS.add('{name}', "
                                           f"'{stem}', number={number}, flag={number == 1})\n")
    code = ("import importlib, sys; from spectra import registry; import spectra; "
            f"spectra.__path__.append({str(tmp_path / 'pkg' / 'spectra')!r}); "
            f"registry.__file__ = {str(tmp_path / 'pkg' / 'spectra' / 'registry.py')!r}; "
            "registry.THINGS = registry.Registry('thing', 'spectra.kinds_of', imported=True, order='number'); "
            "importlib.import_module('spectra.kinds_of.a'); "
            "print(registry.THINGS.names(), sorted(registry.THINGS.having('flag')), registry.THINGS['early'])")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.stdout.strip() == "('early', 'middle', 'late') ['middle'] b", shown.stderr


def test_names_expand_to_labels() -> None:
    assert registry.method_labels(["svd", "linformer"]) == ("svd", *(f"linformer({s.value})" for s in Sharing))
    assert registry.method_labels(["linformer(kv)", "svd", " linformer(kv)"]) == ("linformer(kv)", "svd")
    assert registry.method_labels(["nystrom"]) == ("nystrom",), "the iterative variant is a name of its own"
    assert registry.method_labels(["fastformer-fit"]) == ("fastformer-fit",), "the causal variant is a family"
    with pytest.raises(SpectraError, match="unknown method 'fastformer'; valid methods: .*fastformer-fit.*probsparse"):
        registry.method_labels(["fastformer"])
    with pytest.raises(SpectraError, match="unknown method 'lsh'; valid methods: .*linformer-fit.*topk"):
        registry.method_labels(["lsh"])
    with pytest.raises(SpectraError, match="no method given; pass e.g. --methods svd,jl,linformer,pool-mean"):
        registry.method_labels([])
    listed = registry.method_listing().split(", ")
    assert listed[:3] == ["svd", "svd-causal", "jl"] and "linformer(kv)" in listed and len(set(listed)) == len(listed)


def test_press_names_are_checked() -> None:
    assert registry.press_names(["tova", " knorm", "tova"]) == ("tova", "knorm")
    with pytest.raises(SpectraError, match="unknown press 'h2o'; valid presses: streaming, knorm"):
        registry.press_names(["h2o"])
    with pytest.raises(SpectraError, match="no press given; pass e.g. --presses streaming,knorm,snapkv"):
        registry.press_names([])


def test_a_press_that_wraps_another_is_named_with_it() -> None:
    assert registry.press_names(["knorm", "decoding(knorm)", "decoding(tova)", "decoding(knorm)"]) == (
        "knorm", "decoding(knorm)", "decoding(tova)")
    # neither a scorer nor decodable; its default interval, declared once
    assert dict(registry.PRESSES.facts("decoding(knorm)")) == {"decodes": True, "interval": 512, "axis": "tokens",
                                                               "summary": "kept at the ratio's size while decoding",
                                                               "peer": "DecodingPress"}
    decodables = [name for name in registry.PRESSES if registry.PRESSES.facts(name).get("decodable")]
    assert decodables[:3] == ["streaming", "knorm", "tova"]  # and any decodable scorer added since, in listing order
    for name, message in (("decoding", "press 'decoding' takes an argument: decoding\\(<decodable>\\)$"),
                          ("decoding(snapkv)", "decoding wraps a decodable press, and 'snapkv' is not one; "
                                               f"decodables: {', '.join(decodables)}$"),
                          ("decoding(knorm", "unknown press 'decoding\\(knorm'"),
                          ("knorm(tova)", "press 'knorm' takes no argument \\(in 'knorm\\(tova\\)'\\); presses "
                                          "taking one: adakv\\(<scorer>\\), .*decoding\\(<decodable>\\)"),
                          ("adakv(decoding(knorm))", "adakv wraps a scorer press, and 'decoding\\(knorm\\)' is not "
                                                     "one"),
                          ("decoding(adakv(knorm))", "decoding wraps a decodable press, and 'adakv\\(knorm\\)' is "
                                                     "not one")):
        with pytest.raises(SpectraError, match=message):
            registry.press_names([name])
    with pytest.raises(SpectraError, match="valid presses: .*linformer, .*decoding\\(<decodable>\\)"):
        registry.press_names(["h2o"])


def test_a_registered_object_can_be_stood_in_for() -> None:
    from spectra.kv import presses

    original = presses.REGISTRY["knorm"]
    presses.REGISTRY["knorm"] = "recording"
    try:
        assert presses.REGISTRY["knorm"] == "recording"
    finally:
        presses.REGISTRY["knorm"] = original
    with pytest.raises(KeyError, match="no press 'h2o' to replace"):
        presses.REGISTRY["h2o"] = original


def test_a_name_with_an_argument_is_checked_without_torch_and_inherits_its_scorers_facts() -> None:
    code = ("import sys; from spectra import registry; "
            "print(registry.press_names(['adakv(snapkv)', 'knorm', 'adakv(loki)'])); "
            "print(sorted(registry.PRESSES.having('windowed')), sorted(registry.PRESSES.having('calibrates'))); "
            "print('torch' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert shown[0] == "('adakv(snapkv)', 'knorm', 'adakv(loki)')"
    assert shown[1] == ("['adakv(loki)', 'adakv(snapkv)', 'finch', 'headbudget', 'loki', 'pyramidkv', 'snapkv'] "
                        "['adakv(loki)', 'loki', 'lowrank']")
    assert shown[2] == "False", "checking a press's argument imported torch"
    assert registry.applied("adakv( knorm )") == ("adakv", "knorm") and registry.applied("knorm") is None
    several = ("import sys; from spectra import registry; "  # several arguments too, as facts merged without torch
               "print(registry.press_names(['composed(snapkv,think)', 'prefill_decoding(snapkv,knorm)'])); "
               "print(dict(registry.PRESSES.facts('composed(snapkv,think)'))['needs_rope'], "
               "sorted(registry.PRESSES.having('windowed'))); print('torch' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", several], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    assert shown[0] == "('composed(snapkv,think)', 'prefill_decoding(snapkv,knorm)')"
    assert shown[1] == ("True ['composed(snapkv,think)', 'finch', 'headbudget', 'loki', "
                        "'prefill_decoding(snapkv,knorm)', 'pyramidkv', 'snapkv']")
    assert shown[2] == "False", "checking several arguments imported torch"
    assert "adakv(knorm)" in registry.PRESSES and "adakv(think)" not in registry.PRESSES
    assert registry.PRESSES.bare()[-1] == "simlayerkv" and "adakv(<scorer>)" in registry.PRESSES.listing()


@pytest.mark.parametrize("name, message", [
    ("adakv(think)", "press 'adakv(think)': adakv wraps a scorer press, and 'think' is not one; scorers: streaming,"),
    ("adakv(h2o)", "'h2o' is unknown"),
    ("adakv", "press 'adakv' takes an argument: adakv(<scorer>)"),
    ("duo(/no/such/dir)", "DuoAttention pattern /no/such/dir: no such directory"),
    ("h2o(knorm)", "unknown press 'h2o(knorm)'"),
    # issue 55, item 7: 'adakv()' was an unknown press; it needs a scorer, said with an example
    ("adakv()", "press 'adakv()' has no argument: adakv needs a scorer press as its argument, e.g. "
                "adakv(streaming); scorers: streaming, knorm, snapkv,"),
    ("adakv( )", "press 'adakv( )' has no argument: adakv needs a scorer press as its argument"),
    ("decoding()", "decoding needs a decodable press as its argument, e.g. decoding(streaming); decodables: "
                   "streaming, knorm, tova"),
    ("composed()", "composed needs presses as its arguments, e.g. composed(streaming,knorm): "
                   "composed(<press>,<press>,...)"),
    ("duo()", "press 'duo()' has no argument: duo needs an argument: duo(<pattern>)"),
    ("knorm()", "press 'knorm' takes no argument (in 'knorm()'); presses taking one: adakv(<scorer>)"),
    ("h2o()", "unknown press 'h2o()'"),
])
def test_a_bad_argument_is_one_line(name, message) -> None:
    with pytest.raises(SpectraError) as error:
        registry.press_names([name])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_widest_declared_window_is_read_once_for_the_prefill_and_the_cache_kind() -> None:
    """The prefill keeps, and `spectra cache` checks --context against, the widest window a press declares (SnapKV's
    64), one value read from the declarations (no press named by hand)."""
    from spectra.kinds import cache
    from spectra.kv.presses import base

    widest = max(int(registry.PRESSES.facts(name).get("window", 0)) for name in registry.PRESSES)
    assert registry.PRESSES.most("window") == widest == base.WINDOW == cache.WINDOW == 64
    assert registry.PRESSES.most("no-such-fact") == 0


def test_a_refused_argument_is_said_by_what_it_does_not_by_a_fact_name() -> None:
    """Issue 55, item 7: composed's refusal listed its `refuses` facts by name ("none declaring decodes, received,
    reconstructs, composes, calibrates, differentiates"). Each fact has words (`said`), and the refusal says what the
    presses it refuses do and what the one given does; the passes a press reads say their own words (`kv.passes`),
    and every press reading a whole-model pass is refused by the one fact they imply, `whole_model`."""
    said = registry.PRESSES.said
    refused = registry.PRESSES.entries()["composed"].facts["refuses"].split(",")
    assert refused == ["decodes", "received", "whole_model", "calibrates"]
    assert set(refused) <= set(said)
    for argument, fact in (("decoding(knorm)", "decodes"), ("observed", "received"), ("kvzip", "whole_model"),
                           ("kvcompose", "whole_model"), ("lowrank", "calibrates"), ("kvgrad", "whole_model")):
        with pytest.raises(SpectraError) as error:
            registry.press_names([f"composed(snapkv,{argument})"])
        message = str(error.value)
        assert f"composed takes presses named alone, none that {said['decodes']}, {said['received']}," in message
        assert f"and '{argument}' is not one: it {said[fact]}; presses: streaming," in message, message
        flags = [name for name in ("declaring", *refused) if name != "received"]  # "received" is English too
        assert not set(flags) & set(re.findall(r"[a-z_]+", message)) and ", ".join(refused) not in message, message
    with pytest.raises(SpectraError, match="'adakv\\(snapkv\\)' is not one: it is written with an argument; presses:"):
        registry.press_names(["composed(knorm,adakv(snapkv))"])
    with pytest.raises(SpectraError, match="takes a decodable press as argument 2, none that is fitted on calibration "
                                           "text, and 'snapkv' is not one; decodables: streaming, knorm, tova$"):
        registry.press_names(["prefill_decoding(knorm,snapkv)"])


def test_a_wrapper_wraps_a_scorer_written_with_its_argument(tmp_path: Path) -> None:
    """A scorer taking an argument (kvzap(DIR)) is wrapped written with it (adakv(kvzap(DIR)), its facts inherited:
    it reads the hidden states); written alone it is refused saying how to write it."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "zap"
    folder.mkdir()
    save_file({f"layers.{i}.{part}": np.zeros(shape, np.float32) for i in range(2)
               for part, shape in (("weight", (2, 4)), ("bias", (2,)))}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "kvzap", "input_dim": 4, "output_dim": 2,
                                                    "n_modules": 2, "hidden_dim": None}))
    name = f"adakv(kvzap({folder}))"
    assert registry.press_names([name]) == (name,) and registry.PRESSES.facts(name)["hidden"]
    assert registry.PRESSES.facts(name)["peer"] == "AdaKVPress" and not registry.PRESSES.facts(name).get("scorer")
    from spectra.kv import presses

    assert presses.REGISTRY[name].inner.where == str(folder) and presses.REGISTRY[name].reads == ("hidden",)
    with pytest.raises(SpectraError, match="adakv wraps a scorer press, and 'kvzap' is written kvzap\\(<artifact>\\); "
                                           "scorers: streaming, .*, kvzap\\(<artifact>\\)"):
        registry.press_names(["adakv(kvzap)"])
