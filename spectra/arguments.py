"""How a registry name written with arguments reads them: `name(argument)` (`applied`), `name(a,b,…)` and the kinds its fact `several`
declares ("scorer,decodable": a scorer, then a decodable press; "press,press…": two or more presses, a last kind ending
in '…' repeating), how such a name is written in listings, and how the facts of its arguments merge into its own.

Torch-free and registry-free (`registry.Registry.resolve` applies it to its entries).
"""

from __future__ import annotations

import re
from typing import Any

#: `name(argument)`: a declared name applied to an argument (the argument may itself hold parentheses)
_APPLIED = re.compile(r"^([A-Za-z][\w-]*)\((.+)\)$", re.DOTALL)


def applied(name: str) -> tuple[str, str] | None:
    """('adakv', 'snapkv') for 'adakv(snapkv)'; None for a name without an argument."""
    match = _APPLIED.match(name.strip())
    return (match.group(1), match.group(2).strip()) if match else None

#: the facts that say what a name's arguments are, which the name with its arguments no longer has
ARGUMENT_FACTS = ("wraps", "argument", "check", "several", "refuses")


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


def written(name: str, single: str, several: str) -> str:
    """How `name` is written in listings: `adakv(<scorer>)` (its one argument `single`), `composed(<press>,<press>,...)`
    (`several`), or both forms: `prefill_decoding(<decodable>) or prefill_decoding(<scorer>,<decodable>)`."""
    kinds = [kind.strip() for kind in several.split(",") if kind.strip()]
    forms = [f"<{single}>"] if single or not kinds else []
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
    return held
