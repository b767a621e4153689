"""Rerun the commands printed in README.md and docs/*.md and rewrite the numbers their prose quotes.

A number in the documentation is only as good as the command beside it, so the documents say which is which:
every paragraph that quotes measured numbers sits between `<!-- numbers: NAME -->` and `<!-- /numbers -->`, and
its commands are the fenced code block just above it (the last one before the opening marker, with no heading
in between). This script reads those commands from the text — so the commands shown are the commands run —,
evaluates the documents' own set-up lines with bash as a reader would (`MODEL=$(python …)`, `GGUF=…`,
`cat … > licenses.txt`), runs every `spectra …` line in one work directory (the reader's current directory:
default run names such as runs/…-n128 come out as the README says), hands the finished runs to the renderer
NAME (analyses/readme_numbers.py) and puts the text it writes between the markers. Commands that need the
Hugging Face Hub (a hub id or a named dataset) cannot run offline and are skipped with a message.

    python analyses/readme.py                           # rerun every marked paragraph's commands, rewrite the numbers
    python analyses/readme.py --only smollm2-decoder    # one paragraph
    python analyses/readme.py --check                   # re-render from the runs in --work only; exit 1 on a difference
    python analyses/readme.py --only speed-line --rerun # run again though finished (timings on an idle machine)

Finished runs are reused: the work directory (default /tmp/spectra-readme) keeps a manifest of the commands it
ran and where each wrote, so a second pass runs only what changed (a changed command reruns, and so do the
commands after it in its block, which may read its output).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # readme_numbers beside this script, however it is run

import readme_numbers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OPEN = re.compile(r"^<!-- numbers: (\S+) -->$")
CLOSE = "<!-- /numbers -->"
#: prose is wrapped to this width, as the documents are
WIDTH = 110
#: how a line that starts a markdown block (list item, heading, quote) begins
BLOCK_START = re.compile(r"^([-+*] |\d+[.)] |#|>)")
#: commands whose MODEL and --data are looked up; the others (plot, plan-k, compare, figure1) read run directories
MODEL_COMMANDS = ("analyze", "approx", "theorems", "scaling", "cache")

#: runs one `spectra` command in a directory and returns its exit code (tests pass an in-process one)
Execute = Callable[[list[str], Path], int]


class ReadmeError(Exception):
    """A problem the script cannot get past (a malformed marker, a set-up line that fails, a command that fails):
    printed as one line, exit code 2."""


@dataclass(frozen=True)
class Paragraph:
    """A marked paragraph: its renderer's name, where it is (lines of the opening and closing markers) and the
    shell lines of the code block beside it (backslash continuations joined)."""

    path: Path
    name: str
    start: int
    end: int
    commands: tuple[str, ...]


def shell_lines(lines: list[str]) -> list[str]:
    """A code block's lines as the shell reads them: backslash continuations joined."""
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return joined


def read_document(path: Path) -> tuple[list[Paragraph], list[list[str]]]:
    """The marked paragraphs of a document and all of its non-Python code blocks (as shell lines); a marker left
    open, closed twice, nested or with no code block beside it is a ReadmeError naming the line."""
    lines = path.read_text().splitlines()
    paragraphs, blocks = [], []
    fence: list[str] | None = None
    language, beside, opened = "", None, None
    for number, line in enumerate(lines):
        where = f"{path.name}:{number + 1}"
        if line.startswith("```"):
            if fence is None:
                fence, language = [], line[3:].strip()
            else:
                if language not in ("python", "py"):
                    blocks.append(shell_lines(fence))
                    if opened is None:
                        beside = blocks[-1]
                fence = None
            continue
        if fence is not None:
            fence.append(line)
        elif line.startswith("#"):
            if opened is not None:
                raise ReadmeError(f"{where}: a heading inside the marked paragraph '{opened[0]}'; close it first")
            beside = None
        elif OPEN.match(line.strip()):
            if opened is not None:
                raise ReadmeError(f"{where}: a marker inside the marked paragraph '{opened[0]}'; close it first")
            if beside is None:
                raise ReadmeError(f"{where}: the paragraph '{OPEN.match(line.strip())[1]}' has no code block above it "
                                  "in its section: show the commands that produce its numbers")
            opened = (OPEN.match(line.strip())[1], number, tuple(beside))
        elif line.strip() == CLOSE:
            if opened is None:
                raise ReadmeError(f"{where}: {CLOSE} closes no marked paragraph")
            paragraphs.append(Paragraph(path, opened[0], opened[1], number, opened[2]))
            opened = None
        elif line.strip().startswith("<!-- numbers"):
            raise ReadmeError(f"{where}: a marker reads '<!-- numbers: NAME -->' or '{CLOSE}', not '{line.strip()}'")
    if opened is not None:
        raise ReadmeError(f"{path.name}:{opened[1] + 1}: the marked paragraph '{opened[0]}' is never closed ({CLOSE})")
    return paragraphs, blocks


