"""`spectra theorems`: Theorems 1 and 2 of the paper (JL projections) against a model's attention, or against
Gaussian q, k, v (`synthetic`): the empirical Pr(error ≤ ε) beside the bounds, and the errors of JL, the
truncated SVD and eq. 7.

Probes: `Theorem1Probe`, `Theorem2Probe`. Tables: theorem1.csv, theorem2.csv, pooled over layers and heads, and
their `_layers` and `_heads` versions. Loads as `runs.TheoremRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import RunConfig, check_budgets, check_eps
from ..errors import SpectraError, spell
from ..inputs import budgets_or_default, several
from ..options import identity, option
from ..reporter import Reporter
from .base import Analysis, register

DEFAULT_BUDGET = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class TheoremOptions:
    """The sweep of budgets (the JL dimension k) and of ε; `draws` random projections per sequence, or one fixed
    R per layer and budget (`fixed_projection`); `synthetic` i.i.d. Gaussian q, k, v of dimension `d` and `heads`
    heads instead of a model."""

    budget: tuple[int, ...] | None = option(None, "Budgets (the JL dimension k) to sweep, comma-separated, each ≤ n. "
                                            "Default 16,32,64,128,256.")
    eps: tuple[float, ...] = option((0.1, 0.2, 0.3, 0.5), "Relative errors ε in (0, 1), comma-separated.")
    draws: int = option(1, "Random projections R (and E, F) drawn per sequence, each seeded by the sequence's "
                        "index: Pr(error ≤ ε) comes with a 95% interval over sequences and the spread across draws.")
    fixed_projection: bool = option(False, "One R per layer and budget for the whole run instead (its Pr describes "
                                    "that one draw).")
    synthetic: bool = option(False, "Use i.i.d. Gaussian q, k, v instead of a model (with --d and --heads).")
    d: int = option(64, "Head dimension of --synthetic q, k, v.")
    heads: int = option(1, "Heads per --synthetic sample.")

    def __post_init__(self) -> None:
        if self.budget is not None:
            object.__setattr__(self, "budget", check_budgets(several(self.budget, spell("--budget"), int)))
        object.__setattr__(self, "eps", check_eps(several(self.eps, "--eps", float)))
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 1:
            raise SpectraError(f"{spell('--draws')} must be a positive integer, got {self.draws!r}")
        if self.fixed_projection and self.draws != 1:
            raise SpectraError(f"{spell('--fixed-projection', 'fixed_projection=True')} uses one R per layer and "
                               f"budget: it takes no {spell('--draws')}")
        if self.d < 1 or self.heads < 1:
            raise SpectraError(f"{spell('--d')} and {spell('--heads')} must be at least 1")

    def resolved(self, n: int) -> TheoremOptions:
        return replace(self, budget=check_budgets(budgets_or_default(self.budget, DEFAULT_BUDGET, n), n))

    def recorded(self) -> dict[str, Any]:
        """What run.json records: the sweep and the draws (the synthetic shape is in the settings)."""
        return {name: value for name, value in identity(self).items() if name not in ("synthetic", "d", "heads")}


class Theorems(Analysis):
    """Theorems 1 and 2 (JL projections) against reality: success probability vs bound, errors vs budget."""

    name = "theorems"
    run_type = "TheoremRun"
    summary = "Theorems 1 and 2 (JL projections) against reality: success probability vs bound, errors vs budget."
    options = TheoremOptions
    defaults = {"samples": 100}
    needs_model = False
    model_help = ("Hub id or model directory (omit with --synthetic), or a finished theorems run directory, to print "
                  "it again (and --plot it).")
    outputs = {"theorem1.csv": ("budget", "method"), "theorem2.csv": ("budget", "method")}

    def resolve(self, config: RunConfig, options: TheoremOptions) -> TheoremOptions:
        return options.resolved(config.length)

    def inspect(self, config: RunConfig, options: TheoremOptions) -> checkpoints.Source | None:
        """The model's files; none for Gaussian q, k, v."""
        if options.synthetic:
            check_nothing_to_read(config)
            return None
        if config.model is None:
            raise SpectraError(f"give a model, or pass {spell('--synthetic', 'synthetic=True')} for Gaussian q, k, v")
        return super().inspect(config, options)

    def settings(self, config: RunConfig, options: TheoremOptions) -> dict[str, Any]:
        if options.synthetic:
            return {"synthetic": True, "n": config.length, "d": options.d, "heads": options.heads,
                    "samples": config.samples, "batch_size": config.batch_size, "seed": config.seed}
        return config.settings(options.recorded())

    def target(self, config: RunConfig, options: TheoremOptions, found: checkpoints.Source | None) -> tuple[Path, str]:
        if options.synthetic:
            return Path("runs") / f"synthetic-n{config.length}-d{options.d}-theorems", "synthetic"
        return super().target(config, options, found)

    def source(self, config: RunConfig, options: TheoremOptions, where: Any):
        if options.synthetic:
            return synthetic_source(config, options, where)
        return super().source(config, options, where)

    def meta(self, config: RunConfig, options: TheoremOptions, source) -> dict[str, Any]:
        return {**options.recorded(), "synthetic": options.synthetic}

    def loaded(self, config: RunConfig, options: TheoremOptions, reporter: Reporter, source):
        """Synthetic q, k, v have no model to check again."""
        if options.synthetic:
            return self.probe(config, options, reporter, source)
        return super().loaded(config, options, reporter, source)

    def probe(self, config: RunConfig, options: TheoremOptions, reporter: Reporter, source):
        from ..probes import Probes
        from ..probes.theorems import Theorem1Probe, Theorem2Probe

        shape = (source.layers, source.heads, config.length, options.budget, options.eps)
        draw = dict(seed=config.seed, draws=options.draws, fixed=options.fixed_projection)
        return Probes(theorem1=Theorem1Probe(*shape, **draw), theorem2=Theorem2Probe(*shape, **draw))


def check_nothing_to_read(config: RunConfig) -> None:
    """Synthetic q, k, v read no model and no corpus: a model or corpus option given with them would be silently
    ignored, so it is refused (the corpus options count as given when they differ from their defaults)."""
    defaults = RunConfig()
    given = [spell(flag, name) for name, flag in (("model", "MODEL"), ("data", "--data"), ("split", "--split"),
                                                  ("text_column", "--text-column"), ("mode", "--mode"),
                                                  ("gguf_file", "--gguf-file"))
             if getattr(config, name) != getattr(defaults, name)]
    if given:
        raise SpectraError(f"{spell('--synthetic', 'synthetic=True')} draws Gaussian q, k, v and reads no model or "
                           f"corpus, but {', '.join(given)} {'was' if len(given) == 1 else 'were'} given; drop "
                           f"{'it' if len(given) == 1 else 'them'}, or drop {spell('--synthetic', 'synthetic=True')} "
                           "to measure the model")


def synthetic_source(config: RunConfig, options: TheoremOptions, where: Any):
    """Gaussian q, k, v as the loop's source (`sources.SyntheticSource`)."""
    from ..sources import SyntheticSource

    return SyntheticSource(config, options.d, options.heads, where)


register(Theorems())
