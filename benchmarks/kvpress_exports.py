"""What spectra exports, loaded by the tools that read it: DuoAttention's pattern directory and kvpress's per-layer list.

    python benchmarks/kvpress_exports.py HEADS_RUN [KVPRESS_PYTHON] [--duo-attention CLONE] [--ratio 0.5]

HEADS_RUN is a `spectra heads` run of SmolLM2-135M-Instruct (its directory holds full_attention_heads.tsv and
config.json). In kvpress 0.5.5's venv (a worker, `--worker JOB RESULT`, importing only torch, transformers and
kvpress):

- DuoAttention's own loader, `duo_attn.utils.load_attn_pattern`, taken from a clone of mit-han-lab/duo-attention
  (`--duo-attention`; the function alone is compiled from the file, its module's imports need a GPU stack), reads
  HEADS_RUN — and one of DuoAttention's published patterns, which spectra's `headpattern.read` reads too;
- kvpress's `DuoAttentionPress(head_compression_ratio=r).post_init_from_model(model)` loads HEADS_RUN through its own
  `load_attention_pattern` (its download served from the directory: `kvpress_tasks.serve_pattern`): sink_size,
  recent_size and the streaming heads it picks, compared with spectra's `presses.duo.streaming_heads`;
- kvpress's `PerLayerCompressionPress(KnormPress(), compression_ratios=LIST)` takes the per-layer list that
  `schedules.export` wrote (a spectral schedule from HEADS_RUN's metrics.csv, entropy-weighted, mean ratio r) and
  compresses a 1024-token prefill: each layer's cache length is compared with the count the schedule made; a
  per-head (nested) list is given to it too, to show what kvpress does with one (spectra's export refuses it).
Printed: one line per check, ✓ or ✗ with the numbers.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LENGTH = 1024


def load_function(path: Path, name: str):
    """The function `name` of the Python file `path`, compiled alone with numpy, os and json as its globals."""
    import numpy as np

    tree = ast.parse(path.read_text())
    node = next(item for item in tree.body if isinstance(item, ast.FunctionDef) and item.name == name)
    namespace = {"np": np, "os": os, "json": json}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)  # noqa: S102 - the reference loader itself
    return namespace[name]


def worker(job_path: str, result_path: str) -> None:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    import kvpress

    sys.path.insert(0, str(Path(__file__).parent))
    from kvpress_tasks import serve_pattern

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable  # its own bar, outside the logging switches
    logging.getLogger("kvpress").setLevel(logging.ERROR)  # PerLayerCompressionPress's flash-attention warning
    job = json.loads(Path(job_path).read_text())
    found: dict = {}
    if job["duo_attention"]:
        load = load_function(Path(job["duo_attention"]) / "duo_attn" / "utils.py", "load_attn_pattern")
        for key, folder in (("duo_loader", job["heads"]), ("duo_loader_published", job["published"])):
            heads, sink, recent = load(folder)
            found[key] = {"scores": np.atleast_2d(heads).tolist(), "sink_size": sink, "recent_size": recent}
    model = AutoModelForCausalLM.from_pretrained(job["folder"], gguf_file=GGUF, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    serve_pattern(model, job["heads"])
    press = kvpress.DuoAttentionPress(head_compression_ratio=job["ratio"])
    press.post_init_from_model(model)
    found["kvpress_duo"] = {"sink_size": press.sink_size, "recent_size": press.recent_size,
                            "streaming": press.streaming_mask.cpu().numpy().tolist()}
    ids = torch.tensor(job["ids"])[None]
    lengths, errors = {}, {}
    for key, ratios in (("per_layer", job["per_layer"]), ("per_head", job["per_head"])):
        cache = DynamicCache()
        try:
            with torch.inference_mode(), kvpress.PerLayerCompressionPress(kvpress.KnormPress(), ratios)(model):
                model(input_ids=ids, past_key_values=cache)
            lengths[key] = [cache.get_seq_length(layer) for layer in range(len(cache))]
        except Exception as error:  # what kvpress does with the list is the finding
            errors[key] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    found.update({"lengths": lengths, "errors": errors})
    Path(result_path).write_text(json.dumps(found))


def main() -> None:
    import argparse

    import numpy as np
    import pandas as pd

    from spectra import checkpoints, data, models
    from spectra.kv import headpattern
    from spectra.kv.presses.duo import streaming_heads
    from spectra.kv.presses.schedules import export, head_ratios, head_weights, kept_tokens, layer_weights, spectral

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", help="A `spectra heads` run directory of SmolLM2-135M-Instruct.")
    parser.add_argument("python", nargs="?", default="/work/kv/bin/python")
    parser.add_argument("--duo-attention", default=None, help="A clone of mit-han-lab/duo-attention.")
    parser.add_argument("--ratio", type=float, default=0.5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from kvpress_tasks import smollm2_folder

    folder = smollm2_folder()
    scratch = Path(tempfile.mkdtemp(prefix="kvpress_exports_"))
    pattern = headpattern.read(args.heads)
    metrics = pd.read_csv(Path(args.heads) / "metrics.csv")
    per_layer = spectral(layer_weights("entropy", metrics))(args.ratio, LENGTH)
    export(per_layer, scratch / "per_layer.json")
    per_head = head_ratios(head_weights("entropy", metrics, None, pattern.kv_heads), args.ratio)
    try:
        export(per_head, scratch / "per_head.json")
        refused = "written"
    except ValueError as error:
        refused = str(error)
    loaded = models.load(checkpoints.inspect(folder, GGUF), device="cpu", lm_head=False)
    text = "".join(Path("/usr/share/common-licenses", name).read_text() for name in ("GPL-3", "Apache-2.0"))
    ids = next(iter(data.sequences(loaded.tokenizer, _corpus(text, scratch), LENGTH, "pack")))
    published = None
    if args.duo_attention:
        published = next(Path(args.duo_attention).glob("attn_patterns/*/*/full_attention_heads.tsv")).parent
    job = {"folder": folder, "heads": str(Path(args.heads).resolve()), "ratio": args.ratio,
           "duo_attention": args.duo_attention, "published": str(published) if published else None,
           "ids": [int(i) for i in ids], "per_layer": json.loads((scratch / "per_layer.json").read_text()),
           "per_head": per_head.tolist()}
    (scratch / "job.json").write_text(json.dumps(job))
    subprocess.run([args.python, __file__, "--worker", str(scratch / "job.json"), str(scratch / "result.json")],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    found = json.loads((scratch / "result.json").read_text())

    def line(ok: bool, text: str) -> None:
        print(f"{'✓' if ok else '✗'} {text}")

    if "duo_loader" in found:
        theirs = found["duo_loader"]
        line(np.array_equal(np.array(theirs["scores"]), pattern.scores) and
             (theirs["sink_size"], theirs["recent_size"]) == (pattern.sink_size, pattern.recent_size),
             f"DuoAttention's load_attn_pattern reads {args.heads}: {np.array(theirs['scores']).shape} heads, sink "
             f"{theirs['sink_size']}, recent {theirs['recent_size']} — equal to spectra's headpattern.read")
        theirs, ours = found["duo_loader_published"], headpattern.read(published)
        line(np.array_equal(np.array(theirs["scores"]), ours.scores) and theirs["sink_size"] == ours.sink_size,
             f"spectra's headpattern.read reads DuoAttention's published {published.parent.name} pattern as its "
             f"loader does ({ours.layers} × {ours.kv_heads}, sink {ours.sink_size}, recent {ours.recent_size})")
    duo = found["kvpress_duo"]
    ours = streaming_heads(pattern.scores, args.ratio)
    line(np.array_equal(np.array(duo["streaming"]), ours) and
         (duo["sink_size"], duo["recent_size"]) == (pattern.sink_size, pattern.recent_size),
         f"kvpress's DuoAttentionPress loads it: sink {duo['sink_size']}, recent {duo['recent_size']}, "
         f"{int(np.sum(duo['streaming']))} of {ours.size} streaming heads at head_compression_ratio {args.ratio}, "
         "the same heads as spectra's duo press")
    wanted = [max(1, int(LENGTH * (1 - ratio))) for ratio in per_layer]
    got = found["lengths"].get("per_layer")
    line(got == wanted, f"kvpress's PerLayerCompressionPress(KnormPress(), the exported list) keeps per layer "
         f"{got if got is None else f'{min(got)}–{max(got)}'} tokens of {LENGTH}: the schedule's counts "
         f"({kept_tokens(per_layer, LENGTH)} in all, {len(per_layer)} × {int(LENGTH * (1 - args.ratio))} uniform)"
         + ("" if got == wanted else f"; {found['errors'].get('per_layer')}"))
    line("per_head" in found["errors"] and refused != "written",
         f"a per-head list: kvpress's PerLayerCompressionPress fails ({found['errors'].get('per_head')}); "
         f"spectra's export refuses it ({refused})")


def _corpus(text: str, scratch: Path):
    from spectra import data

    path = scratch / "text.txt"
    path.write_text(text)
    return data.open_corpus(str(path), seed=0)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
