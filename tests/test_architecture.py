"""ARCHITECTURE.md names only what exists: every module path, dotted name, class, function and command it writes in
backticks (and every path and dotted name of its diagram) resolves against the tree, read from the sources' syntax
trees (torch-free): `kv.presses.Prefill`, `Cell.recompression()`, `spectra/kv/prefill.py`, `kv/batching.py`,
`spectra cache`. Placeholders (`<family>`, `…`) cut a path where they begin; options (`--flag`), data files
(run.json), strings and the left column of the renamed-names table (old names, on purpose) are not code references."""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import typer

from spectra import cli

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "ARCHITECTURE.md"
#: the packages whose names the document may use: the library and the README's scripts
PACKAGES = ("spectra", "analyses")
#: folders a path written from the repository's root starts with
ROOTS = ("spectra", "tests", "analyses", "templates", "docs", "figures", "benchmarks")
#: what a placeholder in a path or a name looks like
PLACEHOLDER = re.compile(r"<[^>]*>|…|\*")
#: files that are data, not code (named as what a run writes or reads)
DATA = re.compile(r"\.(json|jsonl|csv|npz|gguf|txt|partial)$")
IDENTIFIER = r"[A-Za-z_]\w*"
CHAIN = re.compile(rf"@?({IDENTIFIER}(?:\.{IDENTIFIER})*)")


# ---- the tree, read from its syntax trees ----------------------------------------------------------------------

@dataclass
class Module:
    name: str
    tree: ast.Module
    #: name → ("def", node) | ("value", None) | ("import", "module[:name]")
    bindings: dict[str, tuple[str, object]] = field(default_factory=dict)
    #: every node of the module, walked once
    nodes: list[ast.AST] = field(default_factory=list)


@dataclass(frozen=True)
class Class:
    module: str
    node: ast.ClassDef


LEAF = "leaf"  # a function, a constant, an attribute: a name that exists, whose own attributes are not followed


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def top_level(statements: list[ast.stmt]):
    """The statements of a module's namespace: its top level and the bodies of its if/try/with blocks."""
    for node in statements:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for body in (getattr(node, name, []) for name in ("body", "orelse", "finalbody")):
                yield from top_level(body)
            for handler in getattr(node, "handlers", []):
                yield from top_level(handler.body)


def targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for element in node.elts for name in targets(element)]
    return []