def setup_lines(blocks: list[list[str]]) -> dict[str, str]:
    """The set-up lines of the documents' code blocks, by what they define: `NAME=…` by `$NAME`, `cat … > FILE`
    by FILE."""
    found: dict[str, str] = {}
    for line in (line.strip() for block in blocks for line in block):
        if assigned := re.match(r"^([A-Z][A-Z0-9_]*)=\S", line):
            found.setdefault("$" + assigned[1], line)
        elif written := re.match(r"^cat .+ > (\S+)$", line):
            found.setdefault(written[1], line)
    return found


def spectra_arguments(line: str) -> list[str] | None:
    """The arguments after `spectra` in a shell line (variables still unresolved), else None."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    return tokens[1:] if tokens[:1] == ["spectra"] else None


def parameters(arguments: list[str]) -> dict:
    """What the real command line makes of `spectra ARGUMENTS` (click's parameters by name), without running it;
    a line that does not parse is a ReadmeError."""
    import click
    import typer

    from spectra import cli

    group = typer.main.get_command(cli.app)
    try:
        context = group.make_context("spectra", arguments[:1])
        command = group.get_command(context, arguments[0])
        return dict(command.make_context(arguments[0], list(arguments[1:]), parent=context).params)
    except (click.ClickException, AttributeError, IndexError) as error:
        raise ReadmeError(f"`spectra {shlex.join(arguments)}` does not parse: {error}") from None


def subprocess_execute(arguments: list[str], cwd: Path) -> int:
    """`spectra ARGUMENTS` as a program in `cwd`, its output shown as it comes."""
    return subprocess.run([sys.executable, "-m", "spectra", *arguments], cwd=cwd).returncode


class Work:
    """The work directory: the set-up lines' variables and files, and a manifest of the commands run there and
    the run directory each wrote, so that finished runs are reused."""

    def __init__(self, root: Path, setup: dict[str, str], execute: Execute = subprocess_execute) -> None:
        self.root, self.setup, self.execute = root, setup, execute
        self.variables: dict[str, str] = {}
        self.manifest_path = root / "manifest.json"
        self.manifest: dict[str, dict] = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else {}
        self.claimed: dict[str, str] = {}  # run directory → the command that wrote it, this session

    def shell(self, line: str) -> subprocess.CompletedProcess:
        """A set-up line run by bash in the work directory, with this Python's scripts first on PATH."""
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        return subprocess.run(["bash", "-c", line], cwd=self.root, env=env, capture_output=True, text=True)

    def variable(self, name: str) -> str:
        """$NAME's value, from the documents' set-up line `NAME=…` evaluated by bash."""
        if name not in self.variables:
            if f"${name}" not in self.setup:
                raise ReadmeError(f"a command uses ${name}, which no set-up line of the documents defines")
            line = self.setup[f"${name}"]
            done = self.shell(f'{line} && printf %s "${name}"')
            if done.returncode != 0 or not done.stdout.strip():
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise ReadmeError(f"the set-up line `{line}` failed ({last}): install what it needs, as the README "
                                  "says above it")
            self.variables[name] = done.stdout.strip()
        return self.variables[name]

    def resolve(self, line: str) -> list[str] | None:
        """A code-block line's `spectra` arguments with $NAME replaced by the set-up lines' values (None for a
        line that is not a spectra command); files the command names that a set-up line writes are written."""
        arguments = spectra_arguments(line)
        if arguments is None:
            return None
        resolved = [re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", lambda found: self.variable(found[1]), token)
                    for token in arguments]
        for token in resolved:
            if token in self.setup and not (self.root / token).exists():
                if (done := self.shell(self.setup[token])).returncode != 0:
                    raise ReadmeError(f"the set-up line `{self.setup[token]}` failed: {done.stderr.strip()}")
        return resolved

    def hub_only(self, arguments: list[str]) -> bool:
        """Whether a command needs the Hugging Face Hub: its model or its --data is not a local path."""
        if arguments[0] not in MODEL_COMMANDS:
            return False
        found = parameters(arguments)
        local = [found.get("model")] if not found.get("synthetic") else []
        local += [found.get("data")] if not found.get("synthetic") else []
        return any(value is not None and not (self.root / str(value)).exists() for value in local)

    def run_directories(self) -> dict[str, float]:
        """Every finished run directory under the work directory (relative path → run.json's mtime)."""
        return {str(path.parent.relative_to(self.root)): path.stat().st_mtime for path in self.root.rglob("run.json")
                if ".partial" not in str(path)}

    def commands(self, paragraph: Paragraph, check: bool, rerun: bool = False) -> list[tuple[list[str], Path | None]]:
        """Run (or, with `check` or when finished before and not `rerun`, reuse) the spectra commands beside a
        paragraph: each one's arguments and the run directory it wrote (None when it writes none, e.g. plan-k)."""
        ran = []
        for line in paragraph.commands:
            arguments = self.resolve(line)
            if arguments is None:
                continue
            if self.hub_only(arguments):
                print(f"skipped (needs the Hugging Face Hub): spectra {shlex.join(arguments)}", file=sys.stderr)
                continue
            key = shlex.join(arguments)
            entry = self.manifest.get(key)
            finished = entry is not None and (entry["out"] is None or (self.root / entry["out"] / "run.json").exists())
            if check and not finished:
                raise ReadmeError(f"no finished run of `spectra {key}` in {self.root}: run without --check first")
            if not finished or (rerun and not check):
                entry = {"out": self.launch(arguments)}
                self.manifest[key] = entry
                self.manifest_path.write_text(json.dumps(self.manifest, indent=1))
                rerun = True
            out = entry["out"]
            if out is not None and self.claimed.setdefault(out, key) != key:
                raise ReadmeError(f"`spectra {self.claimed[out]}` and `spectra {key}` both write {out}: give one of "
                                  "them its own --out")
            ran.append((arguments, None if out is None else self.root / out))
        return ran

    def launch(self, arguments: list[str]) -> str | None:
        """Run one command (replacing an earlier run of it); the run directory it wrote, relative to the work
        directory, or None when it wrote none."""
        if "overwrite" in parameters(arguments) and "--overwrite" not in arguments:
            arguments = [*arguments, "--overwrite"]
        before = self.run_directories()
        print(f"$ spectra {shlex.join(arguments)}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        code = self.execute(arguments, self.root)
        if code == 130:
            raise KeyboardInterrupt
        if code != 0:
            raise ReadmeError(f"`spectra {shlex.join(arguments)}` failed with exit code {code} (its message is above)")
        print(f"  done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        written = [path for path, mtime in self.run_directories().items() if before.get(path) != mtime]
        return min(written, key=lambda path: (path.count("/"), path)) if written else None


def fill(markdown: str) -> list[str]:
    """A renderer's markdown as document lines: each paragraph wrapped to WIDTH, code blocks and tables kept as
    they are."""
    lines: list[str] = []
    for part in markdown.strip().split("\n\n"):
        if lines:
            lines.append("")
        if part.startswith(("```", "|")):
            lines += part.splitlines()
        else:
            wrapped = textwrap.wrap(" ".join(part.split()), WIDTH, break_long_words=False, break_on_hyphens=False)
            for line in wrapped:  # a wrapped line must not read as a list item, a heading or a quote
                if lines and lines[-1] and BLOCK_START.match(line):
                    lines[-1] += " " + line
                else:
                    lines.append(line)
    return lines


def main(argv: list[str] | None = None, execute: Execute = subprocess_execute) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="NAME", help="the marked paragraph NAME only")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: re-render from the runs in --work and exit 1 if a document would change")
    parser.add_argument("--rerun", action="store_true",
                        help="run the commands again even when their runs are finished (fresh timings)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/spectra-readme"),
                        help="where the commands run and their runs stay (reused when finished)")
    parser.add_argument("--documents", type=Path, nargs="+",
                        default=[ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if args.check and args.rerun:
            raise ReadmeError("--check runs nothing and --rerun runs everything again: give one of them")
        read = {path: read_document(path) for path in args.documents}
        marked = [paragraph for paragraphs, _ in read.values() for paragraph in paragraphs]
        names = [paragraph.name for paragraph in marked]
        if len(set(names)) < len(names):
            raise ReadmeError(f"two paragraphs are marked {max(names, key=names.count)}: one marker per renderer")
        unknown = sorted(set(names) - set(readme_numbers.RENDERERS))
        if unknown:
            raise ReadmeError(f"no renderer named {', '.join(unknown)} in analyses/readme_numbers.py (it has "
                              f"{', '.join(readme_numbers.RENDERERS)})")
        if args.only is not None and args.only not in {paragraph.name for paragraph in marked}:
            raise ReadmeError(f"--only {args.only}: no marked paragraph of that name (there are "
                              f"{', '.join(paragraph.name for paragraph in marked)})")
        if not args.check:
            args.work.mkdir(parents=True, exist_ok=True)
        elif not args.work.is_dir():
            raise ReadmeError(f"--check reads the runs in {args.work}, which does not exist: run without --check first")
        work = Work(args.work.resolve(), setup_lines([block for _, blocks in read.values() for block in blocks]),
                    execute)
        chosen = [paragraph for paragraph in marked if args.only in (None, paragraph.name)]
        runs = [work.commands(paragraph, args.check, args.rerun) for paragraph in chosen]  # every run first, then the prose
        rendered = {(paragraph.path, paragraph.name): fill(readme_numbers.render(paragraph.name, ran, work.root))
                    for paragraph, ran in zip(chosen, runs)}
        changed = rewrite(args.documents, rendered, write=not args.check)
    except (ReadmeError, readme_numbers.RenderError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the runs finished so far are kept in the work directory", file=sys.stderr)
        return 130
    if args.check:
        print("the documents' numbers are what their commands give" if not changed else
              f"{len(changed)} document(s) differ from what their commands give (see above)", file=sys.stderr)
        return 1 if changed else 0
    print(f"rewrote {', '.join(map(str, changed)) or 'nothing (no number changed)'} in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


def rewrite(documents: list[Path], rendered: dict[tuple[Path, str], list[str]], write: bool) -> list[Path]:
    """Put each rendered paragraph between its markers, found anew (a document edited while its commands ran
    keeps the edit); the documents that change, written unless `write` is False, when their differences are
    printed instead."""
    changed = []
    for path in documents:
        old = path.read_text().splitlines(keepends=True)
        new = list(old)
        for paragraph in sorted(read_document(path)[0], key=lambda found: -found.start):
            if (path, paragraph.name) in rendered:
                new[paragraph.start + 1:paragraph.end] = [line + "\n" for line in rendered[path, paragraph.name]]
        if new == old:
            continue
        changed.append(path)
        if write:
            partial = path.with_name(path.name + ".partial")
            partial.write_text("".join(new))
            partial.replace(path)
        else:
            sys.stderr.writelines(difflib.unified_diff(old, new, str(path), f"{path} (rerendered)"))
    return changed


if __name__ == "__main__":
    sys.exit(main())
