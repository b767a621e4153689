"""The public analyses end to end: `spectra.analyze` against eager attention + scipy, seeds, dtypes, modes.

(approx and theorems runs are checked against eager attention in tests/probes/.)"""

from __future__ import annotations

import inspect
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
import typer
from transformers import AutoModel, AutoTokenizer

import spectra
from spectra import data
from spectra.errors import SpectraError

QUIET = dict(progress=None, notify=lambda line: None)


def reference(model_dir, text_file, n, samples, mode, at, batch_size=4, seed=0):
    """Mean curve and metric columns from eager attention weights and scipy, sequence by sequence."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file), seed=seed)
    curves, ranks, c_at, erank = [], [], [], []
    for batch in data.batches(tokenizer, corpus, n, mode, samples, batch_size):
        with torch.no_grad():
            attentions = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               output_attentions=True).attentions
        p_all = torch.stack(attentions, dim=1).double().numpy()  # (B, L, H, w, w)
        for b, m in enumerate(batch.attention_mask.sum(1).tolist()):
            sigma = np.stack([[scipy.linalg.svdvals(p[:m, :m]) for p in layer] for layer in p_all[b]])
            cum = np.cumsum(sigma, -1) / sigma.sum(-1, keepdims=True)
            grid = np.stack([[np.interp(np.arange(1, n + 1) / n, np.arange(m + 1) / m, np.r_[0, c]) for c in layer]
                             for layer in cum])
            curves.append(grid)
            ranks.append((cum < 0.9).sum(-1) + 1)
            c_at.append(grid[..., at - 1])
            share = sigma / sigma.sum(-1, keepdims=True)
            erank.append(np.exp(-(share * np.log(np.where(share > 0, share, 1))).sum(-1)))
    return (np.mean(curves, 0), np.std(curves, 0), np.mean(ranks, 0), np.mean(c_at, 0), np.mean(erank, 0),
            len(curves))


@pytest.mark.parametrize("mode", ["pack", "truncate"])
def test_run_matches_eager_and_scipy(mode, roberta_dir, text_file, tmp_path) -> None:
    n, samples = 32, 10
    run = spectra.analyze(str(roberta_dir), str(text_file), length=n, samples=samples, mode=mode, batch_size=4,
                          out=tmp_path / "run", **QUIET)
    cum_mean, cum_std, rank90, c_at, erank, count = reference(roberta_dir, text_file, n, samples, mode, at=8)
    assert run.meta["samples"] == count == samples and run.at == 8 and run.n == n
    assert np.abs(run.cum_mean - cum_mean).max() < 1e-5
    assert np.abs(run.cum_std - cum_std).max() < 1e-4
    table = run.metrics.set_index(["layer", "head"])
    assert np.allclose(table["rank90_mean"].to_numpy().reshape(2, 4), rank90)
    assert np.abs(table["c_at_mean"].to_numpy().reshape(2, 4) - c_at).max() < 1e-5
    assert np.allclose(table["erank_mean"].to_numpy().reshape(2, 4), erank, rtol=1e-4)
    assert (table["sequences"] == samples).all()
    if mode == "truncate":
        assert table["length_mean"].iloc[0] < n, "truncate mode should see documents shorter than n"
    else:
        assert (table["length_mean"] == n).all()


def test_bert_and_python_api_round_trip(bert_dir, text_file, tmp_path) -> None:
    run = spectra.analyze(str(bert_dir), str(text_file), length=20, samples=6, batch_size=3, at=5,
                          out=tmp_path / "bert", **QUIET)
    again = spectra.load_run(tmp_path / "bert")
    assert np.array_equal(again.cum_mean, run.cum_mean)
    assert again.metrics.equals(run.metrics)
    meta = json.loads((tmp_path / "bert" / "run.json").read_text())
    assert meta["model"]["layers"] == 2 and meta["model"]["heads"] == 4
    assert meta["data"]["mode"] == "pack" and meta["settings"]["seed"] == 0 and meta["at"] == 5
    assert {"torch", "transformers"} <= set(meta["versions"])
    tidy = run.curves()
    assert len(tidy) == 2 * 4 * 20 and list(tidy.columns[:3]) == ["layer", "head", "index"]
    assert np.allclose(run.metrics["c_at_mean"], run.cum_mean[..., 4].ravel())


def test_same_seed_same_numbers_other_seed_other_sequences(roberta_dir, text_file, tmp_path) -> None:
    args = dict(length=16, samples=4, **QUIET)
    a = spectra.analyze(str(roberta_dir), str(text_file), seed=3, out=tmp_path / "a", **args)
    b = spectra.analyze(str(roberta_dir), str(text_file), seed=3, out=tmp_path / "b", **args)
    c = spectra.analyze(str(roberta_dir), str(text_file), seed=4, out=tmp_path / "c", **args)
    assert np.array_equal(a.cum_mean, b.cum_mean)
    assert not np.array_equal(a.cum_mean, c.cum_mean)


def test_bfloat16_forward_keeps_float32_spectra(roberta_dir, text_file, tmp_path) -> None:
    args = dict(length=16, samples=4, **QUIET)
    full = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "f32", **args)
    half = spectra.analyze(str(roberta_dir), str(text_file), dtype="bfloat16", out=tmp_path / "bf16", **args)
    assert half.meta["dtype"] == "bfloat16" and half.cum_mean.dtype == np.float64
    assert np.abs(half.cum_mean - full.cum_mean).max() < 0.05
    assert not np.array_equal(half.cum_mean, full.cum_mean)


def test_decoder_run_matches_eager_and_numpy(llama_dir, text_file, tmp_path) -> None:
    """A causal decoder with left padding: curves, ranks, sink mass and entropy against eager attention (with the
    position ids generation uses) and numpy, sequence by sequence; each sequence as it is alone."""
    from references import spectrum_reference

    n, samples = 24, 6
    run = spectra.analyze(str(llama_dir), str(text_file), length=n, samples=samples, batch_size=3, mode="truncate",
                          out=tmp_path / "run", **QUIET)
    assert run.causal and run.meta["model"]["kv_heads"] == 2 and run.meta["model"]["architecture"] == "LlamaForCausalLM"
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model = AutoModel.from_pretrained(llama_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file), seed=0)
    refs = {}
    for batch in data.batches(tokenizer, corpus, n, "truncate", samples, 3):
        assert (batch.attention_mask[:, 0] == 0).any() or batch.attention_mask.all(), "left padding"
        with torch.no_grad():
            positions = (batch.attention_mask.cumsum(-1) - 1).clamp_min(0)
            attentions = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions,
                               output_attentions=True).attentions
        for b, valid in enumerate(batch.attention_mask.bool()):
            for layer, p in enumerate(attentions):
                for head in range(p.shape[1]):
                    block = p[b, head][valid][:, valid].double().numpy()
                    assert np.allclose(np.triu(block, 1), 0), "causal P is lower triangular"
                    refs.setdefault((layer, head), []).append(spectrum_reference(block, run.at, n))
    for (layer, head), values in refs.items():
        row = run.metrics[(run.metrics.layer == layer) & (run.metrics["head"] == head)].iloc[0]
        for name in ("c_at", "rank90", "sink", "entropy", "erank"):
            want = np.mean([metrics[name] for _, metrics in values])
            assert row[f"{name}_mean"] == pytest.approx(want, rel=1e-4, abs=1e-6), (layer, head, name)
        assert np.abs(run.cum_mean[layer, head] - np.mean([grid for grid, _ in values], 0)).max() < 1e-5
    alone = spectra.analyze(str(llama_dir), str(text_file), length=n, samples=samples, batch_size=1, mode="truncate",
                            out=tmp_path / "alone", **QUIET)
    assert np.abs(alone.cum_mean - run.cum_mean).max() < 1e-5, "padding does not change a sequence's numbers"


def test_layer_and_head_selection_measures_only_those(roberta_dir, text_file, tmp_path) -> None:
    args = dict(length=16, samples=4, **QUIET)
    full = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "full", **args)
    part = spectra.analyze(str(roberta_dir), str(text_file), layers="1", heads=[0, 3], bootstrap=4,
                           out=tmp_path / "part", **args)
    assert part.metrics[["layer", "head"]].values.tolist() == [[1, 0], [1, 3]]
    want = full.metrics.set_index(["layer", "head"]).loc[[(1, 0), (1, 3)]].reset_index()
    assert np.allclose(part.metrics["rank90_mean"], want["rank90_mean"])
    assert np.isnan(part.cum_mean[0]).all() and np.allclose(part.cum_mean[1, [0, 3]], full.cum_mean[1, [0, 3]])
    meta = json.loads((tmp_path / "part" / "run.json").read_text())
    assert meta["layers"] == [1] and meta["heads"] == [0, 3] and meta["bootstrap"] == 4
    replicates = np.load(tmp_path / "part" / "bootstrap.npz")["replicates"]
    assert replicates.shape == (4, 2, 4, 2) and np.isfinite(replicates[:, 1, [0, 3]]).all()
    with pytest.raises(SpectraError, match="heads must lie in 0…3"):
        spectra.analyze(str(roberta_dir), str(text_file), heads="2-5", out=tmp_path / "bad", **args)
    with pytest.raises(SpectraError, match="layers 'x' is not a list of layers"):
        spectra.analyze(str(roberta_dir), str(text_file), layers="x", out=tmp_path / "bad", **args)


def test_paths_may_be_pathlib_paths_everywhere(roberta_dir, text_file, tmp_path, monkeypatch) -> None:
    """Every path the API takes may be a pathlib.Path: model, data, out, k_plan, gguf_file, and the run paths of
    load_run and the figures (spectra.analyze(Path(model)) once crashed in checkpoints.inspect)."""
    from spectra import checkpoints
    from spectra.report import plots
    from spectra.report.analyze import plot_run
    from spectra.report.plan import plan_k

    monkeypatch.chdir(tmp_path)
    assert isinstance(roberta_dir, Path) and isinstance(text_file, Path)
    run = spectra.analyze(roberta_dir, text_file, length=16, samples=2, out=tmp_path / "run", **QUIET)
    assert run.meta["settings"]["model"] == str(roberta_dir) and run.meta["settings"]["data"] == str(text_file)
    assert spectra.load_run(tmp_path / "run").metrics.equals(run.metrics)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_k(run, 0.9, multiple=4).to_json()))
    planned = spectra.approx(roberta_dir, text_file, methods=["svd"], k_plan=plan, length=16, samples=2,
                             out=tmp_path / "planned", **QUIET)
    assert planned.plan is not None
    theorems = spectra.theorems(roberta_dir, text_file, budget=[4], eps=[0.5], length=16, samples=2,
                                out=tmp_path / "theorems", **QUIET)
    assert spectra.load_run(theorems.path).meta["kind"] == "theorems"
    sweep = spectra.scaling(roberta_dir, text_file, lengths=[16, 24], samples=2, bootstrap=0, out=tmp_path / "sweep",
                            **QUIET)
    assert sweep.lengths == [16, 24]
    loaded = spectra.load_run(tmp_path / "run")
    assert plot_run(loaded, tmp_path / "views").paths[0].parent == tmp_path / "views"
    assert plots.figure1([loaded], tmp_path / "figure")[0] == tmp_path / "figure.png"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.gguf").write_bytes(b"GGUF")
    # the path handling is under test, not the gguf package (absent in CI): an empty module stands in for it
    monkeypatch.setitem(sys.modules, "gguf", types.ModuleType("gguf"))
    found = checkpoints.inspect(tmp_path / "model", Path("weights.gguf"))
    assert found.gguf_file == "weights.gguf" and found.where == str(tmp_path / "model" / "weights.gguf")


def test_one_value_where_several_are_taken(roberta_dir, text_file, tmp_path) -> None:
    """budget=4, methods="svd", eps=0.5, layers=1, heads=2, lengths=… : one value is a list of one (a single
    name is not split into letters, an int does not raise TypeError)."""
    common = dict(length=16, samples=2, **QUIET)
    run = spectra.approx(roberta_dir, text_file, budget=4, methods="svd", layers=1, end_to_end=True,
                         out=tmp_path / "approx", **common)
    assert run.meta["budget"] == [4] and run.meta["methods"] == ["svd"] and run.meta["layers"] == [1]
    assert set(run.head_stats["method"]) == {"svd"}
    theorems = spectra.theorems(roberta_dir, text_file, budget=4, eps=0.5, out=tmp_path / "theorems", **common)
    assert theorems.meta["budget"] == [4] and theorems.meta["eps"] == [0.5]
    analyzed = spectra.analyze(roberta_dir, text_file, layers=1, heads=2, out=tmp_path / "analyze", **common)
    assert analyzed.metrics[["layer", "head"]].values.tolist() == [[1, 2]]
    with pytest.raises(SpectraError, match="needs at least two different lengths to see growth, got \\[16\\]"):
        spectra.scaling(roberta_dir, text_file, lengths=16, out=tmp_path / "sweep", **QUIET)
    sweep = spectra.scaling(roberta_dir, text_file, lengths="16,24", samples=2, bootstrap=0, approx_target=0.5,
                            methods="svd", budget=4, layers=1, heads=0, out=tmp_path / "sweep", **QUIET)
    assert sweep.meta["methods"] == ["svd"] and set(sweep.table["head"]) == {0} and set(sweep.table["layer"]) == {1}


def test_every_analysis_exports_its_run_class() -> None:
    """Issue 37, item 5: the package's exports derive from the registry: each registered analysis's function and
    its finished run's class (`run_type`, defined by its read side), with no list a new analysis must remember."""
    import importlib

    from spectra.kinds import REGISTRY
    from spectra.runs import FinishedRun

    for kind in REGISTRY.values():
        module = importlib.import_module(f"spectra.report.{kind.name}")
        cls = getattr(spectra, kind.run_type)
        assert cls is getattr(module, kind.run_type) and issubclass(cls, FinishedRun)
        assert kind.run_type in dir(spectra) and kind.name in dir(spectra)
    with pytest.raises(AttributeError):
        spectra.NoSuchRun


def test_every_command_has_its_function() -> None:
    """Issue 37, item 4: `spectra.tasks` is the `spectra tasks` command's function (it raised AttributeError while
    a package of that name stood under spectra/), beside one function per registered analysis; issue 54, item 4:
    `spectra.artifacts` is the `spectra artifacts` command's, with the command's options as keywords."""
    from spectra import api, cli

    assert spectra.tasks is api.tasks and "tasks" in dir(spectra)
    assert spectra.artifacts is api.artifacts and "artifacts" in dir(spectra)
    for name in ("tasks", "artifacts"):  # every option of the command is a keyword of the function, and no more
        command = typer.main.get_command(cli.app).commands[name]
        renamed = {"length": "lengths"} if name == "tasks" else {}  # spectra tasks --length takes several
        options = {renamed.get(parameter.name, parameter.name) for parameter in command.params}
        keywords = set(inspect.signature(getattr(spectra, name)).parameters)
        assert "progress" in keywords and options == keywords - set(api.TALK), name  # beside how the run talks
    assert spectra.evaluate.__name__ == "evaluate" and spectra.cache.__name__ == "cache"
