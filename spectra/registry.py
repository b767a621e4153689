"""One small generic registry for what spectra has several of — analyses, methods, presses — listable without torch.

A `Registry[T]` maps names to objects. Its entries come three ways:

- *declared* (methods, presses): a press or a method is its class, registered by its module (`@register`), stating
  in its body, as literals, its name (`name = "snapkv"`, or `variants = {"kivi2": {"bits": 2}, …}`) and its facts
  (class attributes named as the registry's `facts`, inherited from its bases; with those they imply, `derive`); its
  module's `ORDER` places it in listings. Read from the package's syntax trees (`spectra.declarations`), never
  importing the modules, so `--help` lists them and an unknown name is refused in milliseconds, without torch. The
  object is imported on first use; `add` refuses one whose facts differ from what its class was read to declare.
- *added* (analyses): the objects themselves, registered by importing their (torch-free) modules.
- *imported* (task families): torch-free modules registering their objects as they load, with the facts the objects
  state; the first listing imports them all, sorted by the fact `order` names.

A declared name may take an *argument*, `name(argument)`: its facts say what — `wraps: "scorer"`, another name having
that fact (whose facts it inherits), or `argument: "pattern"` checked by the torch-free `check: "module:function"` —;
or *several*, `name(a,b,…)`: `several` lists their kinds ('press,press…': names used alone, none having a fact of its
`refuses`, said in words by `said`), its facts merging theirs. `registry[name]` is the registered object's
`bind(argument)` (or `bind(a, b, …)`), made once. A *configured* name (`configurations`: kvpress's registry names,
`kvpress:expected_attention`) is an expression with settings of its presses' `fields`. Modelled on
lm-evaluation-harness's `Registry[T]` (lazy "module:object" placeholders until first use).
"""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .declarations import Package
from .errors import SpectraError
from .arguments import (ARGUMENT_FACTS, PRESS_SAID, agrees, applied, called_empty, either, kinds_of, merge_fact,
                        needed, not_one, number_of, plural, several_kinds, takes_argument, wrapped_entry, written)
from .inputs import split_top

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """A declared name: the module that registers it and its facts (flags such as `causal`, or its `family`)."""

    name: str
    module: str
    facts: Mapping[str, Any] = field(default_factory=dict)


