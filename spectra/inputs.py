"""What the front ends accept for an option before `spectra.config` checks it: the command line's comma-separated
lists, and the Python API's one value or several (budgets=64, methods="svd", eps=0.1, layers=3), paths as str or
`os.PathLike`, and defaults that, when they do not fit, say they were defaults rather than something typed.

Imports neither torch nor transformers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .errors import SpectraError, spell


def split_top(text: str) -> list[str]:
    """'a,b(c,d), e' → ['a', 'b(c,d)', 'e']: `text` cut at the commas outside parentheses, each part stripped (an
    argument list, or a comma-separated option whose values may be `name(a,b)`). Unbalanced parentheses raise
    ValueError."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth < 0:
            raise ValueError(f"'{text}' closes a parenthesis it never opened")
        if char == "," and depth == 0:
            parts.append(text[start:at].strip())
            start = at + 1
    if depth:
        raise ValueError(f"'{text}' leaves a parenthesis open")
    return parts + [text[start:].strip()]


def items(text: str, option: str) -> list[str]:
    """'a, b,c' → ['a', 'b', 'c']; '' → [] (an option given empty is no value); an empty item between commas
    ('a,,b', 'a,') is one line naming the option: a typo there would silently drop a value. Commas inside
    parentheses belong to their item (`--presses composed(snapkv,knorm),knorm`: two presses); unbalanced
    parentheses are one line too."""
    if not text.strip():
        return []
    try:
        parts = split_top(text)
    except ValueError as error:
        raise SpectraError(f"{spell(option)} {error}: close each '(' of a name with ')'") from None
    if not all(parts):
        raise SpectraError(f"{spell(option)} '{text}' has an empty item: separate its values by single commas, with "
                           "nothing after the last")
    return parts


def numbers(text: str, option: str, cast: type = int) -> list:
    """'32,64,128' → [32, 64, 128]; a malformed list is one line naming the option (its command-line spelling, or
    both spellings marked with `errors.spell`)."""
    parts = items(text, option)
    try:
        return [cast(part) for part in parts]
    except ValueError:
        expected = "integers, e.g. 32,64,128" if cast is int else "numbers, e.g. 0.1,0.2,0.3,0.5"
        raise SpectraError(f"{spell(option)} '{text}' is not a comma-separated list of {expected}") from None


def several(value: Any, option: str, cast: type | None = None) -> tuple:
    """What the Python API takes for an option that accepts several values: one value (64, "svd", 0.1) or several
    (a list, a tuple, or a comma-separated string "32,64"), as a tuple; `cast` (int, float) reads a string's parts.
    None is refused in one line: such an option has a default, which leaving it out gives."""
    if value is None:
        raise SpectraError(f"{spell(option)} takes one value or several, got None; leave it out for its default")
    if isinstance(value, str):
        if cast is not None:
            return tuple(numbers(value, option, cast))
        return tuple(items(value, option))
    if isinstance(value, Iterable):
        return tuple(value)
    return (value,)


def budgets_or_default(given: Any, default: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The budgets given (see `several`), or `default` when None; a default larger than n is refused saying it
    was the default (the user never typed it) and which budgets to pass instead."""
    if given is not None:
        return several(given, spell("--budget"), int)
    if max(default) > n:
        fitting = tuple(budget for budget in default if budget <= n) or (max(1, n // 4),)
        listed = ",".join(map(str, default))
        shown = ",".join(map(str, fitting))
        raise SpectraError(
            f"{spell('--budget')} defaults to {spell(listed, repr(default))}, more than "
            f"{spell(f'--length {n}', f'length={n}')}; pass {spell('--budget')} ≤ {n}, e.g. "
            f"{spell(f'--budget {shown}', f'budget={fitting[0] if len(fitting) == 1 else fitting}')}")
    return default


def path_text(value: str | os.PathLike | None) -> str | None:
    """A path given as str or `os.PathLike` (pathlib.Path) as a string; None stays None."""
    return None if value is None else os.fspath(value)


def utf8(raw: bytes, said: str, fix: str) -> str:
    """`raw` as UTF-8 text, or one line: `said` (the file as the message names it) is not UTF-8 text, the first bad
    byte and its line, then `fix` — so a text is never read with replacement characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise SpectraError(f"{said} is not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); {fix}") from None
