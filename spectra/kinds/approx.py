"""`spectra approx`: how well each method stands in for a model's attention at each budget, per head on the
model's own q, k, v and, with `end_to_end`, substituted into the forward pass.

Probes: `Fitting` (methods that calibrate: the first `fit_samples` sequences), `ApproxProbe` (every method at every
budget, and at each layer's planned budget under a k plan) and `EndToEnd`. Tables: heads.csv,
heads_calibration.csv, heads_plan.csv, end_to_end.csv, fit_history.csv; projections.npz. Loads as
`runs.ApproxRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import checkpoints, registry
from ..config import (
    FitInit,
    Projection,
    RunConfig,
    check_budget,
    check_budgets,
    choose,
    indices,
    layers_label,
)
from ..errors import SpectraError, spell
from ..inputs import budgets_or_default, path_text, several
from ..options import identity, option
from ..reporter import Reporter
from .base import Analysis, check_selection, register

#: the methods compared when none are named, and the budget when none is given
DEFAULT_METHODS = ("svd", "jl", "linformer", "pool-mean", "pool-max")
DEFAULT_BUDGET = (128,)


@dataclass(frozen=True)
class ApproxOptions:
    """Methods (registry labels or families) at each budget, per head and optionally substituted end to end.

    Random methods draw per sequence unless `fixed_projection`. Methods that calibrate fit on the first
    `fit_samples` sequences (a `fit_validation` share held out to choose the fit's step); the evaluated
    sequences come after them. `k_plan` (a `spectra plan-k` JSON file or its dict) gives every layer its own
    budget, measured beside a uniform budget of equal total cost."""

    budget: tuple[int, ...] | None = option(None, "Budget(s), comma-separated (the paper's k: projected length = "
                                            "features = landmarks = active queries = keys per query); each ≤ n. "
                                            "Default 128.")
    methods: tuple[str, ...] = option(DEFAULT_METHODS, "Comma-separated methods or families: any of {methods}; "
                                      "'linformer' means its four sharing levels, 'linformer(kv)' one.")
    end_to_end: bool = option(False, "Also substitute each approximation into the forward pass: hidden-state drift "
                              "and, with a language-model head, masked-LM or next-token perplexity.")
    layers: tuple[int, ...] | None = option(None, "Layers to substitute end to end, e.g. 6-11 or 0,3,5-7 (default "
                                            "all).")
    target: float = option(0.1, "Relative head-output error whose smallest reaching budget is reported per layer.")
    projection: Projection = option(Projection.GAUSSIAN, "Random projections of jl/linformer: gaussian N(0, 1/k) or "
                                    "orthogonal.")
    fixed_projection: bool = option(False, "One random draw per layer and budget for the whole run (default: each "
                                    "sequence draws its own, so means come with an interval over the randomness).")
    fit_samples: int = option(0, "Calibration sequences for the methods that fit (linformer-pca, linformer-fit, "
                              "fastformer-fit), read first; --samples more are evaluated after them.")
    fit_steps: int = option(200, "Adam steps of the fitted methods (the best step on held-out calibration "
                            "sequences is kept).")
    fit_lr: float = option(0.1, "Learning rate of the fits, relative to each parameter's typical entry.")
    fit_init: FitInit = option(FitInit.POOLING, "Where linformer-fit starts: mean pooling or the PCA projections.")
    fit_validation: float = option(0.25, "Share of the calibration sequences held out to choose the fit's step.")
    k_plan: Any = option(None, "A k plan from spectra plan-k (JSON file): each layer at its own budget, beside a "
                         "uniform budget of equal total cost.", metavar="PLAN.json")

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(several(self.methods, "--methods")))
        object.__setattr__(self, "layers", indices(self.layers, "layer"))
        if self.budget is not None:
            object.__setattr__(self, "budget", check_budgets(several(self.budget, spell("--budget"), int)))
        if not 0 < self.target < 1:
            raise SpectraError(f"{spell('--target')} must be a relative error in (0, 1), got {self.target}")
        object.__setattr__(self, "projection", choose(Projection, self.projection, "--projection"))
        object.__setattr__(self, "fit_init", choose(FitInit, self.fit_init, "--fit-init"))
        if self.fit_samples < 0 or self.fit_steps < 0 or not self.fit_lr > 0 or not 0 <= self.fit_validation < 1:
            raise SpectraError(f"{spell('--fit-samples')} and {spell('--fit-steps')} must be ≥ 0, "
                               f"{spell('--fit-lr')} > 0, and {spell('--fit-validation')} in [0, 1)")
        if not isinstance(self.k_plan, (dict, tuple, type(None))):
            object.__setattr__(self, "k_plan", path_text(self.k_plan))

    @property
    def fits(self) -> bool:
        return self.fit_samples > 0

    @property
    def fit_budgets(self) -> tuple[int, ...]:
        """Every budget a fitted method runs at: the sweep's and, under a k plan, each layer's planned one."""
        return tuple(sorted({*self.budget, *(self.k_plan or ())}))

    def resolved(self, n: int) -> ApproxOptions:
        """The methods expanded to registry labels, the k plan read (and refused if made at another n), the budgets
        set (the default, or the plan's mean) and checked against n; calibrating methods need fit_samples ≥ 2."""
        from ..report.plan import read_plan

        labels = registry.method_labels(self.methods)
        plan = self.k_plan
        if plan is not None and not isinstance(plan, tuple):
            plan = read_plan(plan, n)
        for layer_budget in plan or ():
            check_budget(layer_budget, n)
        budget = (round(sum(plan) / len(plan)),) if plan else budgets_or_default(self.budget, DEFAULT_BUDGET, n)
        calibrating = [label for label in labels if label in registry.METHODS.having("calibrates")]
        if calibrating and self.fit_samples < 2:  # one sequence is held out to choose the fit's step
            raise SpectraError(f"{calibrating[0]} fits its parameters on calibration sequences: pass "
                               f"{spell('--fit-samples N', 'fit_samples=N')} with N ≥ 2, e.g. 64")
        return replace(self, methods=labels, budget=check_budgets(budget, n), k_plan=plan)


class Approx(Analysis):
    """How well cheap approximations stand in for a model's attention at each budget: per head and end to end."""

    name = "approx"
    run_type = "ApproxRun"
    summary = "How well cheap approximations stand in for a model's attention at each budget: per head and end to end."
    options = ApproxOptions
    defaults = {"samples": 1000}
    calibrates = "fitted methods"
    outputs = {"heads.csv": ("method", "budget", "layer", "head", "metric"),
               "end_to_end.csv": ("method", "budget")}

    def check(self, config: RunConfig, options: ApproxOptions, shape: checkpoints.Shape) -> None:
        super().check(config, options, shape)
        check_selection(options.layers, None, shape)
        plan = options.k_plan
        if isinstance(plan, tuple) and shape.layers is not None and len(plan) != shape.layers:
            raise SpectraError(f"the k plan has {len(plan)} layers but {shape.name} has {shape.layers}; make the plan "
                               "with spectra plan-k on a run of this model")
        causal = registry.METHODS.having("causal")
        leaking = [label for label in options.methods if label not in causal]
        if options.end_to_end and shape.causal and leaking:
            usable = ", ".join(label for label in registry.METHODS if label in causal)
            raise SpectraError(
                f"{leaking[0]} lets each query see future tokens, so it is not a causal approximation of {shape.name} "
                f"(a decoder): end to end on a decoder takes causal methods ({usable}); measure "
                f"{', '.join(leaking)} per head without {spell('--end-to-end', 'end_to_end=True')}")

    def resolve(self, config: RunConfig, options: ApproxOptions) -> ApproxOptions:
        return options.resolved(config.length)

    def calibration(self, options: ApproxOptions) -> int:
        return options.fit_samples

    def source_options(self, options: ApproxOptions) -> dict[str, Any]:
        return {"lm_head": options.end_to_end, "fit_samples": options.fit_samples}

    def meta(self, config: RunConfig, options: ApproxOptions, source) -> dict[str, Any]:
        loaded = source.loaded
        return {**identity(options), "masked_lm": loaded.masked_lm, **({"lm_head": loaded.head} if loaded.head else {})}

    def probe(self, config: RunConfig, options: ApproxOptions, reporter: Reporter, source):
        """Fitting, per-head and end-to-end probes, once the model has loaded."""
        from .. import methods
        from ..probes import Probes
        from ..probes.approx import ApproxProbe
        from ..probes.endtoend import EndToEnd
        from ..probes.fitting import Fitting

        seed, plan = config.seed, options.k_plan
        probes, fitted = {}, None
        if options.fits:
            probes["fitting"] = Fitting(options, source.layers, source.heads, config.length, seed=seed,
                                        causal=source.loaded.causal, reporter=reporter)
            fitted = probes["fitting"].fitted
        probes["heads"] = ApproxProbe(options, source.layers, source.heads, seed=seed, fitted=fitted)
        if plan:
            probes["plan"] = ApproxProbe(options, source.layers, source.heads, seed=seed,
                                       fitted=fitted, budget_of=plan.__getitem__, file="heads_plan.csv")
        if options.end_to_end:
            loaded = source.loaded
            if loaded.head is None:
                reporter.notify(f"{loaded.name} has no language-model head: end to end measures the hidden-state "
                                "drift only")
            common = dict(seed=seed, projection=options.projection, fixed=options.fixed_projection, fitted=fitted)
            substitutes = {(label, budget): methods.substitute(label, budget, options.layers, **common)
                           for label in options.methods for budget in options.budget}
            if plan:
                substitutes = {(*key, "uniform"): substitute for key, substitute in substitutes.items()}
                substitutes.update({(label, options.budget[0], "plan"):
                                    methods.substitute(label, plan.__getitem__, options.layers, **common)
                                    for label in options.methods})
            probes["end_to_end"] = EndToEnd(source, substitutes, seed, layers_label(options.layers))
        return Probes(**probes)


register(Approx())
