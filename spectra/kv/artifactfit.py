"""`spectra artifacts KIND MODEL --data FILE`: fit a press's learned artifact on local text, for any decoder, and
write it where kvpress's loader reads it (`kv.artifacts`).

The calibration text is cut into `samples` blocks of `length` tokens (the files' tokens in order, no special tokens
added), each prefilled exactly (`kv.prefill.exact`, keeping every layer's queries before RoPE). What is fitted:

- `qfilter` (Q-Filters, arXiv:2503.02812): per layer and key/value head, the queries after RoPE — the space of the
  cached keys the filter is applied to — of the head's G query heads and every position, stacked (N, d); the filter is
  their top right singular vector v₁ (the top eigenvector of the Gram matrix QᵀQ, accumulated in float64), oriented
  so that the mean query projects on it negatively: kvpress's score −f·k then grows with the logit E[q]·k ≈ κ v₁·k
  a key can expect.
- `expected_attention_stats` (kvpress's recipe in expected_attention_with_stats.py): per layer and query head, the
  queries before RoPE of every block but its first `SINKS` positions, their mean and their covariance divided by
  N − 1 (accumulated in float64 as sums of q and q qᵀ).
- `kvzap` (KVzap, arXiv:2601.07891): per layer, a linear map or a small MLP (`surrogate`: linear or mlp) from each
  token's hidden state to the log of KVzip's score of its pair, fitted on each block's KVzip scores (`kv.surrogate`).

kvpress's recipe for the statistics cuts each of 100 booksum chapters to its first 1000 characters; spectra reads
local files (no download) and counts in tokens. Everything the user can get wrong is refused in one line before the
model loads: the kind, the files (missing, not UTF-8), the sizes, the output directory, then with the tokenizer alone
text too short for one block; text that gives fewer blocks than asked for is fitted on, said in one notice line (as
analyze says a corpus that yields fewer sequences). Beside the artifact, run.json records what it was fitted on (the
model's and every text file's sha256: `fitted`), which a run of its press records in turn (`kv.provenance`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoints, models, runtime
from ..errors import SpectraError, spell
from ..inputs import utf8
from ..reporter import Reporter, plural
from . import artifacts, prefill
from .presses.expected import SINKS
from .presses.rerotation import rotate_half


@dataclass(frozen=True)
class ArtifactRequest:
    """What `spectra artifacts` fits (`spectra.artifacts`'s keywords): the artifact `kind` of `model` (its
    `gguf_file` inside a directory) on `samples` blocks of `length` tokens of the text files `data`, written to the
    directory `out`; `surrogate`: kvzap's, linear or mlp."""

    kind: str
    model: str
    data: tuple[Path, ...]
    out: Path
    length: int
    samples: int
    threads: int | None
    gguf_file: str | None
    overwrite: bool
    surrogate: str


def check_request(request: ArtifactRequest) -> None:
    """Refuse (one line) what cannot be fitted or written, before anything loads."""
    from ..rundir import check_writable
    from .surrogate import KINDS

    kind, data, out, length, surrogate = request.kind, request.data, request.out, request.length, request.surrogate
    if kind not in artifacts.FORMATS:
        raise SpectraError(f"unknown artifact '{kind}'; choose one of {', '.join(artifacts.FORMATS)}")
    if surrogate not in KINDS:
        raise SpectraError(f"{spell('--surrogate', 'surrogate')} must be one of {', '.join(KINDS)} (kvzap's "
                           f"surrogate), got '{surrogate}'")
    if not data:
        raise SpectraError(f"{spell('--data', 'data')} names no file; give one or more text files, comma-separated")
    for path in data:
        if not path.is_file():
            raise SpectraError(f"{spell('--data', 'data')} {path}: no such file (give text files, comma-separated)")
        read_text(path)
    fewest = {"expected_attention_stats": SINKS + 2, "kvzap": 2 * SINKS}.get(kind, 2)
    if isinstance(length, bool) or length < fewest:
        raise SpectraError(f"{spell('--length', 'length')} must be ≥ {fewest} tokens, got {length}")
    if isinstance(request.samples, bool) or request.samples < 1:
        raise SpectraError(f"{spell('--samples', 'samples')} must be ≥ 1, got {request.samples}")
    if out.exists() and not out.is_dir():
        raise SpectraError(f"{spell('--out', 'out')} {out} is a file; give a directory")
    if out.exists() and not request.overwrite:
        raise SpectraError(f"{spell('--out', 'out')} {out} already exists; pass "
                           f"{spell('--overwrite', 'overwrite=True')} to replace it or choose another")
    check_writable(out, "--out")


