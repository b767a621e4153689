"""analyses/readme.py: every marked paragraph of the documents is closed, named by a renderer, well-formed in its
slots and claims, and has the commands it quotes beside it (a press table lists the presses its command runs); the
script runs a document's commands, fills its slots, reuses finished runs but not stale ones, `--check` catches a
value edited by hand, and a claim that no longer holds fails both."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

import spectra

ROOT = Path(__file__).resolve().parents[2]
#: the templates the script fills (their markup: slots, claims, marked paragraphs)
DOCUMENTS = [ROOT / "templates" / "README.md", *sorted((ROOT / "templates" / "docs").glob("*.md"))]


def load_script():
    spec = importlib.util.spec_from_file_location("readme_script", ROOT / "analyses" / "readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


readme = load_script()
numbers = readme.readme_numbers
slots = readme.slots
runs = sys.modules["readme_runs"]  # imported by the script from beside it


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
        commands = [arguments[0] for arguments in map(runs.spectra_arguments, paragraph.commands) if arguments]
        for command in set(numbers.RENDERERS[paragraph.name].needs):
            assert commands.count(command) >= numbers.RENDERERS[paragraph.name].needs.count(command), \
                f"'{paragraph.name}' quotes `spectra {command}`, which the code block above it does not show"


def test_the_documents_set_up_what_their_commands_use() -> None:
    """$MODEL, $GGUF and licenses.txt are defined by set-up lines the script can run."""
    setup = readme.setup_lines([block for path in DOCUMENTS for block in readme.read_document(path)[1]])
    assert {"$MODEL", "$GGUF", "licenses.txt"} <= set(setup)
    used = {token for paragraph in marked() for line in paragraph.commands for token in re.findall(r"\$[A-Z]+", line)}
    assert used <= set(setup)


def test_every_paragraph_is_well_formed() -> None:
    """Slots closed, claims spelt, no slot inside a code span, and every paragraph quotes at least one value."""
    for paragraph in marked():
        body = "".join(paragraph.path.read_text().splitlines(keepends=True)[paragraph.start + 1:paragraph.end])
        slots.check_markup(body, f"{paragraph.path.name}:{paragraph.start + 1}")
        assert slots.slots(body), f"'{paragraph.name}' quotes no value: it needs no marker"


def table_rows(paragraph) -> list[str]:
    """The presses of the press table inside a marked paragraph (a markdown table whose header starts with
    "press"; header, rule and the full cache's row left out), or [] without one."""
    body = paragraph.path.read_text().splitlines()[paragraph.start + 1:paragraph.end]
    lines = [line for line in body if line.startswith("|")]
    if not lines or lines[0].split("|")[1].strip() != "press":
        return []
    cells = [row.split("|")[1].strip().strip("`").removesuffix(" (key channels)") for row in lines[2:]]
    return [cell for cell in cells if not cell.startswith("full")]


def test_a_press_table_lists_the_presses_its_command_runs() -> None:
    """Issue 33, defect 8: the cache command printed 11 presses while the table beside it showed 7. A block may run
    several cache commands (the task runs and the NLL run beside them): the table lists one command's presses."""
    checked = 0
    for paragraph in marked():
        rows = table_rows(paragraph)
        commands = [arguments for arguments in map(runs.spectra_arguments, paragraph.commands)
                    if arguments and arguments[0] == "cache"]
        if rows and commands:
            presses = [runs.parameters(arguments)["presses"].split(",") for arguments in commands]
            assert rows in presses, f"'{paragraph.name}': the table's presses are not a command's"
            checked += 1
    assert checked >= 1


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
                    "<!-- numbers: speed-line -->\n(<!--{model}-->old<!--/-->, n = <!--{n}-->1<!--/-->, "
                    "<!--{sequences}-->1<!--/--> sequences) ended with:\n\n<!--{timings}-->\n\n```\nold\n```\n\n"
                    "<!--/-->\n<!-- /numbers -->\n\nThe end.\n")
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
    assert f"```\ntime {total:.1f} s; " in text and "old" not in text and text.endswith("The end.\n")
    assert "(<!--{model}-->tiny-roberta<!--/-->, n = <!--{n}-->16<!--/-->, <!--{sequences}-->2<!--/--> sequences)" in text
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
    assert "<!--{sequences}-->4<!--/--> sequences" in path.read_text()
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


