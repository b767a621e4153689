"""How a registry name written with arguments reads them: `name(argument)` (`applied`), `name(a,b,…)` and the kinds
its fact `several` declares ("scorer,decodable": a scorer, then a decodable press; "press,press…": two or more
presses, a last kind ending in '…' repeating), how such a name is written in listings, how the facts of its arguments
merge into its own, and how a refusal of its arguments says what they need in a user's words (`either`, `not_one`,
`needed`), never by a fact's name.

Torch-free and registry-free (`registry.Registry.resolve` applies it to its entries).
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import SpectraError
from .inputs import split_top

#: `name(argument)`: a declared name applied to an argument (the argument may itself hold parentheses); `name()`
_APPLIED, _EMPTY = re.compile(r"^([A-Za-z][\w-]*)\((.+)\)$", re.DOTALL), re.compile(r"^([A-Za-z][\w-]*)\(\s*\)$")


def applied(name: str) -> tuple[str, str] | None:
    """('adakv', 'snapkv') for 'adakv(snapkv)'; None for a name without an argument."""
    match = _APPLIED.match(name.strip())
    return (match.group(1), match.group(2).strip()) if match else None


def called_empty(name: str) -> str | None:
    """'adakv' for 'adakv()' (parentheses with nothing in them); None for any other name."""
    match = _EMPTY.match(name.strip())
    return match.group(1) if match else None

#: the facts that say what a name's arguments are, which the name with its arguments no longer has (`number`: a name
#: wrapping another takes a number after it, `dms(<scorer>,<threshold>)`, and names what it is)
ARGUMENT_FACTS = ("wraps", "argument", "check", "several", "refuses", "number")


def kinds_of(several: str) -> list[str]:
    """'press,press…' → ['press', 'press']: the kinds a `several` fact names, the repeat mark dropped."""
    return [kind.strip().rstrip("…") for kind in several.split(",") if kind.strip()]


def several_kinds(several: str, count: int) -> tuple[str, ...] | None:
    """The kinds of `count` arguments of a name whose `several` fact is `several`, or None when it takes another
    count ('scorer,decodable' takes two; 'press,press…' two or more)."""
    kinds = [kind.strip() for kind in several.split(",") if kind.strip()]
    if not kinds:
        return None
    if kinds[-1].endswith("…"):
        fixed = kinds[:-1]
        return tuple(fixed + [kinds[-1].rstrip("…")] * (count - len(fixed))) if count > len(fixed) else None
    return tuple(kinds) if count == len(kinds) else None


def written(name: str, single: str, several: str, number: str = "") -> str:
    """How `name` is written in listings: `adakv(<scorer>)` (its one argument `single`), `dms(<scorer>,<threshold>)`
    (a `number` after it), `composed(<press>,<press>,...)` (`several`), or both forms: `prefill_decoding(<decodable>)
    or prefill_decoding(<scorer>,<decodable>)`."""
    kinds = [kind.strip() for kind in several.split(",") if kind.strip()]
    forms = [f"<{single}>" + (f",<{number}>" if number else "")] if single or not kinds else []
    if kinds:
        forms.append(",".join(f"<{kind.rstrip('…')}>,..." if kind.endswith("…") else f"<{kind}>" for kind in kinds))
    return " or ".join(f"{name}({form})" for form in forms)


def merge_fact(held: Any, value: Any) -> Any:
    """One fact of several arguments together: a flag any of them sets, the largest number (a window, the fewest
    context tokens), the first text."""
    if held is None:
        return value
    if isinstance(value, bool) or isinstance(held, bool):
        return bool(held) or bool(value)
    if isinstance(value, (int, float)) and isinstance(held, (int, float)):
        return max(held, value)
    if isinstance(value, tuple) and isinstance(held, tuple):  # the passes any of them reads
        return tuple(dict.fromkeys(held + value))
    return held


def agrees(value: Any, declared: Any, stated: bool, name: str) -> bool:
    """Whether an object's fact agrees with its declaration: equal to the fact stated, or, unstated, not holding
    (False, 0, None, "") or a group that is the name itself."""
    return value == declared if stated else (not value or value == name)


#: what a press having the fact does, as a refusal says it (`composed(...)` refuses such presses as its arguments);
#: the prefill passes a press reads say their own (`kv.passes.SAID`)
PRESS_SAID = {"decodes": "compresses while decoding", "calibrates": "is fitted on calibration text"}


def either(said: dict[str, str], facts: list[str]) -> str:
    """What names having any of `facts` do (`said`: fact → words; a fact without words is named as it is):
    "compresses while decoding, … or takes gradients"."""
    words = [said.get(fact, f"is {fact}") for fact in facts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def not_one(said: dict[str, str], found: list[str], with_argument: bool) -> str:
    """Why a known name is not the argument wanted: what it does of the refused facts it has (`found`), that it is
    written with an argument where a name alone is wanted, or plainly not one."""
    if found:
        return f"not one: it {' and '.join(said.get(fact, f'is {fact}') for fact in found)}"
    return "not one: it is written with an argument" if with_argument else "not one"


def number_of(name: str, argument: str, number: str) -> tuple[str, float]:
    """('kvzap(DIR)', -6.0) for the argument 'kvzap(DIR),-6' of a name taking a press and then a `number` (its words:
    'threshold'); one line (SpectraError) where there is no number after the press, or it is not a finite number."""
    try:
        parts = split_top(argument)
    except ValueError as error:
        raise SpectraError(f"press '{name}': {error}") from None
    base = name.split("(")[0]
    if len(parts) != 2 or not all(parts):
        raise SpectraError(f"press '{name}': {base} takes the press it wraps and then one {number}, e.g. "
                           f"{base}({parts[0] or 'knorm'},-6)")
    try:
        value = float(parts[1])
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SpectraError(f"press '{name}': its {number} '{parts[1]}' is not a finite number")
    return parts[0], value


def takes_argument(entry: Any) -> bool:
    """Whether a declared name (a registry `Entry`) is used as `name(argument)` (or `name(a,b,…)`)."""
    return bool(entry.facts.get("wraps") or entry.facts.get("argument") or entry.facts.get("several"))


def wrapped_entry(registry: Any, name: str, base: Any, argument: str) -> Any:
    """The entry of the name `name` (`base` wrapping `argument`, followed by its `number` where `base` takes one)
    wraps, from `registry`: a name used alone or with its own argument (`kvzap(DIR)`) having the fact `base` wraps;
    refused in one line otherwise (unknown, not one, or a name written with an argument given without)."""
    entries, wraps = registry.entries(), str(base.facts["wraps"])
    if base.facts.get("number"):  # dms(<scorer>,<threshold>): the press, then a number
        argument = number_of(name, argument, str(base.facts["number"]))[0]
    inner = applied(argument)
    found = entries.get(argument) or (registry.resolve(argument) if inner and inner[0] in entries else None)
    if found is None or not found.facts.get(wraps) or (argument in entries and takes_argument(found)):
        fitting = [registry.listing_of(other) if takes_argument(entry) else other
                   for other, entry in entries.items() if entry.facts.get(wraps)]
        why = ("unknown" if found is None else "not one" if not found.facts.get(wraps) else
               f"written {registry.listing_of(argument)}")
        raise SpectraError(f"{registry.what} '{name}': {base.name} wraps a {wraps} {registry.what}, and '{argument}' "
                           f"is {why}; {plural(wraps)}: {', '.join(fitting)}")
    return found


def plural(word: str) -> str:
    """'press' → 'presses', 'scorer' → 'scorers'."""
    return word + ("es" if word.endswith("s") else "s")


def needed(name: str, what: str, kind: str, fitting: list[str], count: int, listing: str, number: str = "") -> str:
    """What `name`, written with nothing in its parentheses, needs: `count` arguments of `kind` (one `what`: a name
    wrapping another; several: `what`s), with an example from `fitting` (the names that fit) — "adakv needs a scorer
    press as its argument, e.g. adakv(streaming); scorers: …"; `listing`: how it is written."""
    if not fitting:
        return f"{name} needs an argument: {listing}"
    if number:
        return f"{name} needs a {kind} {what} and its {number}: {listing}, e.g. {name}({fitting[0]},<{number}>)"
    if count == 1:
        return (f"{name} needs a {kind} {what} as its argument, e.g. {name}({fitting[0]}); {plural(kind)}: "
                f"{', '.join(fitting)}")
    return f"{name} needs {plural(what)} as its arguments, e.g. {name}({','.join(fitting[:count])}): {listing}"
