"""`mixed(RUN)`: every key/value head compressed along its own best axis — the mixed plan of issue 32, item 4.

RUN is a `spectra cache --bytes-kept` run (its directory, or its cache_axes.csv): per byte budget b, layer and
key/value head, the map names the (press, ratio) of the axis — tokens, key channels, rank or bits — whose output
error was lowest within b of the head's bytes (`spectra.kv.axes`). At ratio r this press plays the map's plan at the
budget b = 1 − r (a ratio whose budget the map lacks is refused): each layer is compressed by each press the plan
names for it, at that press's ratio, and each key/value head keeps the rows its own press left it. So a head may keep
614 tokens while its neighbour keeps all 1024 quantized to 4 bits: the rows are padded to the longest head and the
padding hidden (`Compressed.valid`), the kept positions are each head's own (every position for a head whose press
keeps every token), and `stored` is each head's bytes under its own press. Each head's bytes fit b where the map was
measured; on other text an allocation by the spectrum (lowrank) can move them a little: the tables report what each
cell stored.

The plan's presses run as the registry has them, uncalibrated (lowrank fits each context itself, its basis counted
in its bytes); presses whose rows are not context tokens (linformer) cannot share a cache with tokens and are refused.
"""

from __future__ import annotations

import torch

from ..axes import plan_budget, read_plan
from .base import REGISTRY, Compressed, Prefill, Press, full_memory, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 85


@register
class Mixed(Press):
    """`mixed(RUN)`: each key/value head its best axis at the budget 1 − ratio (see the module docstring)."""

    name, summary = "mixed", "each key/value head along its own best axis, from a spectra cache axis map"
    peer = ""
    guide = ("the axis map of a `spectra cache --bytes-kept` run played per key/value head (below): the ratio r plays "
             "the map's plan at the byte budget 1 − r, and a ratio whose budget the map lacks is refused.")
    argument, check = "cache run", "spectra.kv.axes:check_plan"
    ratio_means = "one minus the byte budget it plays from its axis map"

    def __init__(self, plan=None, where: str = "") -> None:
        self.plan, self.where = plan, where
        if plan is not None:
            self.name = f"mixed({where})"  # type: ignore[misc]

    def bind(self, argument: str) -> Mixed:
        """The press playing the axis map of the cache run `argument`."""
        return Mixed(read_plan(argument), argument)

    def fresh(self) -> Press:
        return self

    def choices(self, layer: int, kv_heads: int, ratio: float) -> list[tuple[str, float]]:
        """(press, ratio) of each key/value head of `layer` at the budget 1 − `ratio`."""
        if self.plan is None:
            raise ValueError("mixed needs an axis map: name it as mixed(<cache run>)")
        budgets = sorted(set(self.plan["budget"]))
        budget = plan_budget(budgets, ratio)
        if budget is None:  # the cache kind refuses such ratios before the model loads (axes.check_plan_ratios)
            raise ValueError(f"the axis map in {self.where} has budgets {', '.join(f'{b:g}' for b in budgets)}; "
                             f"ratio {ratio:g} asks for {1 - ratio:g}")
        rows = self.plan[(self.plan["budget"] == budget) & (self.plan["layer"] == layer)].set_index("kv_head")
        if sorted(rows.index) != list(range(kv_heads)):
            raise ValueError(f"the axis map in {self.where} does not plan the {kv_heads} key/value heads of layer "
                             f"{layer}")
        return [(str(rows.loc[head, "press"]), float(rows.loc[head, "ratio"])) for head in range(kv_heads)]

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        chosen = self.choices(prefill.layer, prefill.kv_heads, ratio)
        parts = {}
        for press, press_ratio in dict.fromkeys(chosen):
            part = REGISTRY[press].fresh().compress(prefill, press_ratio)
            if part.kept is None:
                raise ValueError(f"{press}'s rows are not context tokens: a mixed plan cannot hold them")
            parts[(press, press_ratio)] = part
        return combine(prefill, [parts[choice] for choice in chosen])


def combine(prefill: Prefill, parts: list[Compressed]) -> Compressed:
    """One cache whose key/value head h is head h of `parts[h]`: its valid rows first, padded with its last row up
    to the longest head, its positions, its bytes."""
    counts = [int(part.counts()[head]) for head, part in enumerate(parts)]
    width, heads = max(counts), prefill.kv_heads
    kept = torch.zeros(heads, width, dtype=torch.long, device=prefill.key.device)
    key = prefill.key.new_zeros(heads, width, prefill.key.shape[-1])
    value = prefill.value.new_zeros(heads, width, prefill.value.shape[-1])
    valid = torch.zeros(heads, width, dtype=torch.bool, device=prefill.key.device)
    stored = torch.zeros(heads, dtype=torch.int64)
    for head, (part, count) in enumerate(zip(parts, counts)):
        rows = part.rows(prefill.key, prefill.value)
        for target, source in ((kept, part.kept), (key, rows[0]), (value, rows[1])):
            target[head, :count] = source[head, :count]
            target[head, count:] = source[head, count - 1]
        valid[head, :count] = True
        stored[head] = part.memory(prefill)[head]
    saved = 1.0 - float(stored.sum()) / (heads * full_memory(prefill))
    return Compressed(kept, saved, key=key, value=value, valid=None if bool(valid.all()) else valid, stored=stored)
