"""Sections of the documents written from the code rather than from runs: between `<!-- generated: NAME -->` and
`<!-- /generated -->` (each on a line of its own) a template holds what the generator NAME returns now, and
`python analyses/readme.py` (or `--render`) rewrites it there before rendering the page; `--check` and
tests/analyses/test_generated.py fail where a template holds anything else. So a press taking an argument is explained
in docs/cache.md by its own `guide`, and a new one needs no hand-written entry.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable

#: a generated block: its name and what it holds now
BLOCK = re.compile(r"^<!-- generated: (\S+) -->\n(.*?)^<!-- /generated -->\n", re.M | re.S)
#: the width of a generated paragraph or bullet (the documents' own)
WIDTH = 118


def bullet(name: str, text: str) -> str:
    """`- `name`: text`, wrapped to `WIDTH` with the continuation indented under the text."""
    return textwrap.fill(f"- `{name}`: {text}", WIDTH, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def presses_with_argument() -> str:
    """A bullet for every press written `name(<argument>)`, as --help lists it, from the press's `guide` (its lists
    of scorers, decodable scorers and row scorers filled in from the registry)."""
    from spectra.kv.presses import REGISTRY
    from spectra.registry import PRESSES

    bare = PRESSES.bare()
    lists = {fact + "s": ", ".join(f"`{name}`" for name in bare if name in PRESSES.having(fact))
             for fact in ("scorer", "decodable", "rowscorer")}
    written = [name for name in PRESSES.listing().split(", ") if "(" in name]
    return "\n".join(bullet(name, REGISTRY[name.split("(")[0]].guide.format(**lists)) for name in written) + "\n"


def kvpress_registry() -> str:
    """A table of kvpress's evaluation registry (`spectra.kv.configurations`): each name as `--presses` writes it,
    kvpress's instance, spectra's expression and the settings it changes beside the class defaults (or what to write
    instead); then what each leaderboard preset expands to and what it leaves out."""
    from spectra.kv import configurations
    from spectra.registry import PRESSES

    rows = ["| name | kvpress's instance | spectra's press | settings (class default) |", "| --- | --- | --- | --- |"]
    for entry in configurations.REGISTRY.values():
        if not entry.expression:
            rows.append(f"| `{entry.written}` | `{entry.kvpress}` | — | {entry.instead} |")
            continue
        changed = "; ".join(f"{press} {key}={value} ({PRESSES.entries()[press].facts['fields'][key]})"
                            for press, values in entry.settings.items() for key, value in values.items())
        expression = entry.expression_of([f"<{part}>" for part in entry.parameters])
        rows.append(f"| `{entry.written}` | `{entry.kvpress}` | `{expression}` | {changed or 'defaults'} |")
    presets = [bullet(name, ", ".join(f"`{press}`" for press in presses))
               for name, presses in configurations.PRESETS.items()]
    left = ", ".join(f"`{name}`" for name in configurations.left_out())
    return "\n".join([*rows, "", *presets, "", textwrap.fill(
        f"The presets leave out the leaderboard's {left}: they take an artifact spectra fits (and a threshold), or "
        "spectra runs them otherwise or not at all (the table says how).", WIDTH, break_long_words=False,
        break_on_hyphens=False)]) + "\n"


#: generator name → the function writing its block
GENERATORS: dict[str, Callable[[], str]] = {"presses-with-argument": presses_with_argument,
                                            "kvpress-registry": kvpress_registry}


def refreshed(text: str) -> str:
    """`text` with every generated block holding what its generator gives now; an unknown name is a KeyError."""
    return BLOCK.sub(lambda found: f"<!-- generated: {found[1]} -->\n{GENERATORS[found[1]]()}<!-- /generated -->\n",
                     text)
