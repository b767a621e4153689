"""The README and docs/*.md show real commands: every `spectra …` line in a code block (backslash continuations
joined, `torchrun … -m spectra …` and `python -m spectra …` included) parses against the real command line
without running it, and every `spectra <command> --option` written inline names a real command and options."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from spectra import cli

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: what a shell variable ($MODEL, $GGUF, $(…)) stands for when a command is parsed
PLACEHOLDER = "/models/placeholder"


def fenced_lines(text: str) -> list[str]:
    """The lines of the non-Python code blocks, backslash continuations joined."""
    lines, inside, language, pending = [], False, "", ""
    for line in text.splitlines():
        if line.startswith("```"):
            inside, language = not inside, line[3:].strip()
            continue
        if not inside or language in ("python", "py"):
            continue
        pending += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            lines.append(pending)
            pending = ""
    return lines


def spectra_arguments(line: str) -> list[str] | None:
    """The arguments after `spectra` in a shell line (a comment dropped, variables replaced), else None."""
    try:
        tokens = shlex.split(re.sub(r"\$\([^)]*\)|\$\{?\w+\}?", PLACEHOLDER, line), comments=True)
    except ValueError:
        return None
    if tokens[:1] == ["spectra"]:
        return tokens[1:]
    for start in range(len(tokens) - 1):  # torchrun … -m spectra …, python -m spectra …
        if tokens[start] == "-m" and tokens[start + 1] == "spectra" and tokens[0] in ("torchrun", "python", "python3"):
            return tokens[start + 2:]
    return None


def commands(path: Path) -> list[list[str]]:
    found = [spectra_arguments(line) for line in fenced_lines(path.read_text())]
    return [arguments for arguments in found if arguments is not None]


def parse(arguments: list[str]) -> None:
    """Parse `spectra ARGUMENTS` as the command line would, without running anything: an unknown command or
    option, a missing argument or a value of the wrong type raises click's UsageError."""
    placeholders = [token for token in arguments if "…" in token or token == "..."]
    if placeholders:
        raise AssertionError(f"a placeholder ({placeholders[0]}) instead of a real value")
    group = typer.main.get_command(cli.app)
    if not arguments or arguments[0].startswith("-"):
        group.make_context("spectra", list(arguments))  # spectra --help: exits after printing, which is fine
        return
    name, rest = arguments[0], list(arguments[1:])
    context = group.make_context("spectra", [name])
    command = group.get_command(context, name)
    if command is None:
        raise AssertionError(f"no command '{name}'")
    command.make_context(name, rest, parent=context)


def test_every_documented_command_parses() -> None:
    seen = 0
    for path in DOCUMENTS:
        for arguments in commands(path):
            try:
                parse(arguments)
            except typer.Exit:
                pass
            except Exception as error:  # noqa: BLE001 - the message names the line
                pytest.fail(f"{path.name}: spectra {shlex.join(arguments)}: {error}")
            seen += 1
    assert seen >= 20, "the README's commands were found"


def test_inline_commands_name_real_options() -> None:
    """`spectra approx … --k-plan plan.json` in prose: the command exists and has every option named."""
    group = typer.main.get_command(cli.app)
    for path in DOCUMENTS:
        for span in re.findall(r"`(spectra [^`]+)`", path.read_text()):
            tokens = span.split()
            if tokens[1].startswith("-"):
                continue  # spectra --help
            command = group.commands.get(tokens[1])
            assert command is not None, f"{path.name}: `{span}` names no command"
            known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help"}
            unknown = [token for token in tokens[2:] if token.startswith("--") and token not in known]
            assert not unknown, f"{path.name}: `{span}`: {command.name} has no {', '.join(unknown)}"


