"""analyses/readme.py and readme_numbers.py: every marked paragraph of the documents is closed, named by a renderer
and has the commands it quotes beside it; each renderer writes the numbers of tiny runs (checked against the run's
own CSV files, read with pandas, not through the summaries the renderers use); the script runs a document's
commands, rewrites its numbers, reuses finished runs, and `--check` catches a number edited by hand."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import spectra

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def load_script():
    spec = importlib.util.spec_from_file_location("readme_script", ROOT / "analyses" / "readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


readme = load_script()
numbers = readme.readme_numbers


def quiet(line: str) -> None:
    pass


# ---------------------------------------------------------------- the documents' markup


def marked() -> list:
    return [paragraph for path in DOCUMENTS for paragraph in readme.read_document(path)[0]]


def test_every_marker_is_closed_and_named_by_a_renderer() -> None:
    names = [paragraph.name for paragraph in marked()]
    assert sorted(names) == sorted(numbers.RENDERERS), "one marked paragraph per renderer, and no other"


def test_every_paragraph_has_the_commands_it_quotes_beside_it() -> None:
    for paragraph in marked():
        commands = [arguments[0] for arguments in map(readme.spectra_arguments, paragraph.commands) if arguments]
        for command in set(numbers.RENDERERS[paragraph.name].needs):
            assert commands.count(command) >= numbers.RENDERERS[paragraph.name].needs.count(command), \
                f"'{paragraph.name}' quotes `spectra {command}`, which the code block above it does not show"


def test_the_documents_set_up_what_their_commands_use() -> None:
    """$MODEL, $GGUF and licenses.txt are defined by set-up lines the script can run."""
    setup = readme.setup_lines([block for path in DOCUMENTS for block in readme.read_document(path)[1]])
    assert {"$MODEL", "$GGUF", "licenses.txt"} <= set(setup)
    used = {token for paragraph in marked() for line in paragraph.commands for token in re.findall(r"\$[A-Z]+", line)}
    assert used <= set(setup)


@pytest.mark.parametrize("text, message", [
    ("```\nspectra analyze m\n```\n<!-- numbers: speed-line -->\nx\n", "never closed"),
    ("```\nspectra analyze m\n```\n<!-- numbers: a -->\n<!-- numbers: b -->\n<!-- /numbers -->\n", "inside"),
    ("```\nspectra analyze m\n```\n## Next\n<!-- numbers: a -->\nx\n<!-- /numbers -->\n", "no code block"),
    ("text\n<!-- /numbers -->\n", "closes no"),
    ("```\nspectra analyze m\n```\n<!-- numbers:a-->\nx\n", "a marker reads"),
])
def test_malformed_markers_are_one_line_errors(tmp_path, text, message) -> None:
    path = tmp_path / "README.md"
    path.write_text(text)
    with pytest.raises(readme.ReadmeError, match=message) as raised:
        readme.read_document(path)
    assert "README.md:" in str(raised.value)


# ---------------------------------------------------------------- renderers on tiny runs


def layer_means(path: Path, method: str, table: str = "heads.csv") -> pd.Series:
    """Per budget, the mean over layers of the mean over heads of out_err, straight from the CSV file."""
    frame = pd.read_csv(path / table)
    frame = frame[(frame["method"] == method) & (frame["metric"] == "out_err")]
    return frame.groupby(["budget", "layer"])["mean"].mean().groupby("budget").mean()


@pytest.fixture(scope="module")
def decoder_runs(llama_dir, text_file, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("decoder")
    common = dict(length=24, samples=4, batch_size=2, progress=None, notify=quiet)
    return {"analyze": [spectra.analyze(str(llama_dir), str(text_file), out=root / "a", **common)],
            "approx": [spectra.approx(str(llama_dir), str(text_file), budget=[4, 8],
                                      methods="window,topk,performer-causal", end_to_end=True, out=root / "b", **common)]}


def test_the_decoder_paragraph_quotes_its_runs(decoder_runs) -> None:
    text = numbers.smollm2_decoder(decoder_runs)
    analyzed, approximated = decoder_runs["analyze"][0], decoder_runs["approx"][0]
    e2e = pd.read_csv(approximated.path / "end_to_end.csv")
    assert f"({json.loads((approximated.path / 'run.json').read_text())['samples']} sequences)" in text
    assert f"perplexity is {numbers.sig(e2e['ppl_exact'].iloc[0])};" in text
    topk = e2e[e2e["method"] == "topk"].sort_values("budget")["ppl"]
    assert f"`window` gives " in text and f"`topk` {numbers.sig(topk.iloc[0])} / {numbers.sig(topk.iloc[1])}" in text
    sink = pd.read_csv(analyzed.path / "metrics.csv").groupby("layer")["sink_mean"].mean()
    assert f"ranges from {numbers.sig(sink.min(), 2)} (layer {sink.idxmin()}) to {numbers.sig(sink.max(), 2)}" in text
    keys = pd.read_csv(analyzed.path / "qkv.csv")
    keys = keys[(keys["tensor"] == "k") & (keys["stage"] == "projection")].groupby("layer")["dataset_rank90"].mean()
    assert f"{numbers.span(keys, lambda x: numbers.sig(x, 2))} before RoPE" in text
    load = json.loads((analyzed.path / "run.json").read_text())["timings"]["seconds"]["load"]
    assert f"took {load:.0f} s" in text


def test_the_key_paragraph_quotes_both_conventions(decoder_runs) -> None:
    analyzed = decoder_runs["analyze"][0]
    text = numbers.smollm2_keys({"analyze": [analyzed]})
    keys = pd.read_csv(analyzed.path / "qkv.csv")
    keys = keys[(keys["tensor"] == "k") & (keys["stage"] == "projection")].groupby("layer")
    two = lambda x: numbers.sig(x, 2)  # noqa: E731
    assert f"need {numbers.span(keys['dataset_rank90'].mean(), two)} of their {int(analyzed.qkv['d'].iloc[0])}" in text
    assert f"for 99%, {numbers.span(keys['dataset_rank99'].mean(), two)} against " \
           f"{numbers.span(keys['pca_rank99'].mean(), two)}" in text
    arrays = np.load(analyzed.path / "qkv.npz")
    assert np.all(arrays["tokens"] == analyzed.n * analyzed.meta["samples"]), "packed: n tokens per sequence"
    second, centred = arrays["k_projection_eigenvalues"], arrays["k_projection_pca_eigenvalues"]
    share = (1 - arrays["tokens"][:, None] * centred.sum(-1) / second.sum(-1)).mean(1) * 100
    if (keys["pca_rank90"].mean() > keys["dataset_rank90"].mean()).all():
        assert f"holds {numbers.span(share, lambda x: f'{x:.0f}')}% of the keys' energy" in text
    else:
        assert "not above the uncentred one in every layer" in text
    with pytest.raises(numbers.RenderError, match="no qkv.csv"):
        numbers.smollm2_keys({"analyze": [dataclasses.replace(analyzed, qkv=None)]})


@pytest.fixture(scope="module")
def fitted_run(roberta_dir, text_file, tmp_path_factory):
    return spectra.approx(str(roberta_dir), str(text_file), budget=[4, 8, 12], end_to_end=True, fit_samples=8,
                          fit_steps=5, methods="svd,jl,linformer(kv),pool-mean,linformer-pca(kv),linformer-fit(kv),"
                                                    "fastformer-fit",
                          length=24, samples=4, batch_size=4, out=tmp_path_factory.mktemp("fit") / "f", progress=None,
                          notify=quiet)


def test_the_fitted_paragraph_quotes_its_run(fitted_run) -> None:
    text = numbers.minilm_fitted({"approx": [fitted_run]})
    fit, pool, svd = (layer_means(fitted_run.path, method) for method in ("linformer-fit(kv)", "pool-mean", "svd"))
    assert f"the SVD oracle {' / '.join(f'{x:.2f}' for x in svd)}, `linformer-fit(kv)` " \
           f"{' / '.join(f'{x:.2f}' for x in fit)}" in text
    assert "8 calibration and 4 held-out sequences, 5 Adam steps" in text
    calibration = layer_means(fitted_run.path, "linformer-fit(kv)", "heads_calibration.csv")
    assert f"it reaches {calibration[8]:.2f} at k = 8: the gap of {fit[8] - calibration[8]:+.2f}" in text
    e2e = pd.read_csv(fitted_run.path / "end_to_end.csv").set_index(["method", "budget"])
    assert f"SVD drift {e2e.loc[('svd', 12), 'hidden_rel_err']:.2f}" in text
    random = layer_means(fitted_run.path, "linformer(kv)")
    assert f"`linformer(kv)` {' / '.join(numbers.sig(x, 2) for x in random)}" in text


def test_the_fastformer_paragraph_quotes_its_run(fitted_run) -> None:
    text = numbers.minilm_fastformer({"approx": [fitted_run]})
    fast, fit = (layer_means(fitted_run.path, method) for method in ("fastformer-fit", "linformer-fit(kv)"))
    assert len({round(x, 12) for x in fast.to_numpy()}) == 1, "one fit serves every budget"
    calibration = layer_means(fitted_run.path, "fastformer-fit", "heads_calibration.csv")
    assert f"is {fast[4]:.2f} for `fastformer-fit` ({calibration[4]:.2f} on the calibration" in text
    assert f"against {' / '.join(f'{x:.2f}' for x in fit.to_numpy())} for `linformer-fit(kv)` at k = 4 / 8 / 12" in text
    e2e = pd.read_csv(fitted_run.path / "end_to_end.csv").set_index(["method", "budget"])
    assert f"its drift is {e2e.loc[('fastformer-fit', 4), 'hidden_rel_err']:.2f}" in text
    assert ("buys less than a fitted Linformer projection" in text) == (fast[4] > fit[4])


def test_the_causal_fastformer_paragraph_quotes_its_run(llama_dir, text_file, tmp_path) -> None:
    run = spectra.approx(str(llama_dir), str(text_file), budget=[4, 8], end_to_end=True, fit_samples=4, fit_steps=3,
                         methods="fastformer-fit-causal,window,topk", length=24, samples=6, batch_size=2,
                         out=tmp_path / "f", progress=None, notify=quiet)
    text = numbers.smollm2_fastformer({"approx": [run]})
    e2e = pd.read_csv(run.path / "end_to_end.csv").set_index(["method", "budget"])
    fast = e2e.loc["fastformer-fit-causal", "ppl"]
    assert len({round(x, 9) for x in fast}) == 1, "one fit serves every budget"
    assert "4 calibration and 6 held-out sequences, 3 Adam steps" in text
    assert f"is {numbers.sig(fast.iloc[0])} for `fastformer-fit-causal`" in text
    window, topk = (e2e.loc[method, "ppl"].sort_index() for method in ("window", "topk"))
    assert f"{numbers.sig(window.iloc[0])} / {numbers.sig(window.iloc[1])} for `window`" in text
    assert f"{numbers.sig(topk.iloc[0])} / {numbers.sig(topk.iloc[1])} for `topk` at k = 4 / 8" in text
    assert f"exact attention gives {numbers.sig(e2e['ppl_exact'].iloc[0])}." in text
    assert ("is worse than" in text) == bool(fast.iloc[0] > min(window.max(), topk.max()))
    held_out = layer_means(run.path, "fastformer-fit-causal")
    assert f"held-out output error is {held_out.iloc[0]:.2f} (mean over layers and heads;" in text


def test_the_plan_paragraph_quotes_its_runs(roberta_dir, text_file, tmp_path) -> None:
    from spectra.report.plan import plan_k

    common = dict(length=24, samples=4, batch_size=4, progress=None, notify=quiet)
    analyzed = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "a", **common)
    plan = plan_k(analyzed, 0.9, multiple=4).to_json()
    run = spectra.approx(str(roberta_dir), str(text_file), k_plan=plan, end_to_end=True, fit_samples=8, fit_steps=3,
                         methods="svd,pool-mean,linformer-fit(kv)", out=tmp_path / "b", **common)
    text = numbers.minilm_plan({"analyze": [analyzed], "plan-k": [plan], "approx": [run]})
    e2e = pd.read_csv(run.path / "end_to_end.csv")
    svd = e2e[e2e["method"] == "svd"].set_index("allocation")
    uniform = int(round(np.mean([entry["budget"] for entry in plan["layers"]])))
    assert f"k = {', '.join(str(entry['budget']) for entry in plan['layers'])} against a uniform {uniform};" in text
    assert f"drift from {svd.loc['uniform', 'hidden_rel_err']:.2f} to {svd.loc['plan', 'hidden_rel_err']:.2f}" in text


@pytest.fixture(scope="module")
def scaling_run(roberta_dir, text_file, tmp_path_factory):
    return spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 32, 64], samples=4, batch_size=4,
                           bootstrap=20, approx_target=0.3, out=tmp_path_factory.mktemp("scaling") / "s",
                           progress=None, notify=quiet)


def test_the_scaling_paragraphs_quote_their_run(scaling_run) -> None:
    exponents = pd.read_csv(scaling_run.path / "exponents.csv")
    rank = exponents[(exponents["scope"] == "pooled") & (exponents["metric"] == "rank90")].iloc[0]
    ranks = pd.read_csv(scaling_run.path / "scaling.csv").groupby("n")["rank90"].mean()
    text = numbers.minilm_scaling({"scaling": [scaling_run]})
    assert f"goes {' → '.join(f'{x:.1f}' for x in ranks)}, α = {rank['alpha']:.2f}" in text
    assert "(4 sequences per n, n = 16…64)" in text
    text = numbers.smollm2_scaling({"scaling": [scaling_run]})
    assert f"pooled α = {rank['alpha']:.2f} (" in text and f"{scaling_run.meta['wall_seconds'] / 60:.1f} minutes" in text
    needed = pd.read_csv(scaling_run.path / "k_needed.csv")
    needed = needed[needed["layer"].isna()].sort_values("n")["k_needed"]
    text = numbers.minilm_k_needed({"scaling": [scaling_run]})
    assert f"at most 0.3 is {', '.join('none' if pd.isna(k) else str(int(k)) for k in needed)} for n = 16, 32, 64" in text


def test_the_theorems_paragraph_quotes_its_run(tmp_path) -> None:
    run = spectra.theorems(None, synthetic=True, length=32, d=8, budget=[4, 16, 32], eps=[0.2, 0.5], samples=4,
                           out=tmp_path / "t", progress=None, notify=quiet)
    rows = pd.read_csv(run.path / "theorem1.csv")
    rows = rows[(rows["method"] == "jl") & (rows["relative_to"] == "output")]
    text = numbers.theorems_synthetic({"theorems": [run]})
    assert f"is at most {rows['pr'].max():.3f} for every k up to 32" in text
    bound = rows[(rows["budget"] == 32) & (rows["eps"] == 0.5)]["bound"].iloc[0]
    assert f"at k = 32, ε = 0.5 is {bound:.4f}" in text


def test_a_missing_command_is_a_render_error(decoder_runs) -> None:
    with pytest.raises(numbers.RenderError, match="spectra approx"):
        numbers.render("smollm2-decoder", [(["analyze"], decoder_runs["analyze"][0].path)], Path("."))


# ---------------------------------------------------------------- the script on a document of its own


def in_process(calls: list):
    """Runs `spectra ARGUMENTS` in this process in the work directory (each start of the program costs an import of
    torch); records the calls."""
    from spectra import cli

    def execute(arguments: list[str], cwd: Path) -> int:
        calls.append(arguments)
        previous, argv = Path.cwd(), sys.argv
        os.chdir(cwd)
        sys.argv = ["spectra", *arguments]
        try:
            cli.main()
            return 0
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 1
        finally:
            os.chdir(previous)
            sys.argv = argv

    return execute


def document(tmp_path: Path, model: Path, corpus: Path, setup: str | None = None) -> Path:
    path = tmp_path / "README.md"
    path.write_text(f"# A tool\n\n```\n{setup or f'MODEL={model}'}\ncat {corpus} > corpus.txt\n```\n\nRun it:\n\n"
                    "```\nspectra analyze $MODEL --data corpus.txt --length 16 --samples 2 --batch-size 2\n```\n\n"
                    "<!-- numbers: speed-line -->\nold numbers: 1.0, 2.0\n<!-- /numbers -->\n\nThe end.\n")
    return path


def test_the_script_rewrites_reuses_and_checks(roberta_dir, text_file, tmp_path, capsys) -> None:
    path, work, calls = document(tmp_path, roberta_dir, text_file), tmp_path / "work", []
    arguments = ["--documents", str(path), "--work", str(work)]
    assert readme.main(arguments, in_process(calls)) == 0
    assert calls == [["analyze", str(roberta_dir), "--data", "corpus.txt", "--length", "16", "--samples", "2",
                      "--batch-size", "2", "--overwrite"]]
    run = spectra.load_run(work / "runs" / "tiny-roberta-corpus-n16")
    timings = json.loads((run.path / "run.json").read_text())["timings"]
    total = sum(timings["seconds"].values())
    text = path.read_text()
    assert f"```\ntime {total:.1f} s; " in text and "old numbers" not in text and text.endswith("The end.\n")
    assert "(tiny-roberta, n = 16, 2 sequences," in text
    assert readme.main(arguments, in_process(calls)) == 0 and len(calls) == 1, "a finished run is reused"
    assert readme.main([*arguments, "--check"], in_process(calls)) == 0
    path.write_text(text.replace(f"time {total:.1f} s", f"time {total + 1:.1f} s"))
    capsys.readouterr()
    assert readme.main([*arguments, "--check"], in_process(calls)) == 1
    assert f"-time {total + 1:.1f} s" in capsys.readouterr().err, "the difference is shown"
    assert f"time {total + 1:.1f} s" in path.read_text(), "--check writes nothing"
    assert len(calls) == 1, "--check runs nothing"
    path.write_text(path.read_text().replace("--samples 2", "--samples 4"))
    assert readme.main(arguments, in_process(calls)) == 0 and len(calls) == 2, "a changed command reruns"
    assert "4 sequences" in path.read_text()
    assert readme.main([*arguments, "--rerun"], in_process(calls)) == 0 and len(calls) == 3, "--rerun runs again"


@pytest.mark.parametrize("arguments, setup, message", [
    (["--only", "nothing-here"], None, "--only nothing-here: no marked paragraph of that name"),
    (["--check"], None, "run without --check first"),
    (["--check", "--rerun"], None, "give one of them"),
    ([], 'MODEL=$(python -c "import not_an_installed_package_xyz")', "the set-up line `MODEL=.*` failed"),
])
def test_bad_input_is_one_line_and_exit_code_2(roberta_dir, text_file, tmp_path, capsys, arguments, setup,
                                               message) -> None:
    path, calls = document(tmp_path, roberta_dir, text_file, setup), []
    before = path.read_text()
    code = readme.main(["--documents", str(path), "--work", str(tmp_path / "work"), *arguments], in_process(calls))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and re.search(message, err[-1]) and err[-1].startswith("error: ")
    assert calls == [] and path.read_text() == before


def test_hub_commands_are_skipped(tmp_path, capsys) -> None:
    path = tmp_path / "README.md"
    path.write_text("```\nspectra analyze roberta-base --data imdb --length 512\n```\n\n"
                    "<!-- numbers: speed-line -->\nx\n<!-- /numbers -->\n")
    calls: list = []
    assert readme.main(["--documents", str(path), "--work", str(tmp_path / "work")], in_process(calls)) == 2
    err = capsys.readouterr().err
    assert "skipped (needs the Hugging Face Hub): spectra analyze roberta-base" in err and calls == []
    assert "quotes `spectra analyze`, which its code block does not run" in err


def test_the_heads_paragraph_quotes_its_runs(llama_dir, text_file, tmp_path) -> None:
    common = dict(length=24, samples=2, progress=None, notify=quiet)
    approximated = spectra.approx(str(llama_dir), str(text_file), budget=[4, 8], methods="window,pool-mean",
                                  out=tmp_path / "a", **common)
    diagnosed = spectra.heads(str(llama_dir), str(text_file), approx=approximated.path, out=tmp_path / "h", **common)
    text = numbers.heads_models({"approx": [approximated], "heads": [diagnosed]})
    table = pd.read_csv(diagnosed.path / "diagnosis.csv")
    assert f"({len(table)} heads, n = 24, 2 sequences)" in text
    counts = table["head_type"].value_counts()
    assert ", ".join(f"{count} {kind}" for kind, count in counts.items()) in text
    assert f"moves its layer's output by {numbers.span(table['retrieval'], numbers.two)}" in text
    assert f"P's rank90 spans {numbers.span(table['rank90'], lambda x: numbers.sig(x, 2))}" in text
    rules = pd.read_csv(diagnosed.path / "rules.csv")
    mapped = pd.read_csv(diagnosed.path / "method_map.csv")
    for rule in rules.itertuples(index=False):
        winners = mapped[mapped["budget"] == rule.budget]["winner"].unique()
        if len(winners) == 1:
            assert f"At k = {rule.budget} `{winners[0]}` wins on every head" in text
        elif rule.rule.startswith("→"):
            assert f"no split of the diagnosis beats always `{rule.baseline_winner}`" in text
        else:
            assert f"predicts {rule.held_out_accuracy:.0%} of held-out heads against {rule.baseline:.0%}" in text
    with pytest.raises(numbers.RenderError, match="no `spectra approx` and `spectra heads` pair"):
        numbers.heads_models({"approx": [approximated]})


def test_the_cache_paragraph_quotes_its_run(llama_dir, text_file, tmp_path) -> None:
    run = spectra.cache(str(llama_dir), str(text_file), context=70, continuation=6, samples=2,
                        presses="streaming,knorm,random,think", ratios="0.25,0.5", out=tmp_path / "c", progress=None,
                        notify=quiet)
    text = numbers.smollm2_cache({"cache": [run]})
    table = pd.read_csv(run.path / "cache.csv")
    nll = table.set_index(["press", "ratio"])["nll"]
    assert f"continuation NLL of {nll[('full', 0.0)]:.3f} nats/token" in text and "2 sequences" in text
    assert f"| knorm | {nll[('knorm', 0.25)]:.3f} | {nll[('knorm', 0.5)]:.3f} |" in text
    assert f"| think (key channels) | {nll[('think', 0.25)]:.3f} | {nll[('think', 0.5)]:.3f} |" in text
    evicting = nll[[(press, 0.5) for press in ("streaming", "knorm", "random")]]
    assert f"at r = 0.5 `{evicting.idxmin()[0]}` loses least" in text
    assert f"ThinK at r = 0.5 gives {nll[('think', 0.5)]:.3f}" in text
    lines = readme.fill(text)
    assert any(line.startswith("| press | r = 0.25 | r = 0.5 |") for line in lines), "tables are not rewrapped"


def test_the_spectral_cache_paragraph_quotes_its_run(llama_dir, text_file, tmp_path) -> None:
    run = spectra.cache(str(llama_dir), str(text_file), context=70, continuation=6, samples=2,
                        presses="snapkv,leverage,loki,lowrank,linformer", ratios="0.25,0.5", out=tmp_path / "c",
                        progress=None, notify=quiet)
    text = numbers.smollm2_cache_spectral({"cache": [run]})
    table = pd.read_csv(run.path / "cache.csv").set_index(["press", "ratio"])
    assert f"full cache {table.loc[('full', 0.0), 'nll']:.3f} nats/token; `loki` and `lowrank` fitted on each " \
           "context itself, the oracle)" in text
    for press in ("snapkv", "leverage", "loki", "lowrank"):
        assert f"| {press} | {table.loc[(press, 0.25), 'nll']:.3f} | {table.loc[(press, 0.5), 'nll']:.3f} |" in text
    linformer = table.loc[("linformer", 0.25)]
    saves = f" (saves {linformer['saved']:.2f})" if abs(linformer["saved"] - 0.25) > 0.01 else ""
    assert f"| linformer | {linformer['nll']:.3f}{saves} |" in text
    gap = table.loc[("loki", 0.5), "nll"] - table.loc[("snapkv", 0.5), "nll"]
    assert f"{gap:+.3f} nats at r = 0.25 / 0.5" in text
    assert any(line.startswith("| press | r = 0.25 | r = 0.5 |") for line in readme.fill(text))
