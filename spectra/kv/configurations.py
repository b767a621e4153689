"""kvpress 0.5.5's evaluation registry and leaderboard script as spectra configurations: each registry name is one of
spectra's press expressions with some presses' settings set (`Press.fields`), never a class of its own.

kvpress's `evaluation/evaluate_registry.py` names press instances (`"expected_attention": AdaKVPress(
ExpectedAttentionPress(epsilon=1e-2))`, `"chunkkv": ChunkKVPress(press=SnapKVPress(), chunk_length=20)`), and
`evaluation/leaderboard.sh` runs a list of them: a loop with the question appended after compression, and a loop with
the question compressed with the context (`--query_aware`, spectra's `--query-aware`). Here each name maps to the
expression spectra writes (`adakv(expected_attention)`) and the settings of the presses in it (`{"expected_attention":
{"epsilon": 0.01}}`); on the command line it is written `kvpress:<name>` (`kvpress:expected_attention`), since
several of kvpress's names are spectra's names for other configurations (spectra's `expected_attention` is the class
at its defaults). The registry (`registry.PRESSES`) resolves such a name through `configured`, checks the settings
against the fields the classes declare, and builds the press once: all before the model loads, without torch.

An entry whose instance loads a learned artifact kvpress downloads takes it as an argument where spectra fits one:
the KVzap entries, written `kvpress:kvzap_mlp(DIR,-6)` — the surrogate directory `spectra artifacts kvzap` writes
(`--surrogate linear|mlp`, the one the entry's `model_type` names, checked) and, for DMSPress, the threshold kvpress's
leaderboard sets (`THRESHOLDS`; `parameters`, substituted into the expression `dms(kvzap({artifact}),{threshold})`).
A registry entry spectra runs otherwise or not at all names what to write instead, or why not (`instead`): the other
presses kvpress downloads learned artifacts for (its QFilter and DuoAttention patterns, LU-KV's curve: spectra fits
them on local text, `spectra artifacts`, and names them `qfilter(DIR)`, `duo(DIR)`, `lukv(FILE)`), and those spectra
lacks (FastKVzip, RestoreKV, KVzip+, …).

The table is kvpress's `main` at 8bb29b9 (2026-08-06), the newest commit of its repository stored here: no tag
v0.5.5 is stored, and the installed kvpress 0.5.5's press files are that commit's plus KVgradPress and
EntropyGatedChunkKVPress. Since kvpress 0.4.1 (January 2026) `expected_attention` names AdaKV around Expected
Attention with ε = 1e-2, which earlier registries named `adakv_expected_attention_e2` (`FORMER`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arguments import applied, number_of
from ..errors import SpectraError
from ..inputs import split_top

#: how a kvpress registry name is written among `--presses`
PREFIX = "kvpress:"
#: kvpress's tags for the registry this table reads
SOURCE = "kvpress main 8bb29b9 (0.5.5's evaluation registry and leaderboard.sh)"


@dataclass(frozen=True)
class Configuration:
    """One entry of kvpress's evaluation registry: `name`, the instance kvpress builds (`kvpress`, as its registry
    writes it), spectra's press `expression` and the `settings` of presses in it (press name → field → value); or,
    where spectra runs it otherwise or not at all, `instead`: one line saying what to write, or why not."""

    name: str
    kvpress: str
    expression: str = ""
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    instead: str = ""
    #: what is written in parentheses after the name, in order (`kvpress:kvzap_mlp(DIR,-6)`: artifact, threshold),
    #: each substituted for `{parameter}` in the expression
    parameters: tuple[str, ...] = ()
    #: the KVzap surrogate its KVzapPress loads (`model_type`: linear or mlp), which the artifact given must be
    surrogate: str = ""

    @property
    def written(self) -> str:
        """How `--presses` names it (`kvpress:kvzap_mlp(<artifact>,<threshold>)` where it takes parameters)."""
        given = ",".join(f"<{part}>" for part in self.parameters)
        return PREFIX + self.name + (f"({given})" if given else "")

    def expression_of(self, given: list[str]) -> str:
        """The expression with the `given` parameters (one per `parameters`) in their places."""
        return self.expression.format(**dict(zip(self.parameters, given)))


def _artifact(what: str, written: str) -> str:
    return (f"kvpress downloads {what} from the hub for a few 8B models; spectra fits it on local text (`spectra "
            f"artifacts`) and names it {written}")


EA_E2 = {"expected_attention": {"epsilon": 0.01}}
NO_VNORM = {"expected_attention": {"use_vnorm": False}}
#: DMSPress's thresholds on KVzap's scores in kvpress's leaderboard.sh ("-3, -4, -5, -6 for Qwen3-8B and -6, -7, -8,
#: -9 for Llama-3.1-8B-Instruct"), and spectra's for SmolLM2-135M-Instruct, for which none is published (nor a
#: surrogate): with spectra's linear surrogate fitted on the licence texts, the thresholds whose cells' mean stored share
#: on two ~1k records was nearest 1 − r for the board's ratios r = 0.25, 0.5, 0.75, 0.875 (0.81, 0.43, 0.24, 0.15:
#: benchmarks/RESULTS.md §28; at 1k tokens the 128-token window alone keeps 0.125, so no threshold reaches 0.875)
THRESHOLDS: dict[str, tuple[float, ...]] = {"Qwen/Qwen3-8B": (-3.0, -4.0, -5.0, -6.0),
                                            "meta-llama/Llama-3.1-8B-Instruct": (-6.0, -7.0, -8.0, -9.0),
                                            "HuggingFaceTB/SmolLM2-135M-Instruct": (0.0, -2.0, -4.0, -6.0)}
#: what a configuration's parameters are, as a refusal says how to give them
PARAMETERS = {"artifact": "<artifact>: the KVzap surrogate directory `spectra artifacts kvzap MODEL --data FILE --out "
                          "DIR` fits, where kvpress downloads NVIDIA's",
              "threshold": "<threshold>: DMSPress's score threshold; kvpress's leaderboard runs -3 to -6 on Qwen3-8B "
                           "and -6 to -9 on Llama-3.1-8B"}
ZAP = ("artifact",)
DMS_ZAP = dict(expression="dms(kvzap({artifact}),{threshold})", parameters=("artifact", "threshold"))
DECODABLE = "spectra's {}(<decodable>) takes streaming, knorm and tova"

#: kvpress's evaluation registry, in its order
REGISTRY: dict[str, Configuration] = {entry.name: entry for entry in (
    Configuration("adakv_snapkv", "AdaKVPress(SnapKVPress())", "adakv(snapkv)"),
    Configuration("block_keydiff", "BlockPress(press=KeyDiffPress(), block_size=128)", "block(keydiff)",
                  {"block": {"block_size": 128}}),
    Configuration("chunkkv", "ChunkKVPress(press=SnapKVPress(), chunk_length=20)", "chunkkv(snapkv)",
                  {"chunkkv": {"chunk_length": 20}}),
    Configuration("critical_adakv_expected_attention", "CriticalAdaKVPress(ExpectedAttentionPress(use_vnorm=False))",
                  "criticaladakv(expected_attention)", NO_VNORM),
    Configuration("critical_adakv_snapkv", "CriticalAdaKVPress(SnapKVPress())", "criticaladakv(snapkv)"),
    Configuration("critical_expected_attention", "CriticalKVPress(ExpectedAttentionPress(use_vnorm=False))",
                  "criticalkv(expected_attention)", NO_VNORM),
    Configuration("critical_snapkv", "CriticalKVPress(SnapKVPress())", "criticalkv(snapkv)"),
    Configuration("cur", "CURPress()", "cur"),
    Configuration("duo_attention", "DuoAttentionPress()",
                  instead=_artifact("DuoAttention's head pattern", "duo(DIR) (a `spectra heads` run)")),
    Configuration("duo_attention_on_the_fly", "DuoAttentionPress(on_the_fly_scoring=True)",
                  instead="spectra's duo(DIR) reads a head pattern; it has no on-the-fly scoring of the heads"),
    Configuration("expected_attention", "AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))",
                  "adakv(expected_attention)", EA_E2),
    Configuration("fastkvzip", "FastKVzipPress()", instead="spectra has no FastKVzipPress (its gates are downloaded)"),
    Configuration("finch", "FinchPress()", "finch"),
    Configuration("keydiff", "KeyDiffPress()", "keydiff"),
    Configuration("kvcompose", "KVComposePress()", "kvcompose"),
    Configuration("kvcompose_unstructured", "KVComposePress(structured=False)",
                  instead="spectra's kvcompose is the structured variant only"),
    Configuration("kvzip", "KVzipPress()", "kvzip"),
    Configuration("kvzip_plus", "KVzipPress(kvzip_plus_normalization=True)",
                  instead="spectra's kvzip has no KVzip+ normalization"),
    Configuration("kvzap_linear", "DMSPress(press=KVzapPress(model_type='linear'))", surrogate="linear", **DMS_ZAP),
    Configuration("kvzap_mlp", "DMSPress(press=KVzapPress(model_type='mlp'))", surrogate="mlp", **DMS_ZAP),
    Configuration("kvzap_mlp_head", "KVzapPress(model_type='mlp')", "kvzap({artifact})", parameters=ZAP,
                  surrogate="mlp"),
    Configuration("kvzap_mlp_layer", "AdaKVPress(KVzapPress(model_type='mlp'))", "adakv(kvzap({artifact}))",
                  parameters=ZAP, surrogate="mlp"),
    Configuration("lagkv", "LagKVPress()", "lagkv"),
    Configuration("lukv", "LUKVPress(ExpectedAttentionPress(epsilon=2e-2), sink=4, window=1)",
                  instead=_artifact("LU-KV's budget curve", "lukv(FILE) (its scores Expected Attention's at ε 2e-2)")),
    Configuration("knorm", "KnormPress()", "knorm"),
    Configuration("observed_attention", "ObservedAttentionPress()", "observed"),
    Configuration("pyramidkv", "PyramidKVPress()", "pyramidkv"),
    Configuration("qfilter", "QFilterPress()", instead=_artifact("the Q-Filters", "qfilter(DIR)")),
    Configuration("random", "RandomPress()", "random"),
    Configuration("RestoreKV", "RestoreKVPress()", instead="spectra has no RestoreKVPress (its restorer is learned)"),
    Configuration("RestoreKV_plus", "RestoreKVPress(kvzip_plus_normalization=True)",
                  instead="spectra has no RestoreKVPress (its restorer is learned)"),
    Configuration("snap_think", "ComposedPress([SnapKVPress(), ThinKPress()])", "composed(snapkv,think)"),
    Configuration("snapkv", "SnapKVPress()", "snapkv"),
    Configuration("streaming_llm", "StreamingLLMPress()", "streaming"),
    Configuration("think", "ThinKPress()", "think"),
    Configuration("tova", "TOVAPress()", "tova"),
    Configuration("compactor", "CompactorPress()", "compactor"),
    Configuration("adakv_compactor", "AdaKVPress(CompactorPress())", "adakv(compactor)"),
    Configuration("no_press", "None", instead="the full cache: every spectra run measures it, as the cell full at 0"),
    Configuration("cam_streaming_llm", "CAMPress(base_press=StreamingLLMPress())", "cam(streaming)"),
    Configuration("cam_knorm", "CAMPress(base_press=KnormPress())", "cam(knorm)"),
    Configuration("cam_adakv_snapkv", "CAMPress(base_press=AdaKVPress(SnapKVPress()))", instead=DECODABLE.format("cam")),
    Configuration("cam_tova", "CAMPress(base_press=TOVAPress())", "cam(tova)"),
    Configuration("decoding_knorm", "DecodingPress(base_press=KnormPress())", "decoding(knorm)"),
    Configuration("decoding_streaming_llm", "DecodingPress(base_press=StreamingLLMPress())", "decoding(streaming)"),
    Configuration("decoding_tova", "DecodingPress(base_press=TOVAPress())", "decoding(tova)"),
    Configuration("decoding_qfilter", "DecodingPress(base_press=QFilterPress())", instead=DECODABLE.format("decoding")),
    Configuration("decoding_adakv_expected_attention_e2",
                  "DecodingPress(base_press=AdaKVPress(ExpectedAttentionPress(epsilon=1e-2)))",
                  instead=DECODABLE.format("decoding")),
    Configuration("decoding_adakv_snapkv", "DecodingPress(base_press=AdaKVPress(SnapKVPress()))",
                  instead=DECODABLE.format("decoding")),
    Configuration("decoding_keydiff", "DecodingPress(base_press=KeyDiffPress())", instead=DECODABLE.format("decoding")),
    Configuration("merging_knorm", "MergingPress(KnormPress())", "merging(knorm)"),
    Configuration("merging_snapkv", "MergingPress(SnapKVPress())", "merging(snapkv)"),
    Configuration("merging_expected_attention", "MergingPress(ExpectedAttentionPress(epsilon=1e-2))",
                  "merging(expected_attention)", EA_E2),
    Configuration("merging_kvzap_mlp", "MergingPress(KVzapPress(model_type='mlp'))", "merging(kvzap({artifact}))",
                  parameters=ZAP, surrogate="mlp"),
)}

#: names earlier kvpress registries used for a configuration 0.5.5 names otherwise
FORMER = {"adakv_expected_attention_e2": "expected_attention"}

#: leaderboard.sh's first loop (the question appended after compression; kvzap and duo, run by threshold and by
#: head ratio, after the others), and its second (`--query_aware`: the question compressed with the context)
QUESTION_FREE = ("random", "knorm", "snapkv", "expected_attention", "streaming_llm", "tova", "observed_attention",
                 "qfilter", "pyramidkv", "lagkv", "keydiff", "adakv_compactor", "cur", "kvzip", "kvzap_linear",
                 "kvzap_mlp", "duo_attention", "duo_attention_on_the_fly")
QUERY_AWARE = ("snapkv", "adakv_snapkv", "finch", "chunkkv")


def runnable(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names among `names` spectra runs as `kvpress:<name>` as they are (no artifact or threshold to give), written
    so."""
    return tuple(REGISTRY[name].written for name in names
                 if REGISTRY[name].expression and not REGISTRY[name].parameters)


