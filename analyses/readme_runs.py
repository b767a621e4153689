"""Running the documents' commands for analyses/readme.py: a work directory where every `spectra` line of a code
block runs as a reader would run it (the documents' set-up lines evaluated by bash, `$MODEL` replaced by its
value), a manifest of what ran there so finished runs are reused, the runs a block publishes read from their
committed published folders instead (`published`, `spectra publish`: no rerun), and the test that a finished run
still belongs to its command (`stale`: its recorded settings are what the command means today, defaults included)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path, PurePath
from typing import Any, Callable

from spectra.inputs import split_top
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.registry import press_names, press_presets

#: commands whose MODEL and --data are looked up, every registered analysis; the others (plot, plan-k, compare,
#: figure1) read run directories
MODEL_COMMANDS = tuple(REGISTRY)
#: runs one `spectra` command in a directory and returns its exit code (tests pass an in-process one)
Execute = Callable[[list[str], Path], int]


class ReadmeError(Exception):
    """A problem the script cannot get past (a malformed marker, a set-up line that fails, a command that fails):
    printed as one line, exit code 2."""


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


#: options whose recorded value is not comparable with what was typed: paths (recorded resolved) and plans
UNCOMPARED = ("model", "data", "out", "gguf_file", "k_plan", "approx", "batch_size", "heads_run")
#: a press's argument that names a run directory (`mixed(runs/axes-smol)`), recorded resolved: compared by its name
RUN_ARGUMENT = re.compile(r"\(([^()]*/[^()]*)\)")


def comparable(value: Any) -> tuple | None:
    """An option's value as a tuple of plain scalars, however it is spelt — `"16,32"` and `[16, 32]`, `"svd"` and
    `["svd"]`, an enum and its value are the same, and so are a press's run directory typed relative and recorded
    resolved (`mixed(runs/x)` and `mixed(/tmp/w/runs/x)`: compared by the directory's name) —, or None when it
    cannot be compared (a mapping). A comma inside parentheses is a wrapper's own (`composed(snapkv,think)` is one
    press), as `spectra.inputs.split_top` reads it."""
    if isinstance(value, dict):
        return None
    items = value if isinstance(value, (list, tuple)) else \
        [part for part in split_top(value) if part] if isinstance(value, str) else [value]
    plain = []
    for item in items:
        item = getattr(item, "value", item)  # an enum's value
        if isinstance(item, str):
            item = RUN_ARGUMENT.sub(lambda found: f"({PurePath(found[1]).name})", item)
            try:
                item = float(item)
            except ValueError:
                pass
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            item = float(item)
        elif not isinstance(item, (bool, type(None))):
            return None
        plain.append(item)
    return tuple(plain)


def stale(arguments: list[str], out: Path) -> list[str]:
    """The options a finished run recorded otherwise than `spectra ARGUMENTS` means today (its defaults included):
    a run made before a default changed no longer belongs to its command. A task file run without --samples, or
    holding fewer examples than --samples asks for, is read whole and its run records the examples it read: that run
    is what the command means; a text run without --samples evaluated the kind's own count (`corpus_samples`)."""
    meta = json.loads((out / "run.json").read_text())
    settings = meta.get("settings", {})
    recorded = {**{key: value for key, value in settings.items() if key != "extra"}, **settings.get("extra", {})}
    records = meta.get("data", {}).get("records") if isinstance(meta.get("data"), dict) else None
    differ = []
    for key, value in parameters(arguments).items():
        if key == "samples" and value is None and records is None:  # the kind's own count for a text corpus
            value = corpus_samples(arguments[0])
        if key in UNCOMPARED or value is None or key not in recorded:
            continue
        if key == "samples" and records is not None and recorded[key] == records and value >= records:
            continue  # a task file smaller than --samples, read whole
        if key == "presses" and isinstance(value, str):  # a preset (kvpress's leaderboard) as the run expanded it
            try:
                value = list(press_names(split_top(value)))
            except SpectraError:  # a press whose argument is not here (a run directory of the block): presets only
                with contextlib.suppress(SpectraError):
                    value = press_presets(split_top(value))
        now, then = comparable(value), comparable(recorded[key])
        if now is not None and then is not None and now != then:
            differ.append(f"{key}={recorded[key]!r}")
    return differ


