"""The names and facts a package's registered classes declare, read from the package's syntax trees, never imported.

A press or a method is its class: the class says what it is in its body, and the decorator that registers it
(`@register`) marks it for this reader. In the class body, as literals:

- its name, `name = "snapkv"`; or its *variants*, instances of the one class with different parameters, as a mapping
  of each name to the keyword arguments its instance is built with (`variants = {"kivi2": {"bits": 2}, …}`). A
  variant's argument named as a fact sets that fact for the variant (`"svd-causal": {"causal": True, …}`), and
  where each variant sets it the class's own may be something the reader cannot evaluate (kivi's `summary`, a
  property of its bits);
- its facts, the class attributes named as the registry's facts (`windowed = True`, `axis = "channels"`,
  `wraps = "scorer"`), inherited from its bases as Python inherits them (C3 order) where the bases are classes of
  the same package (`ScorerPress` declares `scorer = True` for every scorer).

A module's `ORDER = 10` says where its names come in listings (then the order they are written in). So `--help`
lists every name and an unknown one is refused in milliseconds, without torch: each file is parsed (`ast`), nothing
runs. A fact that is not a literal cannot be read without running the module, and is refused (`ValueError`) —
as is a registered class that declares neither a name nor variants. The registry checks again, when a module loads
and registers its objects, that each object has the facts read here (`Registry.add`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a class's own key: (module stem, class name)
Key = tuple[str, str]


@dataclass
class Body:
    """One class of a module as its source states it: its bases (expressions) and its class-level names (the
    expression each was last assigned; a method or property counts as a name that is no literal)."""

    key: Key
    bases: list[ast.expr]
    names: dict[str, ast.expr | None]
    registered: bool
    line: int


@dataclass
class Module:
    """One module's ORDER, its classes in the order written, and the package's classes it imports by name."""

    stem: str
    order: float
    classes: dict[str, Body] = field(default_factory=dict)
    imported: dict[str, Key] = field(default_factory=dict)  # local name → (stem, name) of `from .stem import name`
    modules: dict[str, str] = field(default_factory=dict)  # local name → stem of `from . import stem`


def class_names(node: ast.ClassDef) -> dict[str, ast.expr | None]:
    """The names a class body binds: `a = 1`, `a: int = 1`, `a, b = 1, 2` (each its expression; None where a name
    is bound by something else: `a, b = pair()`, a method, a property)."""
    names: dict[str, ast.expr | None] = {}
    for statement in node.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = statement.value
                elif isinstance(target, ast.Tuple):
                    values = statement.value.elts if isinstance(statement.value, ast.Tuple) and \
                        len(statement.value.elts) == len(target.elts) else [None] * len(target.elts)
                    names.update({item.id: value for item, value in zip(target.elts, values)
                                  if isinstance(item, ast.Name)})
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.value is not None:
                names[statement.target.id] = statement.value
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[statement.name] = None
    return names


def marked(node: ast.ClassDef, marker: str) -> bool:
    """Whether a class is decorated with `marker` (`@register`, or `@base.register`)."""
    return any((isinstance(decorator, ast.Name) and decorator.id == marker)
               or (isinstance(decorator, ast.Attribute) and decorator.attr == marker)
               for decorator in node.decorator_list)


def parse(path: Path, marker: str) -> Module:
    """A module file's ORDER (0 when it has none), classes and package imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = Module(path.stem, 0.0)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ORDER" for t in node.targets):
            module.order = float(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module:
                    module.imported[local] = (node.module.split(".")[0], alias.name)
                else:
                    module.modules[local] = alias.name
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = Body((module.stem, node.name), list(node.bases), class_names(node),
                                             marked(node, marker), node.lineno)
    return module


class Package:
    """Every module of one package folder, parsed: the classes, their bases resolved within the package, and what
    the registered ones declare."""

    def __init__(self, folder: Path, package: str, marker: str = "register") -> None:
        self.package = package
        self.modules = {path.stem: parse(path, marker) for path in sorted(folder.glob("*.py"))}
        self._mro: dict[Key, list[Body]] = {}

    def body(self, stem: str, name: str) -> Body | None:
        """The class `name` means in module `stem`: its own, or one it imports from the package."""
        module = self.modules.get(stem)
        if module is None:
            return None
        if name in module.classes:
            return module.classes[name]
        if name in module.imported:
            return self.body(*module.imported[name])
        return None

    def base(self, stem: str, node: ast.expr) -> Body | None:
        """The package class a base expression names (`ScorerPress`, `base.Press`), or None (a class from
        elsewhere: `object`, `Generic[T]`)."""
        if isinstance(node, ast.Name):
            return self.body(stem, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            inside = self.modules[stem].modules.get(node.value.id)
            return None if inside is None else self.body(inside, node.attr)
        return None

    def mro(self, body: Body) -> list[Body]:
        """The class and its package bases in Python's method resolution order (C3)."""
        if body.key not in self._mro:
            bases = [found for node in body.bases if (found := self.base(body.key[0], node)) is not None]
            sequences = [list(self.mro(base)) for base in bases] + [bases]
            order = [body]
            while any(sequences):
                sequences = [sequence for sequence in sequences if sequence]
                head = next((sequence[0] for sequence in sequences
                             if not any(sequence[0] in other[1:] for other in sequences)), None)
                if head is None:
                    raise ValueError(f"{self.where(body)}: its bases have no consistent order")
                order.append(head)
                sequences = [sequence[1:] if sequence[0] is head else sequence for sequence in sequences]
            self._mro[body.key] = order
        return self._mro[body.key]

    def where(self, body: Body) -> str:
        return f"{self.package}.{body.key[0]}.{body.key[1]} (line {body.line})"

    def literal(self, body: Body, name: str, node: ast.expr | None) -> Any:
        """A declared value, which must be a literal."""
        try:
            if node is None:
                raise ValueError
            return ast.literal_eval(node)
        except ValueError:
            raise ValueError(f"{self.where(body)} declares '{name}' as something other than a literal; the registry "
                             f"reads it without importing the module: write {name} = <a literal> in the class "
                             "body") from None

    def facts(self, body: Body, names: Iterable[str]) -> dict[str, Any]:
        """The class's facts among `names`, each from the first class of its MRO that binds it (unbound: None)."""
        found = {}
        for name in names:
            owner = next((cls for cls in self.mro(body) if name in cls.names), None)
            found[name] = None if owner is None else self.literal(owner, name, owner.names[name])
        return found

    def declared(self, body: Body, facts: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
        """(name, truthy facts) of each name a registered class declares: its variants, or its name."""
        facts = tuple(facts)
        variants = body.names.get("variants")
        if "variants" in body.names:
            if not isinstance(variants, ast.Dict) or not all(isinstance(value, ast.Dict) for value in variants.values):
                raise ValueError(f"{self.where(body)}: variants must be written as {{name: {{argument: value}}}}")
            found = []
            for key, arguments in zip(variants.keys, variants.values):
                name = self.literal(body, "variants", key)
                given = {self.literal(body, "variants", argument): value
                         for argument, value in zip(arguments.keys, arguments.values)}  # type: ignore[union-attr]
                overridden = {fact: self.literal(body, f"variants['{name}']['{fact}']", given[fact])
                              for fact in facts if fact in given}  # the class's own need be no literal then
                own = self.facts(body, [fact for fact in facts if fact not in overridden])
                found.append((name, truthy({**own, **overridden})))
            return found
        name = self.literal(body, "name", body.names["name"]) if "name" in body.names else None
        if not isinstance(name, str):
            raise ValueError(f"{self.where(body)} is registered but declares no name: write name = \"…\" (or "
                             "variants = {name: {argument: value}}) in its class body")
        return [(name, truthy(self.facts(body, facts)))]

    def entries(self, facts: Iterable[str]) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, module, facts) of every registered class's names, by ORDER, then file, then as written."""
        found = []
        for module in sorted(self.modules.values(), key=lambda module: module.order):
            for body in module.classes.values():
                if body.registered:
                    found += [(name, f"{self.package}.{module.stem}", declared)
                              for name, declared in self.declared(body, facts)]
        return found


def truthy(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts that hold (a flag that is False, a setting of 0, None or "" is left out, as unset)."""
    return {name: value for name, value in facts.items() if value}