def bind(module: Module, package: bool) -> None:
    base = module.name.split(".") if package else module.name.split(".")[:-1]
    for node in top_level(module.tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.bindings[node.name] = ("def", node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                module.bindings.update({name: ("value", None) for name in targets(target)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            module.bindings[node.target.id] = ("value", None)
        elif isinstance(node, ast.ImportFrom):
            source = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for alias in node.names:
                module.bindings[alias.asname or alias.name] = ("import", f"{source}:{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.bindings[alias.asname] = ("import", alias.name)
                else:
                    module.bindings[alias.name.split(".")[0]] = ("import", alias.name.split(".")[0])


@cache
def tree() -> dict[str, Module]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            modules[name] = module = Module(name, ast.parse(path.read_text(), str(path)))
            bind(module, path.name == "__init__.py")
            module.nodes = list(ast.walk(module.tree))
    return modules


@cache
def members(cls: Class, seen: frozenset = frozenset()) -> dict[str, object]:
    """A class's names: its body's, what its methods assign to `self`, then its bases' in order."""
    found: dict[str, object] = {}
    for node in cls.node.body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = Class(cls.module, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = LEAF
        elif isinstance(node, ast.Assign):
            found.update({name: LEAF for target in node.targets for name in targets(target)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = LEAF
    for node in ast.walk(cls.node):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            found.setdefault(node.attr, LEAF)
    for base in cls.node.bases:
        base = base.value if isinstance(base, ast.Subscript) else base
        chain = ast.unparse(base).split(".")
        parent = walk(lookup(tree()[cls.module], chain[0]), chain[1:])
        if isinstance(parent, Class) and parent not in seen:
            for name, value in members(parent, seen | {cls}).items():
                found.setdefault(name, value)
    return found


def lookup(module: Module, name: str):
    """What `module.name` is: a submodule, a class, a leaf, or None."""
    if f"{module.name}.{name}" in tree():
        return tree()[f"{module.name}.{name}"]
    if name in module.bindings:
        kind, value = module.bindings[name]
        if kind == "def":
            return Class(module.name, value) if isinstance(value, ast.ClassDef) else LEAF
        if kind == "import":
            source, _, attribute = str(value).partition(":")
            if source in tree():
                return lookup(tree()[source], attribute) if attribute else tree()[source]
            return LEAF  # a name from outside the packages (transformers' AttentionInterface)
        return LEAF
    if "__getattr__" in module.bindings:  # names made on first use (spectra.heads, spectra.HeadsRun)
        return LEAF if hasattr(importlib.import_module(module.name), name) else None
    return None


def walk(start, chain: list[str]):
    """Follow `chain` from a module or class; None where a name is missing or a leaf is asked for an attribute."""
    here = start
    for name in chain:
        if isinstance(here, Module):
            here = lookup(here, name)
        elif isinstance(here, Class):
            here = members(here).get(name)
        else:
            return None
    return here


@cache
def anchors() -> dict[str, list]:
    """Every name a dotted reference may start with: a module by its last component(s), a class or a top-level
    def or constant by its name (a class nested in another too)."""
    found: dict[str, list] = {}
    for name, module in tree().items():
        parts = name.split(".")
        for start in range(len(parts)):
            found.setdefault(".".join(parts[start:]), []).append(module)
        for binding, (kind, value) in module.bindings.items():
            if kind == "def":
                found.setdefault(binding, []).append(Class(name, value) if isinstance(value, ast.ClassDef) else LEAF)
            elif kind == "value":
                found.setdefault(binding, []).append(LEAF)
        for node in module.nodes:
            if isinstance(node, ast.ClassDef):
                for inner in node.body:
                    if isinstance(inner, ast.ClassDef):
                        found.setdefault(inner.name, []).append(Class(name, inner))
    return found


@cache
def vocabulary() -> frozenset[str]:
    """Every identifier the packages use (defined, read, an argument or a keyword) and every string they hold whole:
    what a bare lowercase name in the document may be (an attribute, a fact, a column, a press's name)."""
    words: set[str] = set()
    for name, module in tree().items():
        words.update(name.split("."))
        for node in module.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                words.add(node.name)
            elif isinstance(node, ast.Name):
                words.add(node.id)
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.arg):
                words.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                words.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                words.add(node.value)
    return frozenset(words)


@cache
def external() -> frozenset[str]:
    """The names from outside the packages that they use: what they import (`transformers.AttentionInterface`,
    `AttentionInterface`) and every attribute chain they read from an imported module (`torch.distributed`)."""
    names: set[str] = set()
    for name, module in tree().items():
        aliases: dict[str, str] = {}
        for node in module.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] not in PACKAGES:
                        aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                            alias.name.split(".")[0]
                        names.add(alias.name)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and node.module.split(".")[0] not in PACKAGES:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    names.update({alias.name, f"{node.module}.{alias.name}"})
        for node in module.nodes:
            chain = []
            while isinstance(node, ast.Attribute):
                chain.insert(0, node.attr)
                node = node.value
            if chain and isinstance(node, ast.Name) and node.id in aliases:
                parts = aliases[node.id].split(".") + chain
                names.update(".".join(parts[:end]) for end in range(2, len(parts) + 1))
    return frozenset(names)


@cache
def commands() -> frozenset[str]:
    return frozenset(typer.main.get_command(cli.app).commands)


@cache
def files() -> tuple[str, ...]:
    """Every file and folder below the packages and tests, as paths from the root (folders end with /)."""
    found = []
    for top in ROOTS:
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else ""))
    return tuple(found)


# ---- the references, and whether each exists --------------------------------------------------------------------

def path_exists(text: str) -> bool:
    """A path from the root (`spectra/kv/prefill.py`, `tests/golden/`) exists; a shorter one (`kv/prefill.py`,
    `presses/`) ends a path of the packages. A placeholder cuts the path at the folder before it."""
    cut = PLACEHOLDER.search(text)
    if cut:
        text = text[: text.rfind("/", 0, cut.start()) + 1]
        if not text:
            return True
    if text.split("/")[0] in ROOTS:
        return (ROOT / text).exists()
    return any(found.endswith("/" + text) for found in files() if found.split("/")[0] in PACKAGES)


def name_exists(text: str) -> bool:
    """A dotted name resolves from some anchor, or is a name from outside the packages that they use; a bare
    CamelCase or UPPER name is defined somewhere; a bare lowercase one is an identifier or a whole string of the
    packages."""
    chain = text.split(".")
    for split in range(len(chain), 0, -1):  # the longest anchor first: `kv.tasks.selection`, then `kv`
        for start in anchors().get(".".join(chain[:split]), []):
            if walk(start, chain[split:]) is not None:
                return True
    if text in external():
        return True
    if len(chain) == 1 and not chain[0][0].isupper():
        return chain[0] in vocabulary()
    return False


def problem(span: str) -> str | None:
    """Why a backticked span names nothing that exists, or None (it exists, or is not a code reference)."""
    span = " ".join(span.split())
    if not span or span.startswith(("-", '"', "<!--", "{", "(")) or DATA.search(span):
        return None
    if span.startswith("spectra "):  # a command: its name is a command of the CLI
        name = span.split()[1]
        return None if name.startswith("-") or name in commands() else f"no command 'spectra {name}'"
    if span.startswith(("python ", "python3 ")):  # a script: it exists
        script = span.split()[1]
        return None if path_exists(script) else f"no script {script}"
    if re.fullmatch(r"[\w.<>…*-]*/[\w./<>…*-]*|[\w<>…*-]+\.py", span):
        return None if path_exists(span) else f"no file or folder {span}"
    if re.fullmatch(rf"{IDENTIFIER}(, {IDENTIFIER})+", span):  # `layer, q, key, value`: each a name
        missing = [part for part in span.split(", ") if not name_exists(part)]
        return f"no name {', '.join(missing)}" if missing else None
    span = span.removeprefix("class ").removeprefix(".")  # `.calibrating_presses`: an attribute named alone
    match = CHAIN.match(span)
    rest = span[match.end():] if match else ""
    if not match or rest and not re.match(r"\s*[(\[=]", rest):
        return None  # prose, a name with a dash (`cache-presses`), a key and its value (`protocol: tasks`)
    name = match.group(1)
    return None if name_exists(name) else f"no name {name}"


def references(text: str) -> list[tuple[int, str]]:
    """(line, span) for every backticked span outside code blocks, and every path or dotted name inside them; the
    left column of the table of renamed names is skipped (it names what no longer exists, on purpose)."""
    found: list[tuple[int, str]] = []
    fenced, renamed = False, False
    lines = text.splitlines()
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            for token in re.findall(r"[\w./<>-]*[\w>]/|[\w<>-]+(?:/[\w<>-]+)*\.py\b|[a-z_]\w*(?:\.[A-Za-z_]\w*)+",
                                    line):
                found.append((number, token))
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells[:2] == ["old", "new"]:
            renamed = True
        elif not cells:
            renamed = False
        if renamed and cells:
            line = "| " + " | ".join(cells[1:]) + " |"
        prose.append((number, line))
    joined = "\n".join(line for _, line in prose)  # a span may run over a line break
    starts = [0]
    for _, line in prose:
        starts.append(starts[-1] + len(line) + 1)
    for match in re.finditer(r"`([^`]+)`", joined):
        index = next(i for i in range(len(prose)) if starts[i + 1] > match.start())
        found.append((prose[index][0], match.group(1)))
    return found


def problems(text: str) -> list[str]:
    return [f"ARCHITECTURE.md:{line}: `{span}`: {why}" for line, span in references(text)
            if (why := problem(span)) is not None]


# ---- the tests ---------------------------------------------------------------------------------------------------

def test_the_architecture_names_only_what_exists() -> None:
    found = problems(DOCUMENT.read_text())
    assert not found, "\n".join(found)


def test_the_check_finds_stale_names_and_leaves_prose_alone() -> None:
    stale = ("A press of `registry.WHOLE_MODEL_PASSES` runs a pass; a cell is `spectra.cell.Cell`; records are read "
             "through `source.py`, `kv/tasks/source.py` and `spectra/kv/nothing/`; `Cell.nothing()`, `NoSuchClass`, "
             "`no_such_function(x)`, `spectra nothing RUN`, `python analyses/nothing.py --check`.")
    found = problems(stale)
    for name in ("registry.WHOLE_MODEL_PASSES", "spectra.cell.Cell", "`source.py`", "kv/tasks/source.py",
                 "spectra/kv/nothing/", "Cell.nothing", "NoSuchClass", "no_such_function", "spectra nothing",
                 "analyses/nothing.py"):
        assert any(name in line for line in found), f"{name} not flagged: {found}"
    assert len(found) == 10, found
    fine = ("`kv.presses.Prefill`, `generation.Recompression`, `Cell.recompression()`, `kv/prefill.py`, `presses/`, "
            "`spectra/kv/presses/<family>.py`, `tests/kv/presses/test_<family>.py`, `spectra.heads(model, data, …)`, "
            "`spectra.HeadsRun`, `REGISTRY[name]`, `Press.for_run(**settings)`, `class Heads(Analysis)`, "
            "`layer, q, key, value`, `identity=False`, `wraps = \"scorer\"`, `--fit-samples`, `run.json`, `tokens`, "
            "`fit_samples`, `protocol: tasks`, `\"press,press…\"`, `spectra cache`, `python analyses/readme.py "
            "--render`, `adakv(snapkv)`, `slots.clean`\n\n| old | new | why |\n| --- | --- | --- |\n"
            "| `spectra/tasks/source.py` | `spectra/kv/tasks/examples.py` | `source` named `sources.py` too |\n")
    assert problems(fine) == []
    renamed = fine.replace("`spectra/kv/tasks/examples.py` |", "`spectra/kv/tasks/source.py` |")
    assert [line.split("`")[1] for line in problems(renamed)] == ["spectra/kv/tasks/source.py"]
