"""`spectra tasks`: a task file from the model's tokenizer alone; bad input is one line and exit 2, and a length
beyond the model's positions stops before the tokenizer loads."""

from __future__ import annotations

from pathlib import Path

import re

import pytest
import tiny

from spectra.kv.tasks import haystack as haystack_module
from spectra import api
from spectra.kv.tasks.generate import MOST_REPEATS
from spectra.kv.tasks.haystack import NOISE
from spectra.kv.tasks.records import read_records


def test_the_command_writes_a_task_file(chat_decoder: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    essay = tmp_path / "essay.txt"
    essay.write_text(tiny.licence_text(20000))
    out = tmp_path / "tasks.jsonl"
    code, stdout, stderr = tiny.run_cli(["tasks", str(chat_decoder), "--tasks", "passkey,niah_single_2", "--length",
                                         "2048", "--samples", "2", "--out", str(out), "--haystack", str(essay)],
                                        monkeypatch, capsys)
    assert code == 0, stderr
    records = read_records(out)
    assert [(r.task, r.length, r.depth, r.example) for r in records] == [
        ("passkey", 2048, 0.0, 0), ("passkey", 2048, 1.0, 1), ("niah_single_2", 2048, 0.0, 2),
        ("niah_single_2", 2048, 1.0, 3)]
    assert "The grass is green" not in records[2].context  # the file replaces the essays
    assert f"wrote {out} (4 records)" in stdout.replace("\n", "")


def test_a_folder_with_a_config_and_a_tokenizer_but_no_weights_is_enough(chat_decoder: Path, tmp_path: Path) -> None:
    """The command reads the tokenizer and config alone (the help says so): a model's shape without its weights — a
    config written by hand for a model too large to store — makes the same task file."""
    import shutil

    shape = tmp_path / "shape-only"
    shutil.copytree(chat_decoder, shape, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    files = [api.tasks(str(model), tasks="passkey", lengths=[512], samples=1, out=tmp_path / f"{i}.jsonl").path
             for i, model in enumerate((chat_decoder, shape))]
    assert files[0].read_text() == files[1].read_text()


def test_a_haystack_shorter_than_the_contexts_is_said_to_repeat(chat_decoder: Path, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    """A text shorter than the contexts repeats (as RULER repeats its essays): the command says how often and still
    writes the file; one so short it would repeat more than MOST_REPEATS times is refused in one line and nothing is
    written; a haystack the contexts do not exhaust draws no warning."""
    short, out = tmp_path / "short.txt", tmp_path / "t.jsonl"
    sentence = "Grass grows slowly in the shade of old oak trees, and the gardeners water it every morning."
    short.write_text(" ".join([sentence] * 3))  # 51 words: the tiny model's 1024 tokens hold some 160
    argv = ["tasks", str(chat_decoder), "--tasks", "niah_single_1,niah_single_2", "--length", "1024", "--samples",
            "1", "--out", str(out), "--haystack", str(short)]
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 0 and stderr.count("\n") == 1, stderr
    most = int(re.search(r"repeat it up to (\d+) times", stderr).group(1))
    assert stderr.startswith(f"warning: the haystack {short} holds 51 words: the contexts of niah_single_2 repeat it "
                             "up to ") and 2 <= most <= MOST_REPEATS
    assert 3 * (most - 1) < read_records(out)[1].context.count(sentence) <= 3 * most
    short.write_text("Grass grows slowly.")
    out.unlink()
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and not out.exists(), stderr
    assert re.fullmatch(rf"error: the haystack {short} holds 3 words: the contexts of niah_single_2 would repeat it "
                        r"\d+ times, a paragraph repeated as RULER's noise is \(at most 10 repeats are taken\); give "
                        r"a longer text or several files \(--haystack a.txt,b.txt\), or --haystack noise\n", stderr)
    short.write_text(tiny.licence_text(20000))
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 0 and stderr == "", stderr


def test_the_essay_tasks_read_prose_by_default(chat_decoder: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """No --haystack: niah_single_2 hides its needle in the licence texts, niah_single_1 in RULER's noise (as RULER
    does); each record names its haystack and its sha256, and the command says which prose it read."""
    import hashlib

    folder = tmp_path / "common-licenses"
    folder.mkdir()
    (folder / "prose").write_text(tiny.licence_text(20000))
    monkeypatch.setattr(haystack_module, "LICENCES", folder)
    out = tmp_path / "t.jsonl"
    code, stdout, stderr = tiny.run_cli(["tasks", str(chat_decoder), "--tasks", "niah_single_1,niah_single_2",
                                         "--length", "1024", "--samples", "2", "--out", str(out)], monkeypatch, capsys)
    assert code == 0 and stderr == "", stderr
    digest = hashlib.sha256((folder / "prose").read_bytes()).hexdigest()
    records = read_records(out)
    noise, prose = records[:2], records[2:]
    assert all(NOISE in record.context and record.haystack == "noise" for record in noise)
    assert all(NOISE not in record.context and (record.haystack, record.haystack_sha256) == (str(folder), digest)
               for record in prose)
    assert " ".join(tiny.licence_text(20000).split()[:12]) in prose[1].context  # the needle at the end: prose first
    said = " ".join(stdout.split())
    assert f"niah_single_2 hid their needles in {folder} (" in said and f"sha256 {digest[:12]}…)" in said
    code, stdout, stderr = tiny.run_cli(["tasks", str(chat_decoder), "--tasks", "niah_single_2", "--length", "1024",
                                         "--samples", "1", "--out", str(out), "--overwrite", "--haystack", "noise"],
                                        monkeypatch, capsys)
    record, = read_records(out)
    assert code == 0 and NOISE in record.context and record.haystack == "noise", stderr
    assert "niah_single_2 hid their needles in RULER's noise sentence repeated (--haystack noise)" in " ".join(
        stdout.split())


def test_several_haystack_files_comma_separated_or_repeated(chat_decoder: Path, tmp_path: Path, monkeypatch,
                                                            capsys) -> None:
    """--haystack a,b and --haystack a --haystack b read the same text, in that order (the option given twice kept
    only the last file before)."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    text = tiny.licence_text(20000)
    cut = text.index(" ", 300)  # between two words, well within the context
    first.write_text(text[:cut])
    second.write_text(text[cut:])
    base = ["tasks", str(chat_decoder), "--tasks", "niah_single_2", "--length", "1024", "--samples", "2"]
    files = []
    for given in (["--haystack", f"{first},{second}"], ["--haystack", str(first), "--haystack", str(second)]):
        files.append(tmp_path / f"{len(files)}.jsonl")
        code, _, stderr = tiny.run_cli([*base, *given, "--out", str(files[-1])], monkeypatch, capsys)
        assert code == 0, stderr
    assert files[0].read_text() == files[1].read_text()
    record = read_records(files[0])[1]  # the needle at depth 1: the haystack runs from the first file into the second
    assert record.haystack == f"{first},{second}"
    words = text.split()
    assert " ".join(words[:5]) in record.context and " ".join(words[len(text[:cut].split()):][:5]) in record.context


def test_without_the_licence_texts_the_default_is_refused(long_decoder: Path, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """Not Debian: an essay task without --haystack is one line naming both ways out, before the tokenizer loads
    and with nothing written; tasks that read no haystack run as before."""
    import transformers

    monkeypatch.setattr(haystack_module, "LICENCES", tmp_path / "absent")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError("the tokenizer was loaded")))
    out = tmp_path / "t.jsonl"
    code, _, stderr = tiny.run_cli(["tasks", str(long_decoder), "--tasks", "passkey,niah_multikey_1", "--length",
                                    "1024", "--out", str(out)], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and not out.exists(), stderr
    assert stderr == (f"error: niah_multikey_1 hide their needles in prose: by default the licence texts Debian "
                      f"systems ship ({tmp_path / 'absent'}), which this machine lacks; pass --haystack FILE (any local "
                      "text, several comma-separated) or --haystack noise (RULER's noise sentence repeated)\n")


def test_the_api_returns_what_it_wrote(chat_decoder: Path, tmp_path: Path) -> None:
    written = api.tasks(str(chat_decoder), tasks=["vt"], lengths=[2048], samples=1, out=tmp_path / "t.jsonl")
    assert written.positions == 4096 and [f.record for f in written.fitted] == read_records(written.path)


@pytest.mark.parametrize("args, message", [
    (["--tasks", "qa_1"], "unknown task qa_1 in --tasks"),
    (["--length", "4097"], "--length 4097 is beyond the 4096 positions of"),
    (["--length", "two"], "--length takes token counts"),
    (["--samples", "0"], "--samples must be ≥ 1"),
    (["--out", "{tmp}"], "is a directory"),
    (["--out", "{tmp}/t.txt"], "must end in .jsonl"),
    (["--tasks", "niah_single_2", "--haystack", "{tmp}/none.txt"], "the haystack {tmp}/none.txt does not exist"),
    (["--tasks", "niah_single_2", "--haystack", "{tmp}/empty.txt"], "the haystack {tmp}/empty.txt holds no text"),
    (["--tasks", "niah_single_2", "--haystack", "{tmp}/binary.bin"],
     "the haystack {tmp}/binary.bin is binary (a NUL byte at offset 4), not text: give a plain-text file"),
    (["--tasks", "niah_single_2", "--haystack", "{tmp}/latin1.txt"],
     "the haystack {tmp}/latin1.txt is not UTF-8 text (byte 0xe9 at offset 3)"),
    (["--tasks", "niah_single_2", "--haystack", "noise,{tmp}/latin1.txt"],
     "--haystack noise is RULER's noise haystack and takes no files beside it"),
    (["--tasks", "niah_single_2", "--haystack", ""], "--haystack names no file"),
    (["--tasks", "passkey,niah_single_1", "--haystack", "{tmp}/none.txt"],
     "--haystack is read only by niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery, "
     "niah_multiquery_questions, and none of "
     "the tasks asked for (passkey, niah_single_1) is one of them"),
    (["--out", "{tmp}/afile/x.jsonl"], "afile/x.jsonl: {tmp}/afile is not a writable directory; choose another --out"),
    (["--out", "/proc/x.jsonl"], "cannot write /proc/x.jsonl: /proc is not a writable directory"),
    (["--out", "{tmp}/existing.jsonl"], "existing.jsonl already exists; pass --overwrite to replace it or choose "
                                        "another --out"),
])
def test_bad_input_is_one_line_before_the_tokenizer_loads(args: list[str], message: str, long_decoder: Path,
                                                          tmp_path: Path, monkeypatch, capsys) -> None:
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.bin").write_bytes(b"\x89PNG\x00\x00\x00\rIHDR")
    (tmp_path / "latin1.txt").write_bytes("Café au lait.".encode("latin-1"))
    (tmp_path / "existing.jsonl").write_text("")
    message = message.format(tmp=tmp_path)
    base = {"--tasks": "passkey", "--length": "1024", "--out": str(tmp_path / "t.jsonl")}
    given = dict(zip(args[::2], [value.format(tmp=tmp_path) for value in args[1::2]]))
    argv = ["tasks", str(long_decoder)] + [item for key, value in {**base, **given}.items() for item in (key, value)]
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr


def test_models_that_cannot_answer(bert_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    out = str(tmp_path / "t.jsonl")
    code, _, stderr = tiny.run_cli(["tasks", str(bert_dir), "--length", "64", "--out", out], monkeypatch, capsys)
    assert code == 2 and "is not a decoder" in stderr
    code, _, stderr = tiny.run_cli(["tasks", str(tmp_path / "none"), "--length", "64", "--out", out], monkeypatch,
                                   capsys)
    assert code == 2 and "does not exist" in stderr


def test_an_existing_file_is_replaced_only_with_overwrite(chat_decoder: Path, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """As a run directory: an existing --out is kept unless --overwrite; a missing folder is made, as for runs."""
    out = tmp_path / "new" / "folder" / "t.jsonl"
    argv = ["tasks", str(chat_decoder), "--tasks", "vt", "--length", "2048", "--samples", "1", "--out", str(out)]
    assert tiny.run_cli(argv, monkeypatch, capsys)[0] == 0 and len(read_records(out)) == 1
    out.write_text("")
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 2 and "already exists; pass --overwrite" in stderr and out.read_text() == ""
    code, _, stderr = tiny.run_cli(argv + ["--overwrite"], monkeypatch, capsys)
    assert code == 0 and len(read_records(out)) == 1, stderr
    with pytest.raises(Exception, match="already exists; pass overwrite=True"):
        api.tasks(str(chat_decoder), tasks="vt", lengths=[2048], samples=1, out=out)


@pytest.mark.parametrize("option, value", [("--tasks", "passkey,,"), ("--length", "1024,")])
def test_an_empty_item_in_tasks_or_lengths_is_refused(option, value, chat_decoder, tmp_path, monkeypatch,
                                                      capsys) -> None:
    """Issue 41, item 15: both were accepted, the empty item dropped without a word."""
    argv = ["tasks", str(chat_decoder), "--tasks", "passkey", "--length", "1024", "--samples", "1", "--out",
            str(tmp_path / "t.jsonl")]
    argv[argv.index(option) + 1] = value
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 2 and f"{option} '{value}' has an empty item" in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "t.jsonl").exists()