#: what `--presses` takes for the leaderboard's lists: both loops' presses, and each loop's (the entries spectra runs;
#: `left_out` names the others)
PRESETS: dict[str, tuple[str, ...]] = {
    "kvpress-leaderboard": tuple(dict.fromkeys(runnable(QUESTION_FREE) + runnable(QUERY_AWARE))),
    "kvpress-leaderboard-question-free": runnable(QUESTION_FREE),
    "kvpress-leaderboard-query-aware": runnable(QUERY_AWARE),
}


def left_out() -> tuple[str, ...]:
    """The leaderboard's entries no preset runs: those needing an artifact and a threshold (`kvpress:kvzap_mlp(DIR,
    -6)`), and those spectra runs otherwise or not at all (`Configuration.instead`)."""
    return tuple(name for name in dict.fromkeys(QUESTION_FREE + QUERY_AWARE)
                 if not REGISTRY[name].expression or REGISTRY[name].parameters)


#: what --presses' refusal of an unknown name lists beside the presses
LISTED = (*PRESETS, f"{PREFIX}<name> (kvpress's registry names)")


def expanded(names: Iterable[str], presets: Mapping[str, tuple[str, ...]], presses: Any) -> list[str]:
    """`names` with each preset (`presets`, then `PRESETS`) replaced by its list; a name of kvpress's registry written
    without the prefix and not among `presses` is refused in one line saying how to write it (`hint`)."""
    found = [part for name in names for part in {**presets, **PRESETS}.get(name.strip(), (name,))]
    for name in found:
        if name.strip() not in presses and hint(name.strip()):
            raise SpectraError(hint(name.strip()))
    return found