def read_text(path: Path) -> str:
    """A calibration file's text, refused in one line where it cannot be read or is not UTF-8 (as analyze and the
    task files refuse it: text read with replacement characters would be fitted on silently)."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SpectraError(f"{spell('--data', 'data')} {path}: cannot be read ({error.strerror})") from None
    return utf8(raw, f"{spell('--data', 'data')} {path}", "convert it (e.g. iconv -t UTF-8) or give another file")


def text_blocks(tokenizer, request: ArtifactRequest, reporter: Reporter = Reporter()) -> list[torch.Tensor]:
    """Up to `samples` blocks of `length` tokens, cut in order from the files' tokens (each file on its own). Fewer
    than asked for are fitted on, said in one notice line (as analyze says a corpus that yields fewer sequences); none
    is refused."""
    blocks: list[torch.Tensor] = []
    length, samples, tokens = request.length, request.samples, 0
    for path in request.data:
        ids = tokenizer.encode(read_text(path), add_special_tokens=False)
        tokens += len(ids)
        for start in range(0, len(ids) - length + 1, length):
            if len(blocks) == samples:
                return blocks
            blocks.append(torch.tensor(ids[start:start + length]))
    if not blocks:
        raise SpectraError(f"{spell('--data', 'data')} holds no block of {length} tokens (it holds {tokens}); give "
                           f"longer text or a smaller {spell('--length', 'length')}")
    if len(blocks) < samples:
        reporter.notify(f"the text yields {plural(len(blocks), 'block')} of {length} tokens of the {samples} asked for "
               f"({tokens} tokens in all); the artifact is fitted on {'it' if len(blocks) == 1 else 'them'} (more "
               "text or a smaller --length gives more blocks, a smaller --samples asks for fewer)")
    return blocks


class QFilterFit:
    """Gram matrices and sums of the post-RoPE queries per (layer, key/value head), then the oriented filters."""

    def __init__(self, layers: int, kv_heads: int, dim: int) -> None:
        self.gram = torch.zeros(layers, kv_heads, dim, dim, dtype=torch.float64)
        self.total = torch.zeros(layers, kv_heads, dim, dtype=torch.float64)

    def update(self, layer: int, queries: torch.Tensor) -> None:
        """Add one block's queries after RoPE (H, n, d) of `layer`, grouped by key/value head."""
        kv_heads = self.gram.shape[1]
        grouped = queries.double().reshape(kv_heads, -1, queries.shape[-1])  # (H_kv, G·n, d)
        self.gram[layer] += grouped.transpose(1, 2) @ grouped
        self.total[layer] += grouped.sum(dim=1)

    def result(self) -> dict[str, torch.Tensor]:
        """`q_filters` (layers, H_kv, d) float32: each top eigenvector of QᵀQ, its sign making the mean query's
        projection negative."""
        _, vectors = torch.linalg.eigh(self.gram)
        top = vectors[..., -1]  # eigh sorts ascending: the last is the top right singular vector of Q
        sign = torch.where((self.total * top).sum(dim=-1) > 0, -1.0, 1.0).to(top.dtype)
        return {"q_filters": (top * sign[..., None]).float()}


class StatisticsFit:
    """Sums of the pre-RoPE queries and of their outer products per (layer, query head), then mean and covariance."""

    def __init__(self, layers: int, heads: int, dim: int) -> None:
        self.total = torch.zeros(layers, heads, dim, dtype=torch.float64)
        self.outer = torch.zeros(layers, heads, dim, dim, dtype=torch.float64)
        self.count = 0

    def update(self, layer: int, queries: torch.Tensor) -> None:
        """Add one block's queries before RoPE (H, n, d) of `layer`, its first SINKS positions left out."""
        kept = queries[:, SINKS:].double()
        self.total[layer] += kept.sum(dim=1)
        self.outer[layer] += kept.transpose(1, 2) @ kept
        if layer == 0:
            self.count += kept.shape[1]

    def result(self) -> dict[str, torch.Tensor]:
        """`query_mean` (layers, H, d) and `query_cov` (layers, H, d, d) float32 (covariance over N − 1)."""
        count = self.count
        mean = self.total / count
        covariance = (self.outer - count * mean[..., :, None] * mean[..., None, :]) / max(count - 1, 1)
        return {"query_mean": mean.float(), "query_cov": covariance.float()}


