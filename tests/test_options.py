"""Options declared once: the flag, help and identity come from the dataclass field; split routes keywords."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spectra.options import declared, flag_of, identity, jsonable, option, split


@dataclass(frozen=True)
class Example:
    fit_samples: int = option(0, "Calibration sequences.")
    overlap: bool | None = option(None, "Overlap.", negative="--no-overlap", identity=False)
    budget: tuple[int, ...] = option((32, 64), "Projected dimensions.", flag="--budget", metavar="K,…")
    hidden: str = option("x", "Python only.", cli=False)
    plain: int = 3  # not an option: not declared


@dataclass(frozen=True)
class Other:
    seed: int = option(0, "Seed.")


def test_declarations_read_back_in_order_with_flags() -> None:
    found = list(declared(Example))
    assert [d.name for d in found] == ["fit_samples", "overlap", "budget", "hidden"], "plain fields are not options"
    by_name = {d.name: d for d in found}
    assert by_name["fit_samples"].flag == "--fit-samples" and by_name["fit_samples"].flags == ("--fit-samples",)
    assert by_name["overlap"].flags == ("--overlap/--no-overlap",) and by_name["overlap"].annotation == bool | None
    assert by_name["budget"].metavar == "K,…" and by_name["budget"].default == (32, 64)
    assert by_name["hidden"].cli is False and by_name["overlap"].identity is False
    assert flag_of(Example, "budget") == "--budget"
    with pytest.raises(KeyError):
        flag_of(Example, "plain")


def test_identity_leaves_out_what_changes_only_speed() -> None:
    assert identity(Example(fit_samples=4, overlap=True)) == {"fit_samples": 4, "budget": [32, 64], "hidden": "x"}
    assert jsonable(((1, 2), 3)) == [[1, 2], 3] and jsonable("a") == "a"


def test_split_routes_each_keyword_to_its_declaring_class() -> None:
    first, second = split({"seed": 1, "budget": (8,), "overlap": False}, Example, Other)
    assert first == {"budget": (8,), "overlap": False} and second == {"seed": 1}
    with pytest.raises(TypeError, match="unexpected keyword argument 'plain'"):
        split({"plain": 1}, Example, Other)