def hint(name: str) -> str:
    """For a name of kvpress's registry written without the prefix, one line saying how to write it; "" else."""
    if name in FORMER:
        return f"'{name}' was a name of kvpress's evaluation registry before 0.4.1: write {PREFIX}{FORMER[name]}"
    return f"'{name}' is a name of kvpress's evaluation registry: write {PREFIX}{name}" if name in REGISTRY else ""


def configured(name: str, presses: Any) -> tuple[str, Mapping[str, Mapping[str, Any]], dict[str, str]] | None:
    """(expression, settings, identity facts: its summary and peer) of `kvpress:<name>` among the registry `presses`;
    None for a name without the prefix. One line (SpectraError) for a name kvpress's registry lacks, an entry spectra
    runs otherwise, or settings its presses do not declare (`check`)."""
    if not name.startswith(PREFIX):
        return None
    key, given = name[len(PREFIX):], []
    if applied(key) is not None:  # kvpress:kvzap_mlp(DIR,-6)
        key, argument = applied(key)  # type: ignore[misc]
        given = split_top(argument) if key in REGISTRY and REGISTRY[key].parameters else [argument]
    if key in FORMER:
        raise SpectraError(f"press '{name}': kvpress 0.5.5's registry names this configuration "
                           f"{PREFIX}{FORMER[key]} (its registry before 0.4.1 named it {key})")
    if key not in REGISTRY:
        raise SpectraError(f"unknown press '{name}': kvpress 0.5.5's evaluation registry has "
                           f"{', '.join(REGISTRY)}")
    entry = REGISTRY[key]
    if not entry.expression:
        raise SpectraError(f"press '{name}' ({entry.kvpress}): {entry.instead}")
    if len(given) != len(entry.parameters) or not all(given):
        wanted = f"write {entry.written}" if entry.parameters else f"write {entry.written}, without parentheses"
        raise SpectraError(f"press '{name}' ({entry.kvpress}): {wanted}" + (
            f" ({'; '.join(PARAMETERS[part] for part in entry.parameters)})" if entry.parameters else ""))
    check(entry, presses)
    if entry.surrogate:
        from .artifacts import surrogate_type

        found = surrogate_type(given[0])
        if found != entry.surrogate:
            raise SpectraError(f"press '{name}': {entry.kvpress} scores with a surrogate of model_type "
                               f"'{entry.surrogate}', and the one in {given[0]} is '{found}' (`spectra artifacts kvzap "
                               f"MODEL --surrogate {entry.surrogate}` fits one)")
    expression = entry.expression_of(given)
    if entry.parameters:  # what was given, checked as the expression takes it (a threshold that is no number)
        presses.resolve(expression)
    return expression, entry.settings, {"summary": described(entry, given), "peer": entry.kvpress}


