"""The names of the approximation methods, readable without torch: for `--help`, and to check `--methods`
before anything loads.

Each method lives in its own file under `spectra/methods/` (which imports torch) and registers its label there;
this catalogue lists the same labels by family, so the command line can list them in `--help` and refuse an
unknown name in a fraction of a second. tests/test_catalogue.py checks it equals the methods' registry, label
for label and in order: adding a method is its file, its test and its line here.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import SpectraError

#: the sharing levels of section 4 a Linformer-style family comes in (`config.Sharing`'s values)
SHARING = ("none", "headwise", "kv", "layerwise")

#: family → its labels, in the order the methods register (the order of tables and legends)
FAMILIES: dict[str, tuple[str, ...]] = {
    "svd": ("svd",),
    "svd-causal": ("svd-causal",),
    "jl": ("jl",),
    "linformer": tuple(f"linformer({level})" for level in SHARING),
    "pool-mean": ("pool-mean",),
    "pool-max": ("pool-max",),
    "performer": ("performer",),
    "performer-causal": ("performer-causal",),
    "nystrom": ("nystrom",),
    "nystrom-iter6": ("nystrom-iter6",),
    "skyformer": ("skyformer",),
    "probsparse": ("probsparse",),
    "window": ("window",),
    "topk": ("topk",),
    "linformer-pca": tuple(f"linformer-pca({level})" for level in SHARING),
    "linformer-fit": tuple(f"linformer-fit({level})" for level in SHARING),
    "fastformer-fit": ("fastformer-fit",),
    "fastformer-fit-causal": ("fastformer-fit-causal",),
}

#: the labels that are causal (on a decoder a query's output never depends on a later position) and those that
#: calibrate (fitted on calibration sequences): each method's class declares it, this repeats it for the checks
#: made before anything loads (tests/test_catalogue.py holds the two equal)
CAUSAL = frozenset({"svd-causal", "performer-causal", "window", "topk", "fastformer-fit-causal"})
CALIBRATES = frozenset({*FAMILIES["linformer-pca"], *FAMILIES["linformer-fit"], "fastformer-fit",
                        "fastformer-fit-causal"})

#: every label, in registration order
LABELS: tuple[str, ...] = tuple(label for labels in FAMILIES.values() for label in labels)


def listing() -> str:
    """The families, then the labels that are not a family of their own, for `--help`."""
    return ", ".join([*FAMILIES, *(label for label in LABELS if label not in FAMILIES)])


def expand(names: Iterable[str]) -> list[str]:
    """Method labels from user names: a label, or a family meaning all its labels (`linformer`: four). An
    unknown name is one line listing the valid ones."""
    labels: list[str] = []
    for name in names:
        name = name.strip()
        found = FAMILIES.get(name) or ((name,) if name in LABELS else ())
        if not found:
            raise SpectraError(f"unknown method '{name}'; valid methods: {', '.join(sorted({*FAMILIES, *LABELS}))}")
        labels += [label for label in found if label not in labels]
    if not labels:
        raise SpectraError("no method given; pass e.g. --methods svd,jl,linformer,pool-mean")
    return labels


#: the KV-cache presses of `spectra cache` (spectra/presses/, one module per kind), in registration order, and
#: those whose ratio is the fraction of key channels removed (they need rotary positions): tests/test_catalogue.py
#: holds these equal to the presses' registry
PRESSES: tuple[str, ...] = ("streaming", "knorm", "snapkv", "tova", "random", "observed", "think", "leverage", "loki",
                             "lowrank", "linformer")
CHANNEL_PRESSES = frozenset({"think"})
ROPE_PRESSES = frozenset({"think"})
#: presses that read the last 64 context queries (they need a longer context), and those fitted on calibration
#: sequences (`spectra cache --fit-samples`)
WINDOW_PRESSES = frozenset({"snapkv", "loki"})
CALIBRATING_PRESSES = frozenset({"loki", "lowrank"})


def presses(names: Iterable[str]) -> tuple[str, ...]:
    """Press names from user input, in the order given, once each; an unknown one is one line listing the valid."""
    chosen: list[str] = []
    for name in names:
        name = name.strip()
        if name not in PRESSES:
            raise SpectraError(f"unknown press '{name}'; valid presses: {', '.join(PRESSES)}")
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise SpectraError(f"no press given; pass e.g. --presses {','.join(PRESSES[:3])}")
    return tuple(chosen)
