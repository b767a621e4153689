"""The package's shape, checked: dependencies point one way, no private names cross modules, no module grows
past about 400 lines, no protocol is found by hasattr, and every method family has its own test file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "spectra"
TESTS = Path(__file__).parent
MAX_LINES = 420


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = ast.parse(path.read_text(), str(path))
    return found


def imports(name: str, tree: ast.Module, package: bool) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every spectra import in a module, relative ones resolved."""
    base = name.split(".") if package else name.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "spectra":
                found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "spectra"]
    return found


def graph() -> dict[str, set[str]]:
    trees = modules()
    edges: dict[str, set[str]] = {name: set() for name in trees}
    for name, tree in trees.items():
        package = (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()
        for target, names in imports(name, tree, package):
            for item in names or [""]:
                sub = f"{target}.{item}"
                edges[name].add(sub if sub in trees else target)
    return edges


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt == node or nxt not in edges:
                continue
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


def test_no_private_name_is_imported_across_modules() -> None:
    for name, tree in modules().items():
        package = (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()
        for target, names in imports(name, tree, package):
            private = [item for item in names if item.startswith("_") and item != "__version__"]
            assert not private, f"{name} imports private {private} from {target}"


def test_modules_stay_small_and_protocols_are_explicit() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {len(text.splitlines())} lines"
        assert "hasattr(" not in text or path.name == "models.py", f"{path.name} finds a protocol by hasattr"


def test_tests_mirror_the_package() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("__init__.py", "__main__.py", "errors.py"):
            continue
        mirror = TESTS / path.relative_to(PACKAGE).parent / f"test_{path.name}"
        assert mirror.exists(), f"{path.relative_to(PACKAGE.parent)} has no test file {mirror.relative_to(TESTS.parent)}"


def test_the_model_file_and_the_sample_count_are_declared_once() -> None:
    """Issue 54, item 4: below the front ends (cli.py, api.py) a function takes the object that carries `gguf_file`
    (a `checkpoints.Source`, a `RunConfig`, a command's request) rather than declaring it again; `checkpoints.inspect`
    alone turns a model and its GGUF file into a Source, and the task generator alone takes a count of `samples`."""
    facades = {"spectra", "spectra.cli", "spectra.api"}
    for option, home in (("gguf_file", {"spectra.checkpoints"}), ("samples", {"spectra.kv.tasks.generate"})):
        declaring = {name for name, tree in modules().items() if name not in facades
                     for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and option in [arg.arg for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]}
        assert declaring == home, f"{option} is a parameter in {sorted(declaring)}"
