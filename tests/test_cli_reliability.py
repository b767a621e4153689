"""Nothing lost, nothing silent: interrupts, concurrent runs, resumes, bad models and bad files through the
command line — exit code, exactly one line, no traceback, nothing lost or half-written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tiny import run_cli, write_text

import spectra
from spectra import rundir


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line(code: int, out: str, err: str, expected_code: int = 2) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected_code, (code, err)
    assert len(lines) == 1 and "Traceback" not in out + err, err
    return lines[0]


def snapshot(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- 1. interrupts


@pytest.mark.slow  # the command line three times over 600 sequences, so that Ctrl-C lands mid-run
def test_ctrl_c_checkpoints_exits_130_and_resumes_bitwise(roberta_dir, tmp_path) -> None:
    corpus = write_text(tmp_path / "big.txt", count=3000)
    args = [sys.executable, "-m", "spectra", "analyze", str(roberta_dir), "--data", str(corpus), "--length", "48",
            "--samples", "600", "--batch-size", "2", "--out", str(tmp_path / "run")]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    lock = tmp_path / ".run.lock"
    deadline = time.time() + 120
    while not lock.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # a few batches in
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert child.returncode == 130 and "Traceback" not in out + err, err
    assert lines[0] == "stopping after this batch, with a checkpoint (interrupt again to stop at once)"
    line = lines[-1]
    assert len(lines) == 2 and line.startswith("interrupted after ") and "continue with --resume" in line, line
    done = int(line.split()[2])
    assert 0 < done < 600 and done % 2 == 0, "interrupted between batches"
    assert (tmp_path / "run.partial" / "checkpoint.npz").exists() and not lock.exists()

    resumed = subprocess.run(args + ["--resume"], capture_output=True, text=True, env=env())
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {tmp_path / 'run.partial'} after {done} sequences" in resumed.stderr
    whole = subprocess.run(args[:-1] + [str(tmp_path / "whole")], capture_output=True, text=True, env=env())
    assert whole.returncode == 0, whole.stderr
    a, b = spectra.load_run(tmp_path / "run"), spectra.load_run(tmp_path / "whole")
    assert np.array_equal(a.cum_mean, b.cum_mean) and np.array_equal(a.sigma_std, b.sigma_std)
    assert a.metrics.equals(b.metrics)


def test_ctrl_c_before_the_first_batch_writes_nothing(roberta_dir, text_file, tmp_path) -> None:
    child = subprocess.Popen([sys.executable, "-m", "spectra", "analyze", str(roberta_dir), "--data", str(text_file),
                              "--length", "16", "--out", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env())
    time.sleep(1.5)  # the inputs are checked (without torch); torch and the model are still loading
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert one_line(child.returncode, out, err, 130).startswith("interrupted")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 2, 13. models that cannot be used


@pytest.fixture
def broken_models(roberta_dir, tmp_path) -> dict[str, Path]:
    made = {}
    for name in ("no-tokenizer", "no-weights", "bad-config", "foreign-tokenizer"):
        made[name] = tmp_path / name
        shutil.copytree(roberta_dir, made[name])
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (made["no-tokenizer"] / file).unlink(missing_ok=True)
    (made["no-weights"] / "model.safetensors").unlink()
    (made["bad-config"] / "config.json").write_text('{"model_type": "roberta", ')
    return made


@pytest.mark.parametrize("case, message", [
    ("no-tokenizer", "has no tokenizer files (none of tokenizer.json"),
    ("no-weights", "has a config.json but no weights"),
    ("bad-config", "config.json is not valid JSON"),
])
def test_unusable_model_directories_say_what_is_missing(case, message, broken_models, text_file, workdir,
                                                        monkeypatch, capsys) -> None:
    before = snapshot(workdir)
    line = one_line(*run_cli(["analyze", str(broken_models[case]), "--data", str(text_file), "--samples", "2"],
                             monkeypatch, capsys))
    assert message in line and "not found on the Hub" not in line
    assert snapshot(workdir) == before


def test_a_tokenizer_that_does_not_fit_the_text_is_refused(roberta_dir, workdir, monkeypatch, capsys) -> None:
    greek = workdir / "greek.txt"
    greek.write_text("\n".join("ο γρήγορος καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο" for _ in range(50)))
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(greek), "--samples", "2", "--length", "16"],
                             monkeypatch, capsys))
    assert "maps" in line and "to its unknown token" in line
    assert not (workdir / "runs").exists()


def test_the_unsupported_family_error_lists_every_checked_family(workdir, monkeypatch, capsys, bert_dir) -> None:
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model

    from spectra.models import CHECKED_FAMILIES

    path = workdir / "deberta"
    DebertaV2Model(DebertaV2Config(vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)).save_pretrained(path)
    AutoTokenizer.from_pretrained(bert_dir).save_pretrained(path)
    corpus = write_text(workdir / "c.txt")
    line = one_line(*run_cli(["analyze", str(path), "--data", str(corpus)], monkeypatch, capsys))
    assert f"checked families: {', '.join(CHECKED_FAMILIES)}" in line and len(CHECKED_FAMILIES) >= 7


# ---------------------------------------------------------------- 3, 4. where the run goes


def test_an_unwritable_out_is_refused_before_the_model_loads(roberta_dir, text_file, workdir, monkeypatch,
                                                             capsys) -> None:
    locked = workdir / "locked"
    locked.mkdir()
    monkeypatch.setattr(rundir.os, "access", lambda path, mode: Path(path) != locked)
    loaded = []
    monkeypatch.setattr("spectra.models.load", lambda *a, **k: loaded.append(1))
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", str(locked / "run")],
                             monkeypatch, capsys))
    assert f"{locked} is not a writable directory" in line and not loaded


def test_a_second_run_on_the_same_out_is_refused_naming_the_first(roberta_dir, text_file, workdir, monkeypatch,
                                                                  capsys) -> None:
    with rundir.RunDir(workdir / "run").claimed():
        line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run"],
                                 monkeypatch, capsys))
        assert f"being written by another spectra run (process {os.getpid()})" in line
        line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run",
                                  "--overwrite"], monkeypatch, capsys))
        assert "being written by another spectra run" in line
    assert snapshot(workdir) == []


# ---------------------------------------------------------------- 5, 6, 7. resuming


def analyze(model, corpus, out, **options):
    return spectra.analyze(str(model), str(corpus), out=out, progress=None, notify=lambda line: None,
                           **{"length": 24, "samples": 8, "batch_size": 4, **options})


def test_resume_onto_a_complete_run_with_other_settings_is_refused(roberta_dir, text_file, workdir, monkeypatch,
                                                                   capsys) -> None:
    analyze(roberta_dir, text_file, workdir / "run")
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run", "--resume",
                              "--length", "32", "--samples", "8", "--seed", "5"], monkeypatch, capsys))
    assert "complete run with different length, seed;" in line and "--overwrite" in line, \
        "--at was never passed: its default follows the length, so only the length is named"
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--out", "run", "--resume",
                              "--length", "24", "--samples", "8", "--at", "3"], monkeypatch, capsys))
    assert "complete run with different at;" in line, "an --at given is named"
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run", "--resume",
                              "--length", "24", "--samples", "8", "--batch-size", "2"], monkeypatch, capsys)
    assert code == 0 and "already complete; loading it" in err, "batch size is not part of a run's identity"


def interrupted(model, corpus, out, after: int, **options) -> None:
    class Stop(Exception):
        pass

    def stop(done, total):
        if done >= after:
            raise Stop

    with pytest.raises(Stop):
        spectra.analyze(str(model), str(corpus), out=out, progress=stop, notify=lambda line: None,
                        checkpoint_seconds=0.0, **{"length": 24, "samples": 12, "batch_size": 4, **options})


def test_resume_after_the_data_changed_is_refused(roberta_dir, workdir, monkeypatch, capsys) -> None:
    corpus = write_text(workdir / "corpus.txt", count=200)
    interrupted(roberta_dir, corpus, workdir / "run", 4)
    write_text(corpus, count=200, seed=1)
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(corpus), "--out", "run", "--resume",
                              "--length", "24", "--samples", "12", "--batch-size", "4"], monkeypatch, capsys))
    assert "the data changed since it started" in line and "sha256" in line
    assert (workdir / "run.partial" / "checkpoint.npz").exists(), "nothing is lost"


def test_resume_onto_a_complete_run_of_changed_data_is_refused(roberta_dir, workdir, monkeypatch, capsys) -> None:
    """A finished run records its data's size and SHA-256: --resume on it after the data changed refuses (as for
    an interrupted run) instead of handing back numbers of other data."""
    corpus = write_text(workdir / "corpus.txt", count=200)
    analyze(roberta_dir, corpus, workdir / "run")
    before = (workdir / "run" / "metrics.csv").read_bytes()
    write_text(corpus, count=200, seed=1)
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(corpus), "--out", "run", "--resume",
                              "--length", "24", "--samples", "8", "--batch-size", "4"], monkeypatch, capsys))
    assert line.startswith("error: run is a complete run of other data: its bytes and sha256 differ")
    assert "--overwrite" in line
    assert (workdir / "run" / "metrics.csv").read_bytes() == before
    write_text(corpus, count=200, seed=0)  # the same bytes again: the finished run is simply loaded
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(corpus), "--out", "run", "--resume",
                              "--length", "24", "--samples", "8", "--batch-size", "4"], monkeypatch, capsys)
    assert code == 0 and "already complete; loading it" in err


def test_resume_with_nothing_to_resume_says_so_and_starts(roberta_dir, text_file, workdir, monkeypatch,
                                                          capsys) -> None:
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run", "--resume",
                              "--length", "16", "--samples", "2"], monkeypatch, capsys)
    assert code == 0, err
    assert [line for line in err.splitlines() if "resume" in line] == ["nothing to resume in run; starting a new run"]
    assert spectra.load_run(workdir / "run").meta["samples"] == 2


def test_fit_samples_that_leave_nothing_to_evaluate_are_refused_before_any_work(roberta_dir, workdir, monkeypatch,
                                                                                capsys) -> None:
    """The corpus yields few sequences: --fit-samples taking all of them (or more) is refused naming how many there
    are at this --length and --mode, before any forward pass, and nothing is written."""
    from transformers import AutoTokenizer

    from spectra.sources import ModelSource

    corpus = write_text(workdir / "small.txt", count=12)
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    ids = tokenizer(corpus.read_text().splitlines(), add_special_tokens=False)["input_ids"]
    gives = sum(len(row) + 1 for row in ids) // (32 - 2)  # pack: documents joined by </s>, blocks of n - 2 tokens
    assert 2 <= gives < 40
    monkeypatch.setattr(ModelSource, "run", lambda *args, **kwargs: pytest.fail("a forward pass ran"))
    for fit, only in ((gives + 5, "only "), (gives, "")):
        before = snapshot(workdir)
        line = one_line(*run_cli(["approx", str(roberta_dir), "--data", str(corpus), "--length", "32", "--budget", "4",
                                  "--methods", "linformer-pca(kv)", "--fit-samples", str(fit), "--samples", "4"],
                                 monkeypatch, capsys))
        assert line == (f"error: --fit-samples {fit} leaves no sequence to evaluate: the corpus gives {only}{gives} "
                        f"sequences at --length 32 --mode pack; pass fewer calibration sequences (--fit-samples < "
                        f"{gives}), more text or a smaller --length")
        assert snapshot(workdir) == before


def test_a_k_plan_made_at_another_length_is_refused(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    """A plan's budget hold at the n they were measured at; used at another --length they are refused (not
    rescaled: how the rank a head needs grows with n is what spectra scaling measures, not a proportion)."""
    analyze(roberta_dir, text_file, workdir / "run", length=16)
    code, out, err = run_cli(["plan-k", "run", "--out", "plan.json"], monkeypatch, capsys)
    assert code == 0, err
    before = snapshot(workdir)
    line = one_line(*run_cli(["approx", str(roberta_dir), "--data", str(text_file), "--length", "24", "--samples", "2",
                              "--methods", "svd", "--k-plan", "plan.json"], monkeypatch, capsys))
    assert line == ("error: the k plan plan.json was made at n = 16 but this run has --length 24; make a plan at this "
                    "length: spectra plan-k on an analyze run with --length 24")
    assert snapshot(workdir) == before
    with pytest.raises(spectra.SpectraError, match="was made at n = 16 but this run has length=24"):
        spectra.approx(roberta_dir, text_file, length=24, samples=2, methods="svd", k_plan=workdir / "plan.json")
    code, out, err = run_cli(["approx", str(roberta_dir), "--data", str(text_file), "--length", "16", "--samples", "2",
                              "--methods", "svd", "--k-plan", "plan.json"], monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize("command, default, example", [("approx", "128", "16"), ("theorems", "16,32,64,128,256",
                                                                                   "16,32,64")])
def test_a_default_k_longer_than_the_sequence_names_the_default(command, default, example, roberta_dir, text_file,
                                                                workdir, monkeypatch, capsys) -> None:
    line = one_line(*run_cli([command, str(roberta_dir), "--data", str(text_file), "--length", "64"], monkeypatch,
                             capsys))
    assert line == (f"error: --budget defaults to {default}, more than --length 64; pass --budget ≤ 64, e.g. "
                    f"--budget {example}")
    run = getattr(spectra, command)
    with pytest.raises(spectra.SpectraError) as raised:
        run(roberta_dir, text_file, length=64)
    shown = "(128,)" if command == "approx" else "(16, 32, 64, 128, 256)"
    suggested = "16" if command == "approx" else "(16, 32, 64)"
    assert str(raised.value) == (f"budget defaults to {shown}, more than length=64; pass budget ≤ 64, e.g. "
                                 f"budget={suggested}")
    assert snapshot(workdir) == []


def test_each_front_end_spells_options_its_own_way(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    """The command line reads --overwrite, --resume, --fit-samples N, --budget; Python reads overwrite=True,
    resume=True, fit_samples=N, budget: the same error, rendered by each front end."""
    (workdir / "done").mkdir()
    (workdir / "cut.partial").mkdir()
    model, corpus = str(roberta_dir), ["--data", str(text_file), "--length", "16", "--samples", "2"]
    cases = [  # (command line, Python call, what the command line says, what Python says)
        (["analyze", model, *corpus, "--out", "done"],
         lambda: spectra.analyze(roberta_dir, text_file, length=16, samples=2, out=workdir / "done"),
         "pass --overwrite to replace it or choose another --out", "pass overwrite=True to replace it or choose "
                                                                   "another out"),
        (["analyze", model, *corpus, "--out", "cut"],
         lambda: spectra.analyze(roberta_dir, text_file, length=16, samples=2, out=workdir / "cut"),
         "pass --resume to continue it or --overwrite to start over",
         "pass resume=True to continue it or overwrite=True to start over"),
        (["approx", model, *corpus, "--methods", "linformer-fit(kv)", "--budget", "4"],
         lambda: spectra.approx(roberta_dir, text_file, length=16, samples=2, methods="linformer-fit(kv)", budget=4),
         "pass --fit-samples N with N ≥ 2", "pass fit_samples=N with N ≥ 2"),
        (["approx", model, *corpus, "--budget", "0"],
         lambda: spectra.approx(roberta_dir, text_file, length=16, samples=2, budget=0),
         "pass e.g. --budget 32,64,128", "pass e.g. budget=(32, 64, 128)"),
    ]
    api_spellings = ("overwrite=True", "resume=True", "fit_samples=", "budget=")
    for args, call, cli_says, api_says in cases:
        line = one_line(*run_cli(args, monkeypatch, capsys))
        assert cli_says in line and not any(spelling in line for spelling in api_spellings), line
        with pytest.raises(spectra.SpectraError) as raised:
            call()
        assert api_says in str(raised.value) and " --" not in str(raised.value), str(raised.value)


def test_a_spectra_folder_in_the_current_directory_is_named(workdir) -> None:
    """python -m puts the current directory first on sys.path: from a clone's parent, its folder spectra (no
    __init__.py) becomes an empty namespace package ahead of an editable install's finder. The child process
    below sets up exactly that (a finder like setuptools' editable one, appended after the path finder, mapping
    spectra to this tree) and runs `python -m spectra --version` from there."""
    (workdir / "spectra" / "spectra").mkdir(parents=True)
    (workdir / "spectra" / "pyproject.toml").write_text("")
    tree = Path(spectra.__file__).parent.parent
    bootstrap = (
        "import importlib.machinery, os, runpy, sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in str(f).lower()]\n"
        "class Finder:\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'spectra':\n"
        f"            return importlib.machinery.PathFinder.find_spec(name, [os.path.join({str(tree)!r}, "
        "*name.split('.')[:-1])])\n"
        "sys.meta_path.append(Finder)\n"
        "sys.path.insert(0, '')\n"
        "sys.argv = ['spectra', '--version']\n"
        "runpy.run_module('spectra', run_name='__main__', alter_sys=True)\n")
    clean = {key: value for key, value in env().items() if key != "PYTHONPATH"}
    hidden = subprocess.run([sys.executable, "-c", bootstrap], cwd=workdir, capture_output=True, text=True, env=clean)
    line = one_line(hidden.returncode, hidden.stdout, hidden.stderr)
    assert line == (f"error: the folder {workdir / 'spectra'} hides the installed spectra package (python -m looks in "
                    "the current directory first): run from another directory, or use the spectra command, which is "
                    "not affected")
    (workdir / "elsewhere").mkdir()
    elsewhere = subprocess.run([sys.executable, "-c", bootstrap], cwd=workdir / "elsewhere", capture_output=True,
                               text=True, env=clean)
    assert elsewhere.returncode == 0 and elsewhere.stdout.startswith("spectra "), elsewhere.stderr


def test_resume_with_another_batch_size_gives_the_same_numbers(roberta_dir, text_file, workdir) -> None:
    whole = analyze(roberta_dir, text_file, workdir / "whole", samples=12)
    interrupted(roberta_dir, text_file, workdir / "cut", 4)
    resumed = analyze(roberta_dir, text_file, workdir / "cut", samples=12, batch_size=2, resume=True)
    assert np.allclose(resumed.cum_mean, whole.cum_mean, rtol=0, atol=1e-12)
    numeric = whole.metrics.select_dtypes("number").columns
    assert np.allclose(resumed.metrics[numeric], whole.metrics[numeric], rtol=1e-12, atol=1e-12)
    assert resumed.meta["settings"]["batch_size"] == 2, "run.json keeps the batch size it finished with"


# ---------------------------------------------------------------- 8-11. bad numbers and files


def test_negative_seed_is_one_line(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--seed", "-1"], monkeypatch,
                             capsys))
    assert "--seed must be a non-negative integer" in line


@pytest.mark.parametrize("command", [["plot"], ["figure1"], ["plan-k"], ["compare"]])
def test_a_damaged_curves_file_is_one_line(command, roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    analyze(roberta_dir, text_file, workdir / "run")
    data = (workdir / "run" / "curves.npz").read_bytes()
    (workdir / "run" / "curves.npz").write_bytes(data[: len(data) // 2])
    line = one_line(*run_cli([*command, "run"], monkeypatch, capsys))
    assert line == "error: run/curves.npz is damaged or not written by spectra"


def test_a_huge_batch_size_is_refused_with_a_suggestion(roberta_dir, text_file, workdir, monkeypatch,
                                                        capsys) -> None:
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "64",
                              "--batch-size", "100000000"], monkeypatch, capsys))
    assert "--batch-size 100000000 needs about" in line and "use --batch-size" in line
    suggested = int(line.split("use --batch-size ")[1].split()[0])
    assert 1 <= suggested < 100000000
    assert snapshot(workdir) == []


def test_an_allocation_failure_is_one_line_and_keeps_the_checkpoint(roberta_dir, text_file, workdir,
                                                                    monkeypatch, capsys) -> None:
    from spectra.sources import ModelSource

    interrupted(roberta_dir, text_file, workdir / "run", 4)
    real, calls = ModelSource.run, []

    def run(self, batch, observe):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
        return real(self, batch, observe)

    monkeypatch.setattr(ModelSource, "run", run)
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--out", "run", "--resume",
                              "--length", "24", "--samples", "12", "--batch-size", "4"], monkeypatch, capsys)
    resuming, line = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and resuming == "resuming run.partial after 4 sequences" and "Traceback" not in err
    assert line == ("error: ran out of memory after 8 sequences; the checkpoint after 4 sequences is kept: continue "
                    "with --resume and a smaller --batch-size")
    assert (workdir / "run.partial" / "checkpoint.npz").exists()


def test_a_numeric_text_column_is_refused(roberta_dir, workdir, monkeypatch, capsys) -> None:
    table = workdir / "reviews.jsonl"
    table.write_text("".join(json.dumps({"score": i, "body": f"review number {i}"}) + "\n" for i in range(20)))
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(table), "--length", "16", "--text-column", "score"],
                             monkeypatch, capsys))
    assert "column 'score'" in line and "holds numbers, not text" in line and "body" in line


def test_text_column_on_a_txt_file_is_refused(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--text-column", "body"],
                             monkeypatch, capsys))
    assert "--text-column applies to .jsonl/.csv/.parquet files only" in line


# ---------------------------------------------------------------- 12. pipes


@pytest.mark.slow  # two fresh interpreters that import the whole stack
def test_output_piped_to_head_writes_the_files_and_exits_0(roberta_dir, text_file, tmp_path) -> None:
    analyze(roberta_dir, text_file, tmp_path / "run")
    for args, written in ((["plan-k", "run", "--out", "p.json"], "p.json"), (["compare", "run", "--csv", "c.csv"],
                                                                             "c.csv")):
        # with pipefail the pipeline's status is spectra's own (head's is 0 anyway)
        done = subprocess.run(f"set -o pipefail; {sys.executable} -m spectra {' '.join(args)} | head -1", shell=True,
                              cwd=tmp_path, capture_output=True, text=True, executable="/bin/bash",
                              env={**env(), "COLUMNS": "60"})
        assert done.returncode == 0 and "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
        assert (tmp_path / written).stat().st_size > 0


# ---------------------------------------------------------------- smaller things


def test_a_saved_run_refuses_options_it_cannot_honour(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    spectra.approx(str(roberta_dir), str(text_file), budget=[4], methods=["svd"], length=16, samples=2,
                   out=workdir / "approx", progress=None, notify=lambda line: None)
    line = one_line(*run_cli(["approx", "approx", "--budget", "8"], monkeypatch, capsys))
    assert "approx is a saved run: --budget cannot change it (only --plot applies)" in line
    code, out, _ = run_cli(["approx", "approx"], monkeypatch, capsys)
    assert code == 0 and "k = 4: relative head-output error" in out


def test_a_generic_model_folder_names_runs_after_its_config_and_never_collides(roberta_dir, text_file, workdir,
                                                                               monkeypatch, capsys) -> None:
    for owner in ("first", "second"):
        shutil.copytree(roberta_dir, workdir / owner / "model")
        code, out, err = run_cli(["analyze", str(workdir / owner / "model"), "--data", str(text_file), "--length",
                                  "16", "--samples", "1"], monkeypatch, capsys)
        assert code == 0, err
    assert sorted(path.name for path in (workdir / "runs").iterdir()) == ["roberta-first-corpus-n16",
                                                                          "roberta-second-corpus-n16"]
    assert "1 sequence," in out and "1 sequences" not in out


# ---------------------------------------------------------------- every command that writes: an unwritable --out


def _writers(roberta: Path, llama: Path, corpus: Path, run: Path) -> dict[str, list[str]]:
    """Every command that writes, with the option naming where (the place is appended)."""
    data = ["--data", str(corpus), "--samples", "2"]
    return {
        "analyze": ["analyze", str(roberta), *data, "--length", "16", "--out"],
        "approx": ["approx", str(roberta), *data, "--length", "16", "--budget", "4", "--out"],
        "theorems": ["theorems", str(roberta), *data, "--length", "16", "--budget", "4", "--out"],
        "theorems --synthetic": ["theorems", "--synthetic", "--length", "16", "--samples", "2", "--budget", "4",
                                 "--out"],
        "scaling": ["scaling", str(roberta), *data, "--lengths", "8,16", "--out"],
        "cache": ["cache", str(llama), *data, "--context", "80", "--continuation", "8", "--presses", "streaming",
                  "--out"],
        "heads": ["heads", str(roberta), *data, "--length", "16", "--out"],
        "plot": ["plot", str(run), "--out"],
        "figure1": ["figure1", str(run), "--out"],
        "plan-k": ["plan-k", str(run), "--out"],
        "compare": ["compare", str(run), "--csv"],
    }


@pytest.fixture(scope="module")
def finished_run(roberta_dir, text_file, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("finished") / "run"
    analyze(roberta_dir, text_file, path)
    return path


def _unwritable(kind: str, workdir: Path) -> Path:
    if kind == "under a file":
        (workdir / "plain").write_text("a file, not a directory\n")
        return workdir / "plain" / "out"
    if kind == "read-only directory":
        (workdir / "readonly").mkdir()
        (workdir / "readonly").chmod(0o555)
        return workdir / "readonly" / "out"
    place = Path("/" + kind.split()[0]) / "spectra_out"
    if not place.parent.is_dir():
        pytest.skip(f"no {place.parent} here")
    return place


@pytest.mark.parametrize("place", ["proc filesystem", "sys filesystem", "under a file", "read-only directory"])
@pytest.mark.parametrize("command", ["analyze", "approx", "theorems", "theorems --synthetic", "scaling", "cache",
                                     "heads", "plot", "figure1", "plan-k", "compare"])
def test_every_writing_command_refuses_an_unwritable_out_before_any_work(command, place, roberta_dir, llama_dir,
                                                                         text_file, finished_run, workdir,
                                                                         monkeypatch, capsys) -> None:
    """/proc, /sys, a path under a regular file, a read-only directory: one line naming the place and the option,
    exit 2, before any model loads or anything is drawn, and nothing written (no lock file beside it either)."""
    target = _unwritable(place, workdir)
    if place == "read-only directory" and os.geteuid() == 0:  # root writes anyway: the permission answers no
        monkeypatch.setattr(rundir.os, "access", lambda path, mode: Path(path) != target.parent)
    before = snapshot(workdir)

    def work(*args, **kwargs):
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr("spectra.models.load", work)
    monkeypatch.setattr("spectra.sources.SyntheticSource.__init__", work)
    monkeypatch.setattr("spectra.report.plots.style.save", work)
    args = _writers(roberta_dir, llama_dir, text_file, finished_run)[command]
    line = one_line(*run_cli([*args, str(target)], monkeypatch, capsys))
    flag = "--csv" if command == "compare" else "--out"
    assert line.startswith(f"error: cannot write {target}: ") and line.endswith(f"choose another {flag}"), line
    assert snapshot(workdir) == before
    if place == "read-only directory":
        (workdir / "readonly").chmod(0o755)


# ---------------------------------------------------------------- a damaged run under --resume


def _contents(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("damaged", ["run.partial/run.json", "run.partial/checkpoint.npz", "run/run.json"])
def test_resume_on_a_damaged_run_says_what_is_damaged_and_how_to_start_afresh(damaged, roberta_dir, text_file,
                                                                                workdir, monkeypatch,
                                                                                capsys) -> None:
    """A truncated run.json or checkpoint (a full disk, a killed copy): --resume names the damaged file, says
    --overwrite starts afresh, exit 2, before the model loads, and leaves every byte as it was; --overwrite then
    does start afresh."""
    if damaged.startswith("run.partial"):
        interrupted(roberta_dir, text_file, workdir / "run", 4)
    else:
        analyze(roberta_dir, text_file, workdir / "run", samples=12)
    path = workdir / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = _contents(workdir)
    args = ["analyze", str(roberta_dir), "--data", str(text_file), "--out", "run", "--length", "24", "--samples",
            "12", "--batch-size", "4"]
    with monkeypatch.context() as patched:
        patched.setattr("spectra.models.load", lambda *a, **k: pytest.fail("the model loaded"))
        line = one_line(*run_cli([*args, "--resume"], monkeypatch, capsys))
    assert f"{path.relative_to(workdir)} is damaged" in line, line
    assert "pass --overwrite to start afresh" in line, line
    assert _contents(workdir) == before, "nothing is changed"
    code, out, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert spectra.load_run(workdir / "run").meta["samples"] == 12 and not (workdir / "run.partial").exists()


def test_resume_onto_a_folder_that_is_no_run_keeps_it(roberta_dir, text_file, workdir, monkeypatch, capsys) -> None:
    """--resume at a folder holding files but no run.json would otherwise run afresh and replace the folder."""
    (workdir / "notes").mkdir()
    (workdir / "notes" / "todo.txt").write_text("mine\n")
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--samples",
                              "2", "--out", "notes", "--resume"], monkeypatch, capsys))
    assert "notes exists but holds no run.json" in line and "choose another --out" in line
    assert (workdir / "notes" / "todo.txt").read_text() == "mine\n" and snapshot(workdir) == ["notes", "notes/todo.txt"]


# ---------------------------------------------------------------- options that contradict each other


@pytest.mark.parametrize("args, message", [
    (["--resume", "--overwrite"], "--resume continues the run at --out and --overwrite replaces it: pass only one"),
    (["--synthetic"], "--synthetic draws Gaussian q, k, v and reads no model or corpus, but MODEL was given"),
])
def test_contradicting_options_are_refused(args, message, roberta_dir, text_file, workdir, monkeypatch,
                                           capsys) -> None:
    command = "theorems" if "--synthetic" in args else "analyze"
    line = one_line(*run_cli([command, str(roberta_dir), "--length", "16", "--samples", "2", "--budget" if
                              command == "theorems" else "--seed", "4", *args], monkeypatch, capsys))
    assert message in line, line
    assert snapshot(workdir) == []


def test_resume_of_an_interrupted_run_at_another_length_names_the_length_only(roberta_dir, text_file, workdir,
                                                                             monkeypatch, capsys) -> None:
    """--at defaults to n/4, so another --length changes it too; a refusal names only what was typed differently."""
    interrupted(roberta_dir, text_file, workdir / "run", 4)
    line = one_line(*run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--out", "run", "--resume",
                              "--length", "32", "--samples", "12", "--batch-size", "4"], monkeypatch, capsys))
    assert "it was started with different length;" in line, line