def test_a_run_made_before_a_default_changed_is_stale(roberta_dir, text_file, tmp_path, capsys) -> None:
    """The manifest is keyed by the command's text, which stays the same when a default changes (issue 33, defect 8:
    a cache table of 7 presses under a command whose default had become 11): a run whose recorded settings differ
    from what its command means now reruns, and --check refuses it."""
    path, work, calls = document(tmp_path, roberta_dir, text_file), tmp_path / "work", []
    arguments = ["--documents", str(path), "--work", str(work)]
    assert readme.main(arguments, in_process(calls)) == 0 and len(calls) == 1
    meta_path = work / "runs" / "tiny-roberta-corpus-n16" / "run.json"
    meta = json.loads(meta_path.read_text())
    assert runs.stale(calls[0][:-1], meta_path.parent) == []
    meta["settings"]["extra"]["bootstrap"] = 20  # as if the default had been another
    meta_path.write_text(json.dumps(meta))
    assert runs.stale(calls[0][:-1], meta_path.parent) == ["bootstrap=20"]
    capsys.readouterr()
    assert readme.main([*arguments, "--check"], in_process(calls)) == 2 and len(calls) == 1
    assert "recorded bootstrap=20 other than the command now means" in capsys.readouterr().err
    assert readme.main(arguments, in_process(calls)) == 0 and len(calls) == 2, "the stale run reruns"
    assert readme.main([*arguments, "--check"], in_process(calls)) == 0


@pytest.mark.parametrize("typed, recorded, same", [
    ("16,32", [16, 32], True), ("svd", ["svd"], True), ("0.25,0.5", [0.25, 0.5], True), (128, [128], True),
    ("streaming,knorm", ["streaming", "knorm", "snapkv"], False), ("16,32", [16, 64], False),
    ("tova,mixed(runs/axes-smol)", ["tova", "mixed(/tmp/bits/axes-smol)"], True),
    ("mixed(runs/axes-smol)", ["mixed(/tmp/bits/axes-smol-b20)"], False), ("adakv(snapkv)", ["adakv(knorm)"], False),
    ("", [], True),
    # a wrapper's own comma: one press, as the run records it
    ("composed(snapkv,think),finch", ["composed(snapkv,think)", "finch"], True),
    ("prefill_decoding(snapkv,tova)", ["prefill_decoding(snapkv,tova)"], True),
    ("composed(snapkv,think)", ["composed(snapkv", "think)"], False),
])
def test_options_compare_however_they_are_spelt(typed, recorded, same) -> None:
    assert (runs.comparable(typed) == runs.comparable(recorded)) == same
    assert runs.comparable({"a": 1}) is None


@pytest.mark.parametrize("typed, records, recorded, differ", [
    ([], 10, 10, []), (["--samples", "10"], 10, 10, []), (["--samples", "8"], 10, 10, ["samples=10"]),
    ([], None, 10, ["samples=10"]), ([], None, 16, []), ([], 20, 16, []), (["--heads-run", "runs/h"], 10, 10, []),
])
def test_a_task_file_smaller_than_samples_is_read_whole(tmp_path, typed, records, recorded, differ) -> None:
    """A task run records the examples it read: without --samples a 10-example file gives samples=10, which is what
    the command means; a text run (no `records`) without --samples means cache's 16 sequences, and a smaller
    --samples than recorded still differs. --heads-run is a path, recorded resolved."""
    data = {"name": "t.jsonl"} if records is None else {"name": "t.jsonl", "records": records}
    meta = {"data": data, "settings": {"samples": recorded, "extra": {"presses": ["knorm"], "ratios": [0.5],
                                                                      "bytes_kept": [], "heads_run": "/w/runs/h"}}}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    arguments = ["cache", "model", "--data", "t.jsonl", "--presses", "knorm", "--ratios", "0.5", *typed]
    assert runs.stale(arguments, tmp_path) == differ