def test_the_check_fails_on_an_unknown_option_or_a_placeholder(tmp_path) -> None:
    """The test above cannot pass vacuously: a README line with an option the command lacks, or with a
    placeholder in brackets, fails to parse."""
    bad = tmp_path / "README.md"
    bad.write_text("```\nspectra analyze $MODEL --data licenses.txt \\\n    --lenght 128\n"
                   "torchrun --nproc-per-node 2 -m spectra approx m --budget 8 --bogus\n"
                   "spectra plan-k runs/x --energy 0.9 [--per-head]\n"
                   "torchrun --nnodes 2 -m spectra analyze …\n```\n")
    found = commands(bad)
    assert found == [["analyze", PLACEHOLDER, "--data", "licenses.txt", "--lenght", "128"],
                     ["approx", "m", "--budget", "8", "--bogus"], ["plan-k", "runs/x", "--energy", "0.9", "[--per-head]"],
                     ["analyze", "…"]]
    for arguments in found:
        with pytest.raises(Exception, match="No such option|unexpected extra argument|placeholder"):
            parse(arguments)
    parse(["analyze", PLACEHOLDER, "--data", "licenses.txt", "--length", "128"])


def test_installs_are_ones_that_work() -> None:
    """spectra-attention is not on a package index: its extras install from the clone (pip install -e ".[gguf]"),
    never as pip install "spectra-attention[gguf]"."""
    for path in DOCUMENTS:
        for line in fenced_lines(path.read_text()) + re.findall(r"`(pip install [^`]+)`", path.read_text()):
            if "pip install" in line:
                assert "spectra-attention" not in line, f"{path.name}: {line.strip()}"


def written_files(path: Path) -> list[str]:
    """The files a document's shell commands write into the current directory: redirect targets (`> file`) and the
    values of --out/--csv, relative paths only, leaving out figures/ and results/ (where committed pictures and
    published runs are meant to go: `spectra publish`)."""
    found = []
    for line in fenced_lines(path.read_text()):
        try:
            tokens = shlex.split(re.sub(r"\$\([^)]*\)|\$\{?\w+\}?", PLACEHOLDER, line), comments=True)
        except ValueError:
            continue
        for flag, value in zip(tokens, tokens[1:]):
            if flag in (">", ">>", "--out", "--csv") and not value.startswith(("/", "~", "figures/", "results/")):
                found.append(value)
    return found


def test_the_readme_commands_leave_a_clone_clean() -> None:
    """A newcomer runs the README's commands in a clone: every file they write there (the corpus made from the
    licence texts, a plan, run directories) is ignored by git, so `git status` stays clean."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    written = written_files(ROOT / "README.md")
    assert "licenses.txt" in written, "the offline first run writes its corpus"
    shown = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written], capture_output=True,
                           text=True).stdout.split()
    assert sorted(set(written) - set(shown)) == [], "written into a clone and not ignored"


# ---------------------------------------------------------------- the front page

README = ROOT / "README.md"
#: a front page a newcomer reads in five minutes, and pictures that keep the repository light
MOST_LINES, MOST_PICTURE_BYTES = 250, 200_000


def pictures() -> list[tuple[str, str]]:
    """The README's pictures: (path, the fenced code block right after the picture)."""
    text = README.read_text()
    found = []
    for image in re.finditer(r"!\[[^\]]*\]\(([^)]+\.png)\)", text, re.S):
        block = re.search(r"```\n(.*?)```", text[image.end():], re.S)
        found.append((image[1], block[1] if block else ""))
    return found


def test_the_front_page_is_short_and_shows_its_results() -> None:
    """Issue 33: at most 250 lines, at least three pictures, each a committed PNG under figures/ that is small, made by
    the command printed under it (the picture's own path as the recipe's --out)."""
    assert len(README.read_text().splitlines()) <= MOST_LINES
    shown = pictures()
    assert len(shown) >= 3
    for path, block in shown:
        assert path.startswith("figures/") and (ROOT / path).is_file(), f"{path} is not committed under figures/"
        assert (ROOT / path).stat().st_size <= MOST_PICTURE_BYTES, f"{path} is over {MOST_PICTURE_BYTES // 1000} KB"
        assert f"--out {path}" in block and "python analyses/pictures.py" in block, \
            f"the command under {path} does not make it"


