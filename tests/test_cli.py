"""The command line: the success path a user sees, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import run_cli
from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model

from spectra import cli


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_analyze_prints_the_per_layer_table(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["spectra", "analyze", str(roberta_dir), "--data", str(text_file),
                                      "--length", "32", "--samples", "6", "--batch-size", "3"])
    cli.main()
    out = capsys.readouterr().out
    assert "c@8" in out and "rank for 90%" in out
    assert [line for line in out.splitlines() if "runs/tiny-roberta-corpus-n32" in line] == [
        "results in runs/tiny-roberta-corpus-n32"], "where the results are: said once"
    meta = json.loads((workdir / "runs" / "tiny-roberta-corpus-n32" / "run.json").read_text())
    assert meta["samples"] == 6 and meta["status"] == "complete"


@pytest.fixture(scope="module")
def deberta_dir(tmp_path_factory, bert_dir) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny-deberta"
    DebertaV2Model(DebertaV2Config(vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)).save_pretrained(path)
    AutoTokenizer.from_pretrained(bert_dir).save_pretrained(path)
    return path


def bad_inputs(roberta_dir: Path, text_file: Path, deberta_dir: Path, tmp: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "not-a-model").mkdir()
    (tmp / "empty.txt").write_text("\n\n")
    (tmp / "short.txt").write_text("low rank\n")
    (tmp / "reviews.jsonl").write_text('{"body": "a review"}\n')
    (tmp / "exists").mkdir()
    (tmp / "quoted.csv").write_text('text,label\nfine,1\n"never closed,0\nmore,1\n')
    (tmp / "empty.csv").write_text("")
    (tmp / "header.csv").write_text("text,label\n")
    (tmp / "empty.json").write_text(" \n")
    model, corpus = str(roberta_dir), ["--data", str(text_file)]
    return {
        "unknown model": (["no-such-org/no-such-model", *corpus], "could not load model 'no-such-org/no-such-model'"),
        "not a model dir": ([str(tmp / "not-a-model"), *corpus], "has no config.json"),
        "uncapturable": ([str(deberta_dir), *corpus], "'deberta-v2' does not route attention"),
        "missing file": ([model, "--data", str(tmp / "missing.txt"), "--length", "16"], "does not exist"),
        "unknown dataset": ([model, "--data", "imbd", "--length", "16"], "neither a known dataset"),
        "missing column": ([model, "--data", str(tmp / "reviews.jsonl"), "--length", "16"], "no column 'text'; its columns are body"),
        "empty corpus": ([model, "--data", str(tmp / "empty.txt"), "--length", "16"], "no non-empty text"),
        "too short to pack": ([model, "--data", str(tmp / "short.txt"), "--length", "32"], "too short to make one"),
        "length too long": ([model, *corpus, "--length", "100"], "exceeds what tiny-roberta can embed (64"),
        "length too small": ([model, *corpus, "--length", "1"], "--length must be at least 2"),
        "no samples": ([model, *corpus, "--samples", "0"], "--samples must be at least 1"),
        "at outside": ([model, *corpus, "--length", "16", "--at", "17"], "--at must be an index in 1…16"),
        "bad mode": ([model, *corpus, "--mode", "chunk"], "Invalid value for '--mode': 'chunk' is not one of 'pack'"),
        "bad dtype": ([model, *corpus, "--dtype", "float8"], "Invalid value for '--dtype': 'float8' is not one of"),
        "bad spectrum device": ([model, *corpus, "--spectrum-device", "tpu"],
                                "Invalid value for '--spectrum-device': 'tpu' is not one of 'auto', 'cpu', 'same', 'cuda'"),
        "batched route on the cpu": ([model, *corpus, "--length", "16", "--device", "cpu", "--spectrum-device", "cuda"],
                                     "--spectrum-device cuda runs on the model's CUDA device; use --device cuda"),
        "bad spectrum tolerance": ([model, *corpus, "--length", "16", "--spectrum-tolerance", "0"],
                                   "--spectrum-tolerance must be a number in [1e-6, 1)"),
        "no cuda": ([model, *corpus, "--length", "16", "--device", "cuda"], "no CUDA device"),
        "existing out": ([model, *corpus, "--length", "16", "--out", str(tmp / "exists")], "already exists; pass --overwrite"),
        "malformed csv": ([model, "--data", str(tmp / "quoted.csv"), "--length", "16"],
                          "quoted.csv as csv: line 3 opens a quoted field that is never closed"),
        "not a number": ([model, *corpus, "--samples", "many"], "Invalid value for '--samples'"),
        "empty csv": ([model, "--data", str(tmp / "empty.csv"), "--length", "16"], "empty.csv holds no text: it is empty"),
        "header-only csv": ([model, "--data", str(tmp / "header.csv"), "--length", "16"],
                            "header.csv holds no text: it holds a header and no row"),
        "empty json": ([model, "--data", str(tmp / "empty.json"), "--length", "16"], "empty.json holds no text: it is empty"),
    }


CASES = ["unknown model", "not a model dir", "uncapturable", "missing file", "unknown dataset", "missing column",
         "empty corpus", "too short to pack", "length too long", "length too small", "no samples", "at outside",
         "bad mode", "bad dtype", "bad spectrum device", "batched route on the cpu", "bad spectrum tolerance", "no cuda", "existing out", "malformed csv", "not a number",
         "empty csv", "header-only csv", "empty json"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2(case, roberta_dir, text_file, deberta_dir, workdir, monkeypatch, capsys):
    if case == "no cuda" and __import__("torch").cuda.is_available():
        pytest.skip("a CUDA device is present")
    args, message = bad_inputs(roberta_dir, text_file, deberta_dir, workdir)[case]
    before = sorted(p.name for p in workdir.rglob("*"))
    code, out, err = run_cli(["analyze", *args, "--samples" if "--samples" not in args else "--seed", "2"],
                             monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert "Traceback" not in err + out
    assert sorted(p.name for p in workdir.rglob("*")) == before, "nothing may be written"


@pytest.mark.slow  # a fresh interpreter that imports torch and transformers
def test_entry_point_runs_as_a_program(tmp_path, text_file) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "spectra.cli", "analyze", str(tmp_path / "nowhere"), "--data",
                           str(text_file)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: model directory {tmp_path / 'nowhere'} does not exist"
    assert subprocess.run([sys.executable, "-m", "spectra.cli", "--help"], capture_output=True).returncode == 0


def test_help_and_version_start_without_torch() -> None:
    """`spectra --help`, `spectra <command> --help` and `--version` import neither torch nor transformers."""
    probe = ("import sys; from spectra import cli; sys.argv = ['spectra', *sys.argv[1:]]\n"
             "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             "print('HEAVY' if {'torch', 'transformers', 'datasets', 'pandas'} & set(sys.modules) else 'LIGHT')")
    for args in (["--help"], ["analyze", "--help"], ["approx", "--help"], ["cache", "--help"], ["evaluate", "--help"],
                 ["leaderboard", "--help"], ["--version"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip().endswith("LIGHT"), (args, done.stdout[-300:], done.stderr)
    done = subprocess.run([sys.executable, "-m", "spectra", "--version"], capture_output=True, text=True)
    import spectra

    assert done.stdout.strip() == f"spectra {spectra.__version__}" and spectra.__version__[0].isdigit()


def test_help_lists_every_choice() -> None:
    done = subprocess.run([sys.executable, "-m", "spectra", "analyze", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    out = done.stdout
    assert done.returncode == 0
    for choices in ("pack|truncate", "auto|cpu|same", "float32|bfloat16|float16"):
        assert choices in out.replace(" ", ""), choices


def test_bare_spectra_prints_the_usage_and_no_empty_error(monkeypatch, capsys) -> None:
    """`spectra` alone shows the usage and exits 2 (typer's own code for it: no command is a usage error, so a
    script that forgot its command fails), with no "error:" line after it."""
    code, out, err = run_cli([], monkeypatch, capsys)
    assert code == 2 and "Usage:" in out + err and "analyze" in out + err
    assert not any(line.lower().startswith("error") for line in err.splitlines()), err


def test_spectra_tasks_counts_its_examples_in_words() -> None:
    """Issue 41, item 15: `spectra tasks` said "1 examples of 491–491 tokens"."""
    assert cli.fitted_line("passkey", 512, [491]) == "passkey at 512: 1 example of 491 tokens"
    assert cli.fitted_line("vt", 1024, [1010, 1024, 1017]) == "vt at 1024: 3 examples of 1010–1024 tokens"
    assert cli.fitted_line("vt", 1024, [1020, 1020]) == "vt at 1024: 2 examples of 1020 tokens"