def fit(kind: str, model: torch.nn.Module, layers: int, blocks: Sequence[torch.Tensor],
        progress: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    """The artifact's tensors, fitted on `blocks` (each (n,) token ids) prefilled by `model`."""
    found: QFilterFit | StatisticsFit | None = None
    for index, ids in enumerate(blocks):
        with torch.inference_mode():
            parts = prefill.exact(model, layers, ids, 0, index, ("query_pre",))
        for part in parts:
            pre = part.passes.get("query_pre")
            if pre is None or part.rope is None:
                raise SpectraError("this model's queries before RoPE cannot be read (a model with rotary positions "
                                   "and separate query projections is needed)")
            if found is None:
                found = (QFilterFit(layers, part.kv_heads, part.head_dim) if kind == "qfilter"
                         else StatisticsFit(layers, pre.shape[0], part.head_dim))
            if kind == "qfilter":
                cos, sin = part.rope(torch.arange(pre.shape[1], device=pre.device))
                found.update(part.layer, pre * cos.to(pre.dtype) + rotate_half(pre) * sin.to(pre.dtype))
            else:
                found.update(part.layer, pre)
        if progress is not None:
            progress(index + 1)
    assert found is not None
    return found.result()


def make_artifact(request: ArtifactRequest, progress: Callable[[int], None] | None = None,
                  reporter: Reporter = Reporter()) -> Path:
    """Fit the artifact `request` asks for and write it to its directory, in kvpress's format (see the module
    docstring); `progress(blocks done)` after each block; `reporter`: where the one-line notice of fewer blocks
    than asked for goes. Returns the directory written."""
    check_request(request)
    kind, paths, out, length = request.kind, request.data, request.out, request.length
    source = checkpoints.inspect(request.model, request.gguf_file)
    shape = source.shape()
    if shape.causal is False:
        raise SpectraError(f"{source.label} is an encoder: a press's artifact belongs to a decoder's cache")
    if shape.positions is not None and length > shape.positions:
        raise SpectraError(f"{spell('--length', 'length')} {length} is beyond the {shape.positions} positions of "
                           f"{source.label}")
    tokenizer = models.load_tokenizer(source)  # the blocks are cut before the weights load
    if kind == "kvzap":
        from . import reconstruction

        repetition = reconstruction.Repetition.of(tokenizer)
        if length <= repetition.prefix + SINKS:
            raise SpectraError(f"{spell('--length', 'length')} {length} leaves too few tokens after the "
                               f"{repetition.prefix} of {source.label}'s chat template opening, which KVzip does "
                               f"not score; give at least {repetition.prefix + SINKS + 1}")
    blocks = text_blocks(tokenizer, request, reporter)
    with runtime.threads(request.threads):
        loaded = models.load(source, device="cpu", tokenizer=tokenizer)
        if kind == "kvzap":
            from . import surrogate as surrogates

            states, scores = surrogates.collect(loaded.model, loaded.layers, blocks, repetition, progress)
            tensors, config = surrogates.fit(states, scores, request.surrogate)
            return artifacts.write(out, tensors, config, fitted(request, loaded, len(blocks)))
        if not models.rotary(loaded.model):
            raise SpectraError(f"{loaded.name} has no rotary position embedding (RoPE): {kind} scores post-RoPE "
                               "keys with statistics of rotated queries")
        tensors = fit(kind, loaded.model, loaded.layers, blocks, progress)
    first = next(iter(tensors.values()))
    if kind == "qfilter":
        config = {"num_layers": first.shape[0], "num_kv_heads": first.shape[1], "kv_head_dim": first.shape[2]}
    else:
        config = {"num_layers": first.shape[0], "num_heads": first.shape[1], "head_dim": first.shape[2],
                  "dataset_name": ",".join(str(path) for path in paths), "model_name": loaded.name,
                  "num_samples": len(blocks), "sample_seq_len": length, "n_sink": SINKS}
    return artifacts.write(out, tensors, config, fitted(request, loaded, len(blocks)))


def fitted(request: ArtifactRequest, loaded: models.Loaded, blocks: int) -> dict:
    """The artifact's run.json: what it was fitted on — the model (its weights' sha256), each text file's name, bytes
    and sha256 (`data`, which a run reading the artifact records: `kv.provenance`), the blocks and their length — and
    the versions, so a press's numbers name the bytes behind them."""
    from .. import gguffile
    from ..rundir import versions

    files = [{"name": path.name, "bytes": path.stat().st_size, "sha256": gguffile.sha256(path)}
             for path in request.data]
    return {"artifact": request.kind, "model": loaded.describe(), "data": {"files": files, "length": request.length,
            "blocks": blocks}, **({"surrogate": request.surrogate} if request.kind == "kvzap" else {}),
            "versions": versions()}
