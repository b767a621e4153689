"""Rerun the commands printed in README.md and docs/*.md and put the values their prose quotes into its slots.

A number in the documentation is only as good as the command beside it, so the documents say which is which:
every paragraph that quotes measured numbers sits between `<!-- numbers: NAME -->` and `<!-- /numbers -->`, and
its commands are the fenced code block just above it (the last one before the opening marker, with no heading
in between). The paragraph's prose is written by hand; its values stand in slots and its interpretations end in
named claims (slots.py). This script reads the commands from the text — so the commands shown are the commands
run —, evaluates the documents' own set-up lines with bash as a reader would (`MODEL=$(python …)`, `GGUF=…`,
`cat … > licenses.txt`), runs every `spectra …` line in one work directory (the reader's current directory:
default run names such as runs/…-n128 come out as the README says), hands the finished runs to the renderer
NAME (analyses/readme_numbers.py), puts the values it returns into the slots and fails where a claim no longer
holds. Commands that need the Hugging Face Hub (a hub id or a named dataset) cannot run offline and are skipped
with a message.

    python analyses/readme.py                           # rerun every marked paragraph's commands, refill the values
    python analyses/readme.py --only smollm2-decoder    # one paragraph
    python analyses/readme.py --check                   # re-render from the runs in --work only; exit 1 on a difference
    python analyses/readme.py --only speed-line --rerun # run again though finished (timings on an idle machine)
    python analyses/readme.py --render                  # run nothing: render the templates into the documents

The markup lives in the templates: templates/README.md and templates/docs/*.md are what this script reads and
fills, and every template is rendered (`slots.clean`: values in place, markers gone) into the document people read,
README.md and docs/*.md, which are never edited by hand; `--check` also fails where a document is not its template's
render.

Exit codes: 0 when every value is what the runs give and every claim holds (with --check: nothing would change),
1 when a value differs (--check) or a claim fails (reword the sentence it ends), 2 on bad input.

Finished runs are reused: the work directory (default /tmp/spectra-readme) keeps a manifest of the commands it
ran and where each wrote, so a second pass runs only what changed (a changed command reruns, and so do the
commands after it in its block, which may read its output). A finished run whose recorded settings are no longer
what its command means (a default changed since, e.g. the presses `spectra cache` runs) is stale: it reruns, and
--check refuses it.

Published runs are read, never rerun: a code block that shows `spectra publish RUN… --out results/NAME` has its runs
read from their committed folders, results/NAME/<run> in the repository (`spectra.report.published`: each file's
sha256 checked first, a mismatch one line and exit 2, nothing written), so `--check` re-renders those paragraphs from
the repository alone; a run not published yet runs (or is reused) in the work directory as before, and this script
never publishes (committing is done by hand, with the command the page shows).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this script, however it is run

import generated  # noqa: E402
import readme_numbers  # noqa: E402
import slots  # noqa: E402
from readme_runs import Execute, ReadmeError, Work, subprocess_execute  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: the folder of the templates, whose files mirror the documents' paths
TEMPLATES = "templates"
OPEN = re.compile(r"^<!-- numbers: (\S+) -->$")
CLOSE = "<!-- /numbers -->"


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


def rendered_path(template: Path) -> Path | None:
    """The document a template renders into: templates/<path> → <path> (the folder above templates/); None for a
    document outside a templates folder, which is filled in place and rendered nowhere."""
    parts = template.resolve().parts
    if TEMPLATES not in parts[:-1]:
        return None
    at = len(parts) - 1 - parts[:-1][::-1].index(TEMPLATES) - 1
    return Path(*parts[:at], *parts[at + 1:])


def update(path: Path, old: str, new: str, why: str, write: bool) -> bool:
    """Whether `path` changes from `old` to `new`; written (atomically) when `write`, else its difference printed,
    the new side labelled `why`."""
    if new == old:
        return False
    if write:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(new)
        partial.replace(path)
    else:
        sys.stderr.writelines(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                                   str(path), f"{path} ({why})"))
    return True


def regenerate(documents: list[Path], write: bool) -> list[Path]:
    """Rewrite each template's generated blocks with what their generators give now (`generated.refreshed`): the
    templates that change, written unless `write` is False, when their differences are printed instead."""
    return [template for template in documents
            if update(template, old := template.read_text(), generated.refreshed(old), "regenerated", write)]


def render(documents: list[Path], write: bool) -> list[Path]:
    """Render each template into its document (`slots.clean`): the documents that differ from their render, written
    unless `write` is False, when their differences are printed instead."""
    changed = []
    for template in documents:
        target = rendered_path(template)
        if target is not None and update(target, target.read_text() if target.is_file() else "",
                                         slots.clean(template.read_text()), f"rendered from {template}", write):
            changed.append(target)
    return changed


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


def main(argv: list[str] | None = None, execute: Execute = subprocess_execute, repository: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="NAME", help="the marked paragraph NAME only")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: re-render from the runs in --work and exit 1 if a document would change")
    parser.add_argument("--rerun", action="store_true",
                        help="run the commands again even when their runs are finished (fresh timings)")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: render the templates into the documents people read")
    parser.add_argument("--work", type=Path, default=Path("/tmp/spectra-readme"),
                        help="where the commands run and their runs stay (reused when finished)")
    parser.add_argument("--documents", type=Path, nargs="+",
                        default=[ROOT / TEMPLATES / "README.md", *sorted((ROOT / TEMPLATES / "docs").glob("*.md"))],
                        help="the templates to fill (default: every template under templates/)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if args.check and args.rerun:
            raise ReadmeError("--check runs nothing and --rerun runs everything again: give one of them")
        missing = [path for path in args.documents if not path.is_file()]
        if missing:
            raise ReadmeError(f"--documents {missing[0]} does not exist: give the templates to fill")
        if args.render:
            if args.check or args.rerun or args.only:
                raise ReadmeError("--render runs nothing: give it alone")
            rendered = regenerate(args.documents, write=True) + render(args.documents, write=True)
            print(f"rendered {', '.join(map(str, rendered)) or 'nothing (every document is its render)'}",
                  file=sys.stderr)
            return 0
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
        if not args.check:  # --check reads the runs there, if any (published runs are read from the repository)
            args.work.mkdir(parents=True, exist_ok=True)
        work = Work(args.work.resolve(), setup_lines([block for _, blocks in read.values() for block in blocks]),
                    execute, repository)
        chosen = [paragraph for paragraph in marked if args.only in (None, paragraph.name)]
        runs = [work.commands(paragraph.commands, args.check, args.rerun) for paragraph in chosen]  # every run first, then the prose
        rendered = {(paragraph.path, paragraph.name): readme_numbers.render(paragraph.name, ran, work.root)
                    for paragraph, ran in zip(chosen, runs)}
        changed, failed = rewrite(args.documents, rendered, write=not args.check)
        changed += regenerate(args.documents, write=not args.check) + render(args.documents, write=not args.check)
    except (ReadmeError, readme_numbers.RenderError, slots.SlotError, OSError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the runs finished so far are kept in the work directory", file=sys.stderr)
        return 130
    for where, claim in failed:
        print(f"{where}: the claim '{claim}' no longer holds on the runs beside it: reword the sentence it ends",
              file=sys.stderr)
    if args.check:
        print("the documents' values are what their commands give" if not changed else
              f"{len(changed)} document(s) differ from what their commands give (see above)", file=sys.stderr)
        print("every claim holds" if not failed else f"{len(failed)} claim(s) no longer hold", file=sys.stderr)
        return 1 if changed or failed else 0
    print(f"rewrote {', '.join(map(str, changed)) or 'nothing (no value changed)'} in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 1 if failed else 0


def rewrite(documents: list[Path], rendered: dict[tuple[Path, str], slots.Rendered],
            write: bool) -> tuple[list[Path], list[tuple[str, str]]]:
    """Fill each rendered paragraph's slots, its markers found anew (a document edited while its commands ran
    keeps the edit): the documents that change, written unless `write` is False, when their differences are
    printed instead; and the claims that fail, as (file:line, claim)."""
    changed, failed = [], []
    for path in documents:
        old = path.read_text().splitlines(keepends=True)
        new = list(old)
        for paragraph in sorted(read_document(path)[0], key=lambda found: -found.start):
            if (path, paragraph.name) not in rendered:
                continue
            body = "".join(new[paragraph.start + 1:paragraph.end])
            filled, wrong = slots.fill(body, rendered[path, paragraph.name],
                                       f"{path.name}:{paragraph.start + 1} ({paragraph.name})")
            new[paragraph.start + 1:paragraph.end] = filled.splitlines(keepends=True)
            failed += [(f"{path.name}:{paragraph.start + 2 + slots.line_of(body, claim)}", claim) for claim in wrong]
        if update(path, "".join(old), "".join(new), "rerendered", write):
            changed.append(path)
    return changed, sorted(failed)


if __name__ == "__main__":
    sys.exit(main())
