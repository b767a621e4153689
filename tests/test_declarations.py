"""The names and facts a package's registered classes declare, read from the source, are what Python makes of the
same classes once imported: inheritance across modules in C3 order, tuple and annotated assignments, variants that
set a fact; and what cannot be read without running the module is refused in one line naming the class."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spectra.declarations import Package

FACTS = ("causal", "family", "window", "axis")

#: a small package of registered classes, importable as it is (its `register` records each class it decorates)
FILES = {
    "__init__.py": "",
    "base.py": '''
REGISTERED = []


def register(cls):
    REGISTERED.append(cls)
    return cls


class Thing:
    causal = False
    family: str = ""
    window = 0
    axis = "tokens"
    variants = {}


class Windowed:
    window = 64
''',
    "alpha.py": '''
from . import base
from .base import Thing, Windowed, register as register

ORDER = 2


@register
class Alpha(Windowed, base.Thing):
    name, summary = "alpha", f"reads {64} queries"
    causal: bool = True


class Left(Thing):
    pass


class Right(Thing):
    axis = "rank"


@register
class Diamond(Left, Right):
    """Python's order: Diamond, Left, Right, Thing — so Right's axis, not Thing's."""

    name = "diamond"

    @property
    def summary(self):
        return "a property, which no reading of the source can evaluate"
''',
    "beta.py": '''
from .alpha import Right
from .base import register

ORDER = 1


@register
class Beta(Right):
    family = "betas"
    variants = {"beta-1": {"causal": True, "width": 1 + 1}, "beta-2": {"width": 2}}

    def __init__(self, causal=False, width=0):
        self.causal, self.width = causal, width


class Unregistered(Right):
    name = "ignored"
''',
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    folder = tmp_path / "things"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield folder
    for name in [module for module in sys.modules if module == "things" or module.startswith("things.")]:
        del sys.modules[name]


def test_the_source_says_what_python_makes_of_the_classes(package: Path) -> None:
    read = Package(package, "things").entries(FACTS)
    assert [(name, module) for name, module, _ in read] == [
        ("beta-1", "things.beta"), ("beta-2", "things.beta"), ("alpha", "things.alpha"), ("diamond", "things.alpha")]
    importlib.import_module("things.beta")
    registered = importlib.import_module("things.base").REGISTERED
    assert [cls.__name__ for cls in registered] == ["Alpha", "Diamond", "Beta"]  # Unregistered is not read either
    imported = {}
    for cls in registered:
        for name, arguments in (vars(cls).get("variants") or {cls.name: {}}).items():
            obj = cls(**arguments)
            imported[name] = {fact: getattr(obj, fact) for fact in FACTS if getattr(obj, fact)}
    assert {name: facts for name, _, facts in read} == imported
    assert imported["diamond"] == {"axis": "rank"} and imported["alpha"] == {"causal": True, "window": 64,
                                                                            "axis": "tokens"}
    assert imported["beta-1"] == {"causal": True, "family": "betas", "axis": "rank"}


@pytest.mark.parametrize("edit, message", [
    (("    causal: bool = True", "    causal: bool = bool(1)"),
     "things.alpha.Alpha (line 9) declares 'causal' as something other than a literal; the registry reads it "
     "without importing the module: write causal = <a literal> in the class body"),
    (('    name = "diamond"', '    label = "diamond"'),
     "things.alpha.Diamond (line 23) is registered but declares no name"),
    (('    name = "diamond"', '    name = "diamond"\n    axis = AXIS'),
     "things.alpha.Diamond (line 23) declares 'axis'"),
])
def test_what_cannot_be_read_without_running_the_module_is_refused(package: Path, edit, message) -> None:
    path = package / "alpha.py"
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(ValueError) as error:
        Package(package, "things").entries(FACTS)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_variant_sets_a_fact_only_with_a_literal(package: Path) -> None:
    path = package / "beta.py"
    path.write_text(path.read_text().replace('{"causal": True, "width": 1 + 1}', '{"causal": not False}'))
    with pytest.raises(ValueError, match=r"things.beta.Beta \(line 9\) declares 'variants\['beta-1'\]\['causal'\]'"):
        Package(package, "things").entries(FACTS)


def test_the_real_packages_are_read_without_importing_them() -> None:
    """--help lists every method and press from the source, fast because nothing is imported: reading the two
    packages imports neither torch nor any module of theirs (checked in a fresh interpreter; a timing bound here
    failed on a loaded machine, and speed belongs to benchmarks, not tests)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from spectra.declarations import Package\n"
        f"root = Path({str(Path(__file__).parent.parent / 'spectra')!r})\n"
        "methods = Package(root / 'methods', 'spectra.methods').entries(('family', 'causal', 'calibrates'))\n"
        "presses = Package(root / 'kv' / 'presses', 'spectra.kv.presses').entries(('scorer', 'axis'))\n"
        "imported = [name for name in sys.modules if name == 'torch' or name.startswith(('spectra.methods.', "
        "'spectra.kv.presses.'))]\n"
        "print(len(methods), len(presses), imported)\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 2)
    assert int(found[0]) >= 27 and int(found[1]) >= 19
    assert found[2].strip() == "[]", f"reading the sources imported {found[2].strip()}"


def test_a_fact_every_variant_sets_needs_no_literal_in_the_class(package: Path) -> None:
    """Issue 38: kivi2/4/8 declare their summaries per variant, literals for --help, while the class computes its own
    from its bits (a property): the reader takes each variant's and never evaluates the class's — unless a variant
    leaves it to the class, which is then refused as before."""
    path = package / "beta.py"
    path.write_text(path.read_text().replace('    family = "betas"\n', '    @property\n    def family(self):\n'
                                             '        return f"betas-{self.width}"\n').replace(
        '{"causal": True, "width": 1 + 1}, "beta-2": {"width": 2}',
        '{"causal": True, "width": 1 + 1, "family": "betas-2"}, "beta-2": {"width": 2, "family": "betas-2"}'))
    read = {name: facts for name, _, facts in Package(package, "things").entries(FACTS)}
    assert read["beta-1"] == {"causal": True, "family": "betas-2", "axis": "rank"}
    assert read["beta-2"] == {"family": "betas-2", "axis": "rank"}
    path.write_text(path.read_text().replace(', "family": "betas-2"}}', "}}"))
    with pytest.raises(ValueError, match=r"things.beta.Beta \(line 9\) declares 'family' as something other than"):
        Package(package, "things").entries(FACTS)