@pytest.mark.parametrize("typed, differ", [
    ("kvpress-leaderboard-query-aware", []), ("kvpress-leaderboard-query-aware,knorm", ["presses="]),
    ("kvpress:snapkv,kvpress:adakv_snapkv,kvpress:finch,kvpress:chunkkv", []), ("snapkv", ["presses="]),
    ("kvpress-leaderboard-query-aware,headbudget(runs/absent@rank)", []),
    ("kvpress-leaderboard-query-aware,headbudget(runs/other@rank)", ["presses="]),
])
def test_a_preset_compares_as_the_presses_it_expands_to(tmp_path, typed, differ) -> None:
    """A run records --presses expanded (`kvpress-leaderboard-query-aware`: kvpress's second loop's four presses),
    so a command typing the preset is the run's command, and one typing another list is not — also beside a press
    whose argument is a run directory not made yet (a published block's `headbudget(runs/…@rank)`)."""
    recorded = ["kvpress:snapkv", "kvpress:adakv_snapkv", "kvpress:finch", "kvpress:chunkkv"]
    if "headbudget" in typed:  # a press reading a run directory the block makes: the preset still expands
        recorded.append("headbudget(/w/runs/absent@rank)")
    meta = {"data": {"name": "t.jsonl", "records": 4},
            "settings": {"samples": 4, "extra": {"presses": recorded, "ratios": [0.5]}}}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    arguments = ["evaluate", "model", "--data", "t.jsonl", "--presses", typed, "--ratios", "0.5"]
    assert [entry.split("=")[0] + "=" for entry in runs.stale(arguments, tmp_path)] == differ


def test_a_claim_that_fails_fails_the_script(roberta_dir, text_file, tmp_path, capsys, monkeypatch) -> None:
    path, calls = document(tmp_path, roberta_dir, text_file), []
    path.write_text(path.read_text().replace(") ended with:", ") ended with:<!--claim: fast-->"))
    arguments = ["--documents", str(path), "--work", str(tmp_path / "work")]
    original = numbers.RENDERERS["speed-line"]

    def decided(holds: bool):
        return numbers.Renderer(original.needs, lambda runs: slots.Rendered(original.read(runs).values, {"fast": holds}))

    monkeypatch.setitem(numbers.RENDERERS, "speed-line", decided(True))
    assert readme.main(arguments, in_process(calls)) == 0
    monkeypatch.setitem(numbers.RENDERERS, "speed-line", decided(False))
    capsys.readouterr()
    assert readme.main([*arguments, "--check"], in_process(calls)) == 1
    err = capsys.readouterr().err
    assert "README.md:15: the claim 'fast' no longer holds on the runs beside it" in err
    assert "1 claim(s) no longer hold" in err
    assert readme.main(arguments, in_process(calls)) == 1, "rendering fails too"
    assert "<!--claim: fast-->" in path.read_text() and len(calls) == 1


def test_the_uncentred_key_rank_is_not_called_a_variance() -> None:
    """Issue 33, defect 7: the decoder paragraph called `dataset_rank90` (the eigenvalues of Σkᵀk, mean included) the
    rank for "90% of a head's variance", which is `pca_rank90`'s. Every sentence that quotes or names the uncentred
    rank says energy, and the decoder paragraph names the column it quotes."""
    sentences = []
    for path in DOCUMENTS:
        for paragraph in re.split(r"\n\s*\n", path.read_text()):
            sentences += [sentence for sentence in re.split(r"(?<=[.;:])\s", " ".join(paragraph.split()))
                          if "dataset_rank90" in sentence or "<!--{keys_before}-->" in sentence]
    assert any("<!--{keys_before}-->" in sentence and "`dataset_rank90`" in sentence for sentence in sentences)
    for sentence in sentences:
        prose = re.sub(r"<!--.*?-->", "", sentence).replace("not a variance", "")
        assert "variance" not in re.split(r"`pca_rank90`|\bcentred\b", prose)[0], sentence


# ---------------------------------------------------------------- templates and the documents people read


def test_every_document_is_its_templates_render() -> None:
    """Issue 37, item 7: README.md and docs/*.md are the templates' renders, values in place and no markup, so the
    committed files read as clean markdown; the templates hold the markup the script fills."""
    assert len(DOCUMENTS) >= 2
    for template in DOCUMENTS:
        document = readme.rendered_path(template)
        assert document == ROOT / template.relative_to(ROOT / "templates")
        assert document.read_text() == slots.clean(template.read_text()), \
            f"{document.relative_to(ROOT)} is not the render of {template.relative_to(ROOT)}: edit the template " \
            "and run python analyses/readme.py --render"
    for document in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = document.read_text()
        assert not slots.MARKER.search(text) and "<!-- numbers:" not in text.replace("`<!-- numbers: NAME -->`", ""), \
            f"{document.name} holds markup"