def test_the_set_up_and_test_commands_are_what_ci_runs() -> None:
    """.ci/run installs and tests as the README says: the same two commands, word for word."""
    ci = (ROOT / ".ci" / "run").read_text()
    text = README.read_text()
    for command in ('pip install torch==2.13.0 && pip install -e ".[test]"', "python -m pytest"):
        assert command in text
    assert 'pip install -q torch==2.13.0 && pip install -q -e ".[test]"' in ci and "\npython -m pytest\n" in ci


def test_links_between_the_pages_resolve() -> None:
    """Every relative link of the README and docs/ names a file that exists, and an anchor a heading of it."""
    for path in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(#[^)]+)?\)", path.read_text()):
            linked = (path.parent / target[0]).resolve()
            assert linked.is_file(), f"{path.name} links to {target[0]}, which does not exist"
            if target[1]:
                slugs = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
                         for heading in re.findall(r"^#+ (.+)$", linked.read_text(), re.M)}
                assert target[1][1:] in slugs, f"{path.name} links to {target[0]}{target[1]}, no such heading"


def test_every_command_page_is_linked_from_the_front_page() -> None:
    text = README.read_text()
    for page in ("analyze", "decoders", "cache", "figure1", "theorems", "approx", "heads", "scaling", "speed",
                 "formats", "methods"):
        assert f"(docs/{page}.md)" in text and (ROOT / "docs" / f"{page}.md").is_file(), page


def test_every_press_with_an_argument_is_explained_in_the_cache_page() -> None:
    """Issue 41, item 13: adakv(<scorer>), duo(<pattern>) and headbudget(<run>) appeared only in --help. docs/cache.md
    now has a bullet for every press written with an argument, as --help lists it, saying what its ratio means; and
    where the argument is a run, which command makes it."""
    from spectra.registry import PRESSES

    text = (ROOT / "docs" / "cache.md").read_text()
    section = text.split("## Presses that take an argument", 1)[1].split("\n## ", 1)[0]
    bullets = {item.split("`", 2)[1]: " ".join(item.split()) for item in section.split("\n- ")[1:]}
    written = [name for name in PRESSES.listing().split(", ") if "(" in name]
    assert written and set(written) <= set(bullets), set(written) - set(bullets)
    for name in written:
        assert "ratio" in bullets[name], name
    assert "`spectra heads` writes into its run directory" in bullets["duo(<pattern>)"]
    assert "`spectra analyze` or `spectra heads` run" in bullets["headbudget(<run>)"]
    assert "`spectra cache --bytes-kept` run" in bullets["mixed(<cache run>)"]


def test_the_commands_section_says_what_each_command_writes() -> None:
    """Issue 55, item 7: the README said every command writes a run directory that `spectra.load_run` reads and has a
    function in Python (not `tasks`, `artifacts`, nor the commands that read runs). The analyses it names as writing
    runs are the registered ones, every command of the command line is named in one of its groups, and every
    `spectra.NAME` it gives exists."""
    import tomllib

    import spectra
    from spectra.kinds import REGISTRY

    text = " ".join(README.read_text().split())
    said = re.search(r"The analyses \(([^)]*)\) write a run directory that `spectra.load_run` reads back; `tasks` "
                     r"writes a task file, `artifacts` an artifact directory, and ([^.]*) read runs\.", text)
    assert said, "the commands section no longer says which commands write a run"
    analyses = re.findall(r"`([\w-]+)`", said[1])
    readers = re.findall(r"`([\w-]+)`", said[2])
    assert sorted(analyses) == sorted(REGISTRY)
    group = typer.main.get_command(cli.app)
    assert sorted(group.list_commands(None)) == sorted([*analyses, "tasks", "artifacts", *readers])
    functions = re.search(r"have the same function in Python \(([^)]*)\)", text)
    assert functions and all(callable(getattr(spectra, name)) for name in re.findall(r"`spectra\.(\w+)`", functions[1]))
    assert all(callable(getattr(spectra, name)) for name in [*analyses, "tasks", "artifacts"])
    install = next(line for line in fenced_lines(README.read_text()) if "pip install -e \".[gguf]\"" in line)
    packages, comment = install.split("#")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gguf"]
    assert "adds the last two" in comment and packages.split()[-2:] == [re.split(r"[<>=]", name)[0] for name in extra]