class Registry(Mapping[str, T]):
    """Name → object (see the module docstring). Iterating, `len`, `in`, `names`, `facts` and `having` read the
    declarations only; indexing imports the object's module when it has not loaded yet."""

    def __init__(self, what: str, package: str | None = None, *, imported: bool = False, order: str | None = None,
                 facts: tuple[str, ...] = (), identity: tuple[str, ...] = (), configurations: str = "",
                 said: Mapping[str, str] | None = None, derive: str = "") -> None:
        self.what, self.package, self.imported, self.order = what, package, imported, order
        #: torch-free modules: `configurations` names configured instances (`configured(name)`: expression, settings,
        #: identity facts or None; `build(registry, name)`: kv/configurations.py); `derive`'s `held(facts)` are the
        #: facts an entry holds because of those it declares, its `SAID` their words (kv/passes.py: passes read)
        self.configurations, self.derive = configurations, derive
        self._said = dict(said or {})  # fact → what a name having it does, in a user's words (`said`)
        #: the class attributes a declared entry's class states as its facts
        self.fact_names = facts
        #: the facts that say what a name is (its summary, its peer): `name(argument)` never takes them from the name
        #: it wraps (adakv(snapkv) is AdaKVPress, not SnapKVPress)
        self.identity = identity
        self._objects: dict[str, T] = {}
        self._added: dict[str, Entry] = {}
        self._declared: dict[str, Entry] | None = None
        self._applied: dict[str, Entry] = {}  # names with an argument met so far (`resolve`)

    def entries(self) -> dict[str, Entry]:
        """Every entry in listing order: declared ones by their module's ORDER, file and order written; then added."""
        if self._declared is None:
            self._declared = {}
            folder = None if self.package is None else Path(__file__).parent.joinpath(*self.package.split(".")[1:])
            if folder is not None and self.imported:  # each module `add`s its objects as it loads
                for path in sorted(folder.glob("*.py")):
                    if path.stem != "__init__":
                        importlib.import_module(f"{self.package}.{path.stem}")
            elif folder is not None:
                for name, module, facts in Package(folder, self.package).entries(self.fact_names):
                    if name in self._declared:
                        raise ValueError(f"{self.what} '{name}' is declared twice")
                    self._declared[name] = Entry(name, module, self.held(facts))
        added = self._added
        if self.order is not None:
            added = dict(sorted(added.items(), key=lambda item: item[1].facts.get(self.order, float("inf"))))
        return {**self._declared, **added}

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries())

    def bare(self) -> tuple[str, ...]:
        """The names usable as they are (those taking no argument)."""
        return tuple(name for name, entry in self.entries().items() if not takes_argument(entry))

    def listing(self) -> str:
        """Every name for --help, those taking an argument as `adakv(<scorer>)`."""
        return ", ".join(self.listing_of(name) if takes_argument(entry) else name
                         for name, entry in self.entries().items())

    def resolve(self, name: str) -> Entry:
        """The entry of a declared name, or of `name(argument)` — its facts the name's (without `wraps`, `argument`
        and `check`) over those of the name it wraps (without the facts any `wraps` asks for: adakv(snapkv) is
        windowed but no scorer, decoding(knorm) neither a scorer nor decodable; nor its `identity`: adakv(snapkv)'s
        summary and peer are adakv's). A bad argument raises SpectraError (one line); an unknown name KeyError."""
        entries = self.entries()
        if name in entries:
            return entries[name]
        if name in self._applied:
            return self._applied[name]
        found = self.configuration(name)
        if found is not None:  # a configured name: its expression's facts, its own identity
            inner = self.resolve(found[0])
            own = {key: value for key, value in inner.facts.items() if key not in self.identity}
            self._applied[name] = Entry(name, inner.module, self.held({**own, **found[2]}))
            return self._applied[name]
        parts = applied(name)
        if parts is None or parts[0] not in entries or not takes_argument(entries[parts[0]]):
            raise KeyError(name)
        base, argument = entries[parts[0]], parts[1]
        own = {key: value for key, value in base.facts.items() if key not in ARGUMENT_FACTS}
        wraps = base.facts.get("wraps")
        arguments = self.arguments(name, base, argument)
        if base.facts.get("several") and (len(arguments) > 1 or not wraps):
            kinds = several_kinds(str(base.facts.get("several", "")), len(arguments))
            if kinds is None:
                raise SpectraError(f"{self.what} '{name}': {base.name} is written {self.listing_of(base.name)}")
            merged: dict[str, Any] = {}
            for position, (inner, kind) in enumerate(zip(arguments, kinds), 1):
                if position < len(arguments) and inner in entries and entries[inner].facts.get("mixes"):
                    raise SpectraError(f"{self.what} '{name}': {inner}'s rows mix the context's tokens, which no "
                                       f"{self.what} after it can read as tokens; put {inner} last")
                for key, value in self.argument_facts(name, base, inner, kind, position).items():
                    merged[key] = merge_fact(merged.get(key), value)
            facts = {**merged, **own}
        elif wraps:
            wrapped = wrapped_entry(self, name, base, argument)
            asked = {entry.facts.get("wraps") for entry in entries.values()}  # a wrapped name is no kind a name wraps
            inner = {key: value for key, value in wrapped.facts.items()
                     if key not in asked and key not in self.identity}
            facts = {**inner, **own}
        else:
            module, function = base.facts["check"].split(":")
            getattr(importlib.import_module(module), function)(argument)  # raises SpectraError on a bad argument
            facts = own
        found = self._applied[name] = Entry(name, base.module, self.held(facts))
        return found

    @property
    def said(self) -> dict[str, str]:
        return {**self._said, **(importlib.import_module(self.derive).SAID if self.derive else {})}

    def held(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """`facts` and those they imply (`derive`)."""
        return {**facts, **(importlib.import_module(self.derive).held(facts) if self.derive else {})}

    def configuration(self, name: str) -> tuple[str, Mapping[str, Any], Mapping[str, Any]] | None:
        """(expression, settings, identity facts) of a configured name; None for any other (SpectraError: a
        configured name refused)."""
        return importlib.import_module(self.configurations).configured(name, self) if self.configurations else None

    def arguments(self, name: str, base: Entry, argument: str) -> list[str]:
        """The arguments of `name` (`base`(`argument`)): one, or several cut at top-level commas for a name taking
        several (`composed(snapkv,knorm)`); an empty one is refused in one line."""
        try:
            arguments = split_top(argument) if base.facts.get("several") else [argument]
        except ValueError as error:
            raise SpectraError(f"{self.what} '{name}': {error}") from None
        if not all(arguments):
            raise SpectraError(f"{self.what} '{name}' has an empty argument: {base.name} is written "
                               f"{self.listing_of(base.name)}")
        return arguments

    def argument_facts(self, name: str, base: Entry, argument: str, kind: str, position: int) -> dict[str, Any]:
        """The facts `argument` hands `name` as its argument number `position` of `kind` (a fact the argument must
        have; 'press': any name used alone), refused in one line when it is none or has a fact `base` refuses."""
        entries = self.entries()
        refused = [fact.strip() for fact in str(base.facts.get("refuses", "")).split(",") if fact.strip()]

        def fits(entry: Entry) -> bool:
            if any(entry.facts.get(fact) for fact in refused):
                return False
            return not takes_argument(entry) if kind == "press" else bool(entry.facts.get(kind))

        if argument not in entries or not fits(entries[argument]):
            fitting = [other for other, entry in entries.items() if fits(entry)]
            known = argument in entries or (applied(argument) or ("",))[0] in entries
            wanted = (f"{plural(self.what)} named alone" if kind == "press" else
                      f"a {kind} {self.what} as argument {position}") + (
                f", none that {either(self.said, refused)}" if refused else "")
            has = [fact for fact in refused if argument in self and self.resolve(argument).facts.get(fact)]
            why = not_one(self.said, has, kind == "press" and argument not in entries) if known else "unknown"
            raise SpectraError(f"{self.what} '{name}': {base.name} takes {wanted}, and '{argument}' is {why}; "
                               f"{plural(kind)}: {', '.join(fitting)}")
        asked = {entry.facts.get("wraps") for entry in entries.values()} | {
            kind for entry in entries.values() for kind in kinds_of(str(entry.facts.get("several", "")))}
        return {key: value for key, value in entries[argument].facts.items()
                if key not in asked and key not in self.identity}

    def needs(self, name: str) -> str:
        """What `name`, which takes an argument, needs, with an example (`arguments.needed`)."""
        facts, entries = self.entries()[name].facts, self.entries()
        kinds = kinds_of(str(facts.get("several", "")))
        kind = facts.get("wraps") or (kinds or [""])[0]
        fitting = list(self.bare()) if kind == self.what else [n for n, e in entries.items() if e.facts.get(kind)]
        return needed(name, self.what, kind, fitting, 1 if facts.get("wraps") else len(kinds), self.listing_of(name),
                      str(facts.get("number") or ""))

    def listing_of(self, name: str) -> str:
        """How a name taking an argument is written: `adakv(<scorer>)`, `composed(<press>,<press>,...)`,
        `prefill_decoding(<decodable>) or prefill_decoding(<scorer>,<decodable>)` (its one-argument form first)."""
        facts = self.entries()[name].facts
        return written(name, facts.get("wraps") or facts.get("argument") or "", str(facts.get("several", "")),
                       str(facts.get("number") or ""))

    def facts(self, name: str) -> Mapping[str, Any]:
        return self.resolve(name).facts

    def having(self, fact: str) -> frozenset[str]:
        """The names whose `fact` is true: the declared ones, and the names with an argument resolved so far."""
        return frozenset(name for name, entry in {**self.entries(), **self._applied}.items() if entry.facts.get(fact))

    def most(self, fact: str) -> int:
        """The largest value a declared name gives the numeric `fact` (0 where none gives it): the widest window a
        press reads, say."""
        return max((int(entry.facts.get(fact, 0)) for entry in self.entries().values()), default=0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self.entries())

    def __contains__(self, name: object) -> bool:
        if name in self.entries():
            return True
        try:
            return isinstance(name, str) and (applied(name) is not None or self.configuration(name) is not None) \
                and bool(self.resolve(name))
        except (KeyError, SpectraError):
            return False

    def add(self, name: str, obj: T, **facts: Any) -> T:
        """Register `obj` under `name` (once). A declared name must be added with the facts its class declares."""
        if name in self._objects:
            raise ValueError(f"{self.what} '{name}' is registered twice")
        declared = self.entries().get(name)
        if self.package is not None and not self.imported:
            if declared is None:
                raise ValueError(f"{self.what} '{name}' is registered without a declaration: its class, decorated "
                                 "@register, names it (name = \"…\" or variants = {name: {…}}) in its body")
            differing = {key: value for key, value in facts.items()
                         if not agrees(value, declared.facts.get(key), key in declared.facts, name)}
            if differing:
                raise ValueError(f"{self.what} '{name}' declares {dict(declared.facts)} but is {differing}")
        else:
            self._added[name] = Entry(name, type(obj).__module__, self.held(facts))
        self._objects[name] = obj
        return obj

    @contextlib.contextmanager
    def extended(self, objects: Mapping[str, tuple[T, Mapping[str, Any]]]) -> Iterator[None]:
        """Objects no module declares (name → (object, facts)), registered inside the block only: a recipe's own
        variants (analyses/schedules.py's scheduled presses) that no command offers."""
        for name, (obj, facts) in objects.items():
            if name in self:
                raise ValueError(f"{self.what} '{name}' is registered already")
            self._added[name] = Entry(name, type(obj).__module__, self.held(facts))
            self._objects[name] = obj
        try:
            yield
        finally:
            for name in objects:
                self._added.pop(name, None)
                self._objects.pop(name, None)

    def __getitem__(self, name: str) -> T:
        if name not in self._objects and self.configuration(name) is not None:
            self.resolve(name)
            self._objects[name] = importlib.import_module(self.configurations).build(self, name)
        if name not in self._objects and name not in self.entries() and applied(name) is not None:
            self.resolve(name)  # KeyError or SpectraError for an unknown name or a bad argument
            base, argument = applied(name)  # type: ignore[misc]
            wraps = self.entries()[base].facts.get("wraps")
            facts = self.entries()[base].facts
            if facts.get("several") and (len(split_top(argument)) > 1 or not wraps):
                inner = [self[part] for part in split_top(argument)]
                self._objects[name] = self[base].bind(*inner)  # type: ignore[attr-defined]
            else:  # the press it wraps (then its number: dms(<scorer>,<threshold>)), or the argument's text
                inner, *number = number_of(name, argument, facts["number"]) if facts.get("number") else (argument,)
                self._objects[name] = self[base].bind(self[inner] if wraps else inner, *number)  # type: ignore
        if name not in self._objects:
            entry = self.entries()[name]  # KeyError for an unknown name, as a dict
            importlib.import_module(entry.module)
            if name not in self._objects:
                raise ValueError(f"{entry.module} declares the {self.what} '{name}' but does not register it")
        return self._objects[name]

    def __setitem__(self, name: str, obj: T) -> None:
        """Stand another object in for a registered name (a test's recording press); the name must exist."""
        if name not in self:
            raise KeyError(f"no {self.what} '{name}' to replace")
        self._objects[name] = obj

    def load(self) -> dict[str, T]:
        """Every object, in listing order (imports every module)."""
        return {name: self[name] for name in self}

    def groups(self, fact: str) -> dict[str, tuple[str, ...]]:
        """Names gathered by the value of `fact` (a method's family → its labels), in listing order."""
        found: dict[str, list[str]] = {}
        for name, entry in self.entries().items():
            found.setdefault(entry.facts.get(fact, name), []).append(name)
        return {group: tuple(names) for group, names in found.items()}


def chosen(names: Iterable[str], registry: Registry[Any], *, group: str | None = None, example: str,
           flag: str, listed: Iterable[str] | None = None) -> tuple[str, ...]:
    """Registry names from user input, in the order given, once each: a name or, with `group`, a group meaning all
    its names (`linformer`: four). An unknown name is one line listing the valid ones (`listed`, default all)."""
    groups = registry.groups(group) if group else {}
    picked: list[str] = []
    for name in names:
        name = name.strip()
        registry.configuration(name)  # a configured name refused: its own line
        empty = called_empty(name)
        if empty in registry.entries() and takes_argument(registry.entries()[empty]):
            raise SpectraError(f"{registry.what} '{name}' has no argument: {registry.needs(empty)}")
        if (applied(name) is not None or empty) and name not in registry.entries():
            base = registry.entries().get(empty or applied(name)[0])  # type: ignore[index]
            if base is not None and not takes_argument(base):
                taking = [registry.listing_of(other) for other, entry in registry.entries().items()
                          if takes_argument(entry)]
                raise SpectraError(f"{registry.what} '{base.name}' takes no argument (in '{name}'); "
                                   f"{plural(registry.what)} taking one: {', '.join(taking)}")
            with contextlib.suppress(KeyError):
                registry.resolve(name)  # a bad argument: its own line
        elif name in registry.entries() and takes_argument(registry.entries()[name]):
            raise SpectraError(f"{registry.what} '{name}' takes an argument: {registry.listing_of(name)}")
        found = groups.get(name) or ((name,) if name in registry else ())
        if not found:
            valid = ", ".join(listed) if listed is not None else registry.listing()
            raise SpectraError(f"unknown {registry.what} '{name}'; valid {plural(registry.what)}: {valid}")
        picked += [label for label in found if label not in picked]
    if not picked:
        raise SpectraError(f"no {registry.what} given; pass e.g. {flag} {example}")
    return tuple(picked)


#: the approximation methods of `spectra approx` (spectra/methods/, one file a family) and their facts (`Method`)
METHODS: Registry[Any] = Registry("method", "spectra.methods", facts=("family", "causal", "calibrates"))
#: the KV-cache presses (spectra/kv/presses/, one file a family) and their facts (`kv.presses.base.Press` says each)
PRESSES: Registry[Any] = Registry("press", "spectra.kv.presses", said=PRESS_SAID, facts=(
    "needs_rope", "windowed", "calibrates", "reads", "scorer", "decodable", "rowscorer", "decodes", "reads_question",
    "mixes", "window", "interval", "wraps", "argument", "check", "several", "refuses", "number", "axis", "ratio_means",
    "min_context", "across_layers", "renumbers", "summary", "peer", "fields"), identity=("summary", "peer", "fields"),
    configurations="spectra.kv.configurations", derive="spectra.kv.passes")
#: the long-context tasks of `spectra tasks` and task files (spectra/kv/tasks/families/, one file a family, each task
#: registered with its family and seed number, the listing's order)
TASKS: Registry[Any] = Registry("task", "spectra.kv.tasks.families", imported=True, order="number")


def method_labels(names: Iterable[str]) -> tuple[str, ...]:
    """Method labels from user names: a label, or a family meaning all its labels (`linformer`: four)."""
    valid = sorted({*METHODS.groups("family"), *METHODS.names()})
    return chosen(names, METHODS, group="family", example="svd,jl,linformer,pool-mean", flag="--methods",
                  listed=valid)


def method_listing() -> str:
    """The families, then the labels that are not a family of their own, for `--help`."""
    families = METHODS.groups("family")
    return ", ".join([*families, *(label for label in METHODS.names() if label not in families)])


ALL = "all"  # what `--presses` takes for every press named alone


def press_presets(names: Iterable[str]) -> list[str]:
    """`names` with `ALL` and each preset of `kv.configurations` replaced by its list, nothing else checked: what a
    run records of --presses before any press is built (a press reading a run directory not made yet included)."""
    from .kv import configurations

    return configurations.expanded(names, {ALL: PRESSES.bare()}, PRESSES)


def press_names(names: Iterable[str]) -> tuple[str, ...]:
    """Press names from user input, in the order given, once each; `ALL`: every press named alone; a preset of
    `kv.configurations`: its list (kvpress's leaderboard); `kvpress:<name>`: a name of kvpress's registry."""
    from .kv import configurations

    return chosen(press_presets(names), PRESSES, example=",".join(PRESSES.bare()[:3]), flag="--presses",
                  listed=(PRESSES.listing(), f"{ALL} (every press named alone)", *configurations.LISTED))