def test_render_writes_documents_and_check_catches_a_document_edited_by_hand(tmp_path, capsys) -> None:
    template = tmp_path / "templates" / "docs" / "page.md"
    template.parent.mkdir(parents=True)
    template.write_text("# Page\n\n```\nspectra analyze m\n```\n\n<!-- numbers: speed-line -->\nOn "
                        "<!--{model}-->tiny<!--/--> it is fast.<!--claim: fast-->\n<!-- /numbers -->\n")
    document = tmp_path / "docs" / "page.md"
    document.parent.mkdir()
    assert readme.rendered_path(template) == document
    assert readme.rendered_path(tmp_path / "README.md") is None, "a document outside templates/ renders nowhere"
    assert readme.main(["--documents", str(template), "--render"]) == 0
    assert document.read_text() == "# Page\n\n```\nspectra analyze m\n```\n\nOn tiny it is fast.\n"
    document.write_text(document.read_text().replace("fast", "quick"))
    assert readme.render([template], write=False) == [document]
    assert "-On tiny it is quick." in capsys.readouterr().err
    assert readme.main(["--documents", str(template), "--render", "--check"]) == 2
    assert readme.main(["--documents", str(tmp_path / "none.md"), "--render"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_published_runs_are_read_from_the_repository_and_never_run(chat_decoder, tmp_path, capsys,
                                                                   monkeypatch) -> None:
    """A code block that publishes its runs (`spectra publish … --out results/board`) is rendered from the committed
    folders: --check needs no work directory and runs nothing (the task file's line neither); a published file whose
    sha256 differs, or a published run its command no longer means, is one line and exit code 2, nothing written."""
    import task_files
    from spectra.report.published import publish

    data = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=2))
    run = spectra.evaluate(str(chat_decoder), str(data), presses="knorm", ratios="0.5", out=tmp_path / "board-a",
                           progress=None, notify=quiet)
    repository = tmp_path / "repository"
    folder = publish([run.path], repository / "results" / "board")[0]
    path = tmp_path / "README.md"
    path.write_text(f"```\nMODEL={chat_decoder}\n```\n\n```\nspectra tasks $MODEL --tasks passkey --length 160 "
                    "--samples 2 --out tasks.jsonl\nspectra evaluate $MODEL --data tasks.jsonl --presses knorm "
                    "--ratios 0.5 --out runs/board-a\nspectra publish runs/board-a --out results/board\n```\n\n"
                    "<!-- numbers: board -->\n<!--{rows}-->0<!--/--> rows.\n<!-- /numbers -->\n")
    counted = numbers.Renderer(("evaluate",), lambda runs: slots.Rendered(
        {"rows": str(sum(len(found.examples) for found in runs["evaluate"]))}, {}))
    monkeypatch.setitem(numbers.RENDERERS, "board", counted)
    arguments, calls = ["--documents", str(path), "--work", str(tmp_path / "no-work")], []
    assert readme.main([*arguments, "--check"], in_process(calls), repository) == 1, "the value differs"
    assert readme.main(arguments, in_process(calls), repository) == 0
    assert "<!--{rows}-->4<!--/--> rows." in path.read_text() and len(run.examples) == 4
    assert readme.main([*arguments, "--check"], in_process(calls), repository) == 0
    assert calls == [] and not (tmp_path / "no-work" / "runs").exists(), "nothing ran"
    before = path.read_text()
    table = folder / "task_scores.csv.gz"
    table.write_bytes(table.read_bytes()[:-4])
    capsys.readouterr()
    assert readme.main([*arguments, "--check"], in_process(calls), repository) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {table} has sha256 ") and "publish the run again" in err[-1]
    publish([run.path], repository / "results" / "board")
    path.write_text(before.replace("--ratios 0.5", "--ratios 0.75"))
    assert readme.main(arguments, in_process(calls), repository) == 2
    assert "recorded ratios=[0.5] other than" in capsys.readouterr().err
    assert calls == [] and path.read_text() == before.replace("--ratios 0.5", "--ratios 0.75")