def presses_in(expression: str) -> list[str]:
    """The press names an expression is written with, outermost first (`adakv(expected_attention)` → adakv,
    expected_attention)."""
    parts = applied(expression)
    if parts is None:
        return [expression]
    return [parts[0], *(name for inner in split_top(parts[1]) for name in presses_in(inner))]


def check(entry: Configuration, presses: Any) -> None:
    """Refuse (one line) a setting of a press the expression does not hold, that the press does not declare among
    its `fields` (in the registry `presses`), or of another type than the declared default."""
    names = presses_in(entry.expression)
    for press, values in entry.settings.items():
        declared = presses.entries()[press].facts.get("fields", {}) if press in names else None
        if declared is None:
            raise SpectraError(f"{PREFIX}{entry.name}: its settings name {press}, which {entry.expression} does not "
                               "hold")
        for key, value in values.items():
            if key not in declared or type(value) is not type(declared[key]):
                raise SpectraError(f"{PREFIX}{entry.name}: {press} declares no setting {key}={value!r}; its "
                                   f"settings: {declared or 'none'}")


def build(registry: Any, name: str) -> Any:
    """The press `kvpress:<name>` names, built from `registry`'s objects: each press of its expression configured
    with its settings (`presses.fields.configured`), inner ones first, then wrapped or composed as the expression
    says; the registered instances themselves are never changed."""
    from .presses.fields import configured as set_fields

    expression, settings, _ = configured(name, registry)  # type: ignore[misc]

    def made(text: str) -> Any:
        parts = applied(text)
        facts = registry.entries()[parts[0]].facts if parts else {}
        if parts is None or not (facts.get("wraps") or facts.get("several")):
            press = registry[text]
        elif facts.get("number"):  # a press, then a number: dms(<scorer>,<threshold>)
            inner, number = number_of(text, parts[1], str(facts["number"]))
            press = registry[parts[0]].bind(made(inner), number)
        else:
            press = registry[parts[0]].bind(*(made(inner) for inner in split_top(parts[1])))
        return set_fields(press, **settings.get(parts[0] if parts else text, {}))

    return made(expression)


def described(entry: Configuration, given: list[str] | None = None) -> str:
    """One line: the expression and its settings (`adakv(expected_attention), expected_attention epsilon=0.01`), with
    the `given` parameters in their places."""
    settings = "; ".join(f"{press} " + ", ".join(f"{key}={value}" for key, value in values.items())
                         for press, values in entry.settings.items())
    return f"kvpress's {entry.name}: {entry.expression_of(given or [])}" + (f" with {settings}" if settings else "")
