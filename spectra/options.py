"""How an option is declared, once: a dataclass field that also says its command-line flag and help.

Every analysis declares its options as a frozen dataclass whose fields are made with `option(...)`; the run
configuration (`config.RunConfig`) is declared the same way. From these declarations alone the command line
builds each analysis's command (`cli`) and the Python API its keyword function (`api`), so an option is written
once, validated once (in the dataclass's `__post_init__`) and spelled the same from `--flag` to the field:
`--fit-samples` is the field `fit_samples` is the keyword `fit_samples=`.

Imports neither torch nor transformers: the command line reads these declarations before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: marks a field that the Python API takes but the command line does not show
NO_FLAG = ""


def option(default: Any, help: str, *, flag: str | None = None, negative: str | None = None,
           metavar: str | None = None, identity: bool = True, cli: bool = True) -> Any:
    """A dataclass field declaring one option: its default, its help (shown by `--help` and the API docstring),
    its flag (default: the field name with dashes, `fit_samples` → `--fit-samples`), the `negative` flag of a
    three-state switch (`--no-overlap`), and whether it is part of the run's identity (recorded in run.json and
    compared on --resume) and shown on the command line at all."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negative": negative,
                                                        "metavar": metavar, "identity": identity, "cli": cli})


@dataclass(frozen=True)
class Declared:
    """One declared option, read back from its dataclass: name, resolved type, default and metadata."""

    name: str
    annotation: Any
    default: Any
    help: str
    flag: str
    negative: str | None
    metavar: str | None
    identity: bool
    cli: bool

    @property
    def flags(self) -> tuple[str, ...]:
        """The command-line spellings: the flag, or the pair of a three-state switch."""
        return (f"{self.flag}/{self.negative}",) if self.negative else (self.flag,)


def declared(cls: type) -> Iterator[Declared]:
    """The options a dataclass declares with `option`, in declaration order, types resolved."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if "help" not in meta:
            continue
        flag = meta["flag"] or "--" + field.name.replace("_", "-")
        yield Declared(field.name, hints[field.name], field.default, meta["help"], flag, meta["negative"],
                       meta["metavar"], meta["identity"], meta["cli"])


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of the option `name` declared by `cls`."""
    for found in declared(cls):
        if found.name == name:
            return found.flag
    raise KeyError(name)


def split(values: dict[str, Any], *classes: type) -> list[dict[str, Any]]:
    """`values` (keyword → value) split into one dict per declaring class; a keyword no class declares is a
    TypeError, as for any Python function."""
    parts: list[dict[str, Any]] = [{} for _ in classes]
    owners = {found.name: i for i, cls in enumerate(classes) for found in declared(cls)}
    for name, value in values.items():
        if name not in owners:
            raise TypeError(f"unexpected keyword argument '{name}'")
        parts[owners[name]][name] = value
    return parts


def identity(instance: Any) -> dict[str, Any]:
    """The options of a declared dataclass that identify a run (all but those marked `identity=False`, which
    change how fast a run goes, not what it computes), as JSON-ready values: tuples as lists."""
    return {found.name: jsonable(getattr(instance, found.name)) for found in declared(type(instance))
            if found.identity}


def defaults(instance: Any) -> dict[str, Any]:
    """The declared defaults of the options `identity` records, as JSON-ready values: what a run recorded before an
    option existed ran with (absent from its run.json, compared as its default on --resume)."""
    return {found.name: jsonable(found.default) for found in declared(type(instance)) if found.identity}


def jsonable(value: Any) -> Any:
    """A tuple as a list (JSON has no tuples); anything else as it is."""
    return [jsonable(part) for part in value] if isinstance(value, tuple) else value
