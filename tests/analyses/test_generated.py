"""analyses/generated.py: a document's generated block holds what its generator gives from the code now — every press
written with an argument explained by its own `guide` — and the rendered page holds it without the markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, load

generated = load("generated")
slots = load("slots")


def test_every_generated_block_of_the_templates_is_what_the_code_gives() -> None:
    """Issue 37: a new press taking an argument touches its file and its test; its entry in docs/cache.md is written
    from its `guide` by `python analyses/readme.py --render` (this test says when that was not run)."""
    blocks = 0
    for template in (ROOT / "templates").rglob("*.md"):
        text = template.read_text()
        blocks += len(generated.BLOCK.findall(text))
        assert generated.refreshed(text) == text, \
            f"{template.relative_to(ROOT)}: a generated block is stale: run python analyses/readme.py --render"
    assert blocks >= 1


def test_a_press_with_an_argument_is_a_bullet_from_its_guide() -> None:
    from spectra.kv.presses import REGISTRY
    from spectra.registry import PRESSES

    text = generated.presses_with_argument()
    names = [name for name in PRESSES.listing().split(", ") if "(" in name]
    assert [line.split("`")[1] for line in text.splitlines() if line.startswith("- ")] == names
    assert all(len(line) <= generated.WIDTH for line in text.splitlines())
    assert "`knorm`, `snapkv`" in " ".join(text.split()) and "{scorers}" not in text
    assert " ".join(REGISTRY["mixed"].guide.split()) in " ".join(text.split())


def test_the_markers_are_refreshed_then_dropped_in_the_render(monkeypatch) -> None:
    monkeypatch.setitem(generated.GENERATORS, "demo", lambda: "- one\n- two\n")
    template = "# Page\n\nBefore.\n\n<!-- generated: demo -->\nstale\n<!-- /generated -->\n\nAfter.\n"
    fresh = generated.refreshed(template)
    assert fresh == "# Page\n\nBefore.\n\n<!-- generated: demo -->\n- one\n- two\n<!-- /generated -->\n\nAfter.\n"
    assert slots.clean(fresh) == "# Page\n\nBefore.\n\n- one\n- two\n\nAfter.\n"
    with pytest.raises(KeyError):
        generated.refreshed(template.replace("demo", "nosuch"))


def test_the_script_regenerates_before_it_renders(tmp_path: Path, monkeypatch) -> None:
    readme = load("readme")
    monkeypatch.setitem(generated.GENERATORS, "demo", lambda: "- fresh\n")
    monkeypatch.setattr(readme, "generated", generated)
    template = tmp_path / "templates" / "page.md"
    template.parent.mkdir()
    template.write_text("<!-- generated: demo -->\n- stale\n<!-- /generated -->\n")
    assert readme.main(["--documents", str(template), "--render"]) == 0
    assert (tmp_path / "page.md").read_text() == "- fresh\n" and "- fresh" in template.read_text()