def corpus_samples(command: str) -> int:
    """The sequences `spectra COMMAND` evaluates of a text corpus when --samples is not given (its default None
    means the analysis's own count: `cache` reads a task file whole and 16 sequences of a corpus)."""
    from spectra.config import RunConfig

    kind, config = REGISTRY[command], RunConfig(samples=None)
    return kind.configured(config, kind.resolve(config, kind.options())).samples


def subprocess_execute(arguments: list[str], cwd: Path) -> int:
    """`spectra ARGUMENTS` as a program in `cwd`, its output shown as it comes."""
    return subprocess.run([sys.executable, "-m", "spectra", *arguments], cwd=cwd).returncode


#: the repository, whose published folders (`spectra publish … --out results/…`) a code block's runs are read from
REPOSITORY = Path(__file__).resolve().parent.parent


def option_value(arguments: list[str], name: str) -> str | None:
    """The value typed after `name` (`--out X` or `--out=X`) in a command's arguments, else None."""
    for at, token in enumerate(arguments):
        if token == name and at + 1 < len(arguments):
            return arguments[at + 1]
        if token.startswith(name + "="):
            return token[len(name) + 1:]
    return None


def published(lines: tuple[str, ...], repository: Path) -> dict[str, Path]:
    """The runs a code block publishes (its `spectra publish RUN… --out DIR` lines): each RUN as typed → its
    published folder, DIR/<RUN's name> under `repository`."""
    found = {}
    for line in lines:
        arguments = spectra_arguments(line)
        if arguments and arguments[0] == "publish":
            given = parameters(arguments)
            for run in given["runs"]:
                found[str(run)] = repository / given["out"] / PurePath(str(run)).name
    return found


class Work:
    """The work directory: the set-up lines' variables and files, and a manifest of the commands run there and
    the run directory each wrote, so that finished runs are reused; and the repository whose published folders a
    code block's runs are read from instead, when it publishes them (`spectra publish`)."""

    def __init__(self, root: Path, setup: dict[str, str], execute: Execute = subprocess_execute,
                 repository: Path = REPOSITORY) -> None:
        self.root, self.setup, self.execute, self.repository = root, setup, execute, repository
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

    def commands(self, lines: tuple[str, ...], check: bool, rerun: bool = False) -> list[tuple[list[str], Path | None]]:
        """Run (or, with `check` or when finished before and not `rerun`, reuse) the spectra commands among a code
        block's lines: each one's arguments and the run directory it wrote (None when it writes none, e.g. plan-k).
        A run the block publishes (`spectra publish`) is read from its published folder in the repository where
        there is one, as the command typed it (a stale one refused), and never run; a block whose every published
        run is there runs nothing else either (its task file and artifacts were the runs' inputs, whose sha256 the
        runs record). `spectra publish` itself never runs here: publishing is committing, done by hand."""
        publishes = published(lines, self.repository)
        there = {typed: folder for typed, folder in publishes.items() if (folder / "run.json").is_file()}
        whole = bool(publishes) and len(there) == len(publishes)
        ran = []
        for line in lines:
            typed = spectra_arguments(line)
            if typed is None or typed[0] == "publish":
                continue
            if option_value(typed, "--out") in there:
                folder = there[option_value(typed, "--out")]
                if changed := stale(typed, folder):
                    raise ReadmeError(f"the published run {folder} recorded {', '.join(changed)} other than `spectra "
                                      f"{shlex.join(typed)}` now means: rerun it and publish it again")
                ran.append((typed, folder))
                continue
            if whole:
                continue
            if check and not self.root.is_dir():
                raise ReadmeError(f"no finished run of `spectra {shlex.join(typed)}` in {self.root}, which does not "
                                  "exist: run without --check first")
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
            if finished and entry["out"] is not None and (changed := stale(arguments, self.root / entry["out"])):
                if check:
                    raise ReadmeError(f"the run of `spectra {key}` ({entry['out']}) recorded {', '.join(changed)} "
                                      "other than the command now means (a default changed?): run without --check "
                                      "to rerun it")
                print(f"rerunning `spectra {key}`: its run recorded {', '.join(changed)} other than the command now "
                      "means", file=sys.stderr)
                finished = False
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
