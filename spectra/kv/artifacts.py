"""Learned artifacts of presses, as directories in the format kvpress 0.5.5 loads — torch-free until a tensor is read.

Some of kvpress's presses score with something fitted once per model and published on the hub: QFilterPress's
filters, ExpectedAttentionStatsPress's query statistics, KVzapPress's surrogate. kvpress loads each with
`from_pretrained(folder)` (huggingface_hub's `PyTorchModelHubMixin`, transformers' `PreTrainedModel` for KVzap's): a
directory holding `config.json` (the module's constructor arguments) and `model.safetensors` (its parameters by name).
`spectra artifacts` writes such a directory for any model (`kv.artifactfit` fits it on local text), kvpress's own
loaders read it from the local path, and the presses `qfilter(DIR)`, `expected_attention_stats(DIR)` and `kvzap(DIR)`
read it here.

A directory is checked when a press names it, before any model loads, in one line: missing files, a safetensors
header that is not one, a file whose length is not what its header says (a copy cut short), a tensor missing or of
the wrong number of axes, a config.json whose sizes disagree with the tensors (`check_qfilter`, `check_statistics`,
`check_surrogate`, the registry's checks of the presses' arguments). `fits` then holds it to the model's shape
(layers, heads, key/value heads, head dimension, hidden size) where the model's files tell it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpectraError

#: the files of an artifact directory, as `PyTorchModelHubMixin` names them
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
#: what `spectra artifacts` writes beside them (`rundir.write_meta`): the model, text and versions it was fitted with
META_FILE = "run.json"


@dataclass(frozen=True)
class Format:
    """One artifact's layout: the press reading it (`kind`, as `spectra artifacts` names it), its tensors, each with
    its axes by name (layers, heads, kv_heads, head_dim), and the config.json keys holding those sizes (the
    constructor arguments of kvpress's module)."""

    kind: str
    what: str
    tensors: dict[str, tuple[str, ...]]
    sizes: dict[str, str]

    def shape(self, folder: str | Path) -> dict[str, int]:
        """Axis name → size of the artifact in `folder`, checked whole (SpectraError, one line, where it is not)."""
        folder = Path(folder)
        if folder.is_file():
            inside = (folder.parent / CONFIG_FILE).is_file() and (folder.parent / WEIGHTS_FILE).is_file()
            raise SpectraError(f"{self.what} {folder} is a file: {self.kind}(DIR) reads the directory `spectra "
                               f"artifacts {self.kind}` writes, holding {CONFIG_FILE} and {WEIGHTS_FILE}; give "
                               + (f"its folder, {self.kind}({folder.parent})" if inside else "that directory"))
        if not folder.is_dir():
            raise SpectraError(f"{self.what} {folder}: no such directory (`spectra artifacts {self.kind}` writes one, "
                               f"holding {CONFIG_FILE} and {WEIGHTS_FILE})")
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (folder / name).is_file():
                raise SpectraError(f"{self.what} {folder}: {name} is missing (`spectra artifacts` writes both "
                                   f"{CONFIG_FILE} and {WEIGHTS_FILE})")
        config = read_config(folder / CONFIG_FILE, self.what)
        header = safetensors_header(folder / WEIGHTS_FILE, self.what)
        sizes: dict[str, int] = {}
        for tensor, axes in self.tensors.items():
            if tensor not in header:
                raise SpectraError(f"{self.what} {folder / WEIGHTS_FILE}: holds no tensor '{tensor}' (holds "
                                   f"{', '.join(sorted(header)) or 'none'})")
            dims = header[tensor]
            if len(dims) != len(axes):
                raise SpectraError(f"{self.what} {folder / WEIGHTS_FILE}: '{tensor}' has {len(dims)} axes, not "
                                   f"{len(axes)} ({' × '.join(axes)})")
            for axis, size in zip(axes, dims):
                if sizes.setdefault(axis, size) != size:
                    raise SpectraError(f"{self.what} {folder / WEIGHTS_FILE}: the tensors disagree on {axis} "
                                       f"({sizes[axis]} and {size})")
        for key, axis in self.sizes.items():
            if config.get(key) != sizes[axis]:
                raise SpectraError(f"{self.what} {folder / CONFIG_FILE}: {key} is {config.get(key)!r}, but the "
                                   f"tensors have {sizes[axis]}")
        return sizes


class SurrogateFormat:
    """KVzap's surrogate, as kvpress's `KVzapModel.save_pretrained` writes it: config.json with model_type "kvzap",
    input_dim (D), output_dim (H_kv), n_modules (layers) and hidden_dim (null: linear); per layer i, `layers.{i}.weight`
    (H_kv, D) and `.bias`, or a two-layer MLP's `layers.{i}.0.weight` (hidden_dim, D), `.0.bias`, `layers.{i}.2.weight`
    (H_kv, hidden_dim) and `.2.bias`."""

    kind, what = "kvzap", "KVzap surrogate"

    def tensors(self, config: dict[str, Any]) -> dict[str, list[int]]:
        """Tensor name → shape that a surrogate of `config`'s sizes holds."""
        dim, heads, width = config["input_dim"], config["output_dim"], config["hidden_dim"]
        parts = ({"weight": [heads, dim], "bias": [heads]} if width is None else
                 {"0.weight": [width, dim], "0.bias": [width], "2.weight": [heads, width], "2.bias": [heads]})
        return {f"layers.{i}.{part}": shape for i in range(config["n_modules"]) for part, shape in parts.items()}

    def shape(self, folder: str | Path) -> dict[str, int]:
        """{layers, hidden (D), kv_heads} of the surrogate in `folder`, checked whole (SpectraError, one line)."""
        folder = Path(folder)
        Format(self.kind, self.what, {}, {}).shape(folder)  # the directory and its two files
        config = read_config(folder / CONFIG_FILE, self.what)
        if config.get("model_type") != "kvzap":
            raise SpectraError(f"{self.what} {folder / CONFIG_FILE}: model_type is {config.get('model_type')!r}, not "
                               "'kvzap'")
        for key in ("input_dim", "output_dim", "n_modules", "hidden_dim"):
            value = config.get(key)
            if isinstance(value, bool) or not (isinstance(value, int) and value > 0 or
                                               value is None and key == "hidden_dim"):
                raise SpectraError(f"{self.what} {folder / CONFIG_FILE}: {key} is {value!r}, not a positive integer"
                                   + (" or null (linear)" if key == "hidden_dim" else ""))
        header = safetensors_header(folder / WEIGHTS_FILE, self.what)
        for tensor, dims in self.tensors(config).items():
            if tensor not in header:
                raise SpectraError(f"{self.what} {folder / WEIGHTS_FILE}: holds no tensor '{tensor}', which its "
                                   f"{CONFIG_FILE} (n_modules {config['n_modules']}, hidden_dim "
                                   f"{config['hidden_dim']}) needs")
            if header[tensor] != dims:
                raise SpectraError(f"{self.what} {folder / WEIGHTS_FILE}: '{tensor}' is "
                                   f"{' × '.join(map(str, header[tensor]))}, but its {CONFIG_FILE} makes it "
                                   f"{' × '.join(map(str, dims))}")
        return {"layers": config["n_modules"], "hidden": config["input_dim"], "kv_heads": config["output_dim"]}


QFILTER = Format("qfilter", "Q-Filters", {"q_filters": ("layers", "kv_heads", "head_dim")},
                 {"num_layers": "layers", "num_kv_heads": "kv_heads", "kv_head_dim": "head_dim"})
STATISTICS = Format("expected_attention_stats", "query statistics",
                    {"query_mean": ("layers", "heads", "head_dim"),
                     "query_cov": ("layers", "heads", "head_dim", "head_dim")},
                    {"num_layers": "layers", "num_heads": "heads", "head_dim": "head_dim"})
SURROGATE = SurrogateFormat()
#: how messages name the axes
AXES = {"layers": "layers", "heads": "query heads", "kv_heads": "key/value heads", "head_dim": "head dimensions",
        "hidden": "hidden dimensions"}
#: `spectra artifacts`' kinds: the press reading it → its format
FORMATS: dict[str, Format | SurrogateFormat] = {"qfilter": QFILTER, "expected_attention_stats": STATISTICS,
                                                "kvzap": SURROGATE}


def read_config(path: Path, what: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise SpectraError(f"{what} {path}: not JSON ({error})") from None
    if not isinstance(config, dict):
        raise SpectraError(f"{what} {path}: not a JSON object")
    return config


#: bytes per element of safetensors' dtypes
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

#: how a damaged weights file is mended
AGAIN = "write it again with `spectra artifacts` or copy it whole"


def safetensors_header(path: Path, what: str) -> dict[str, list[int]]:
    """Tensor name → shape, from a safetensors file's header (8 bytes of its length, then JSON), reading no data;
    the file's length is held to what the header places after it (`check_extent`), as safetensors' loader holds it,
    so a file cut short is refused here, in one line, and not by the loader once the model has loaded."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < length <= 100_000_000:
                raise ValueError("no safetensors header")
            text = file.read(length)
            if len(text) < length:
                raise SpectraError(f"{what} {path} is cut short: its header takes {length} bytes, but the file holds "
                                   f"{len(text)} after the header's length; {AGAIN}")
            header = json.loads(text)
        entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
        shapes = {name: [int(size) for size in entry["shape"]] for name, entry in entries.items()}
        spans = {name: (int(entry["data_offsets"][0]), int(entry["data_offsets"][1]), entry["dtype"])
                 for name, entry in entries.items()}
        size = path.stat().st_size - 8 - length
    except (OSError, ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError, struct.error) as error:
        raise SpectraError(f"{what} {path}: not a safetensors file ({error})") from None
    check_extent(path, what, shapes, spans, size)
    return shapes


def check_extent(path: Path, what: str, shapes: dict[str, list[int]], spans: dict[str, tuple[int, int, str]],
                 size: int) -> None:
    """Refuse (one line) a safetensors file whose data after the header is not exactly its tensors': each tensor's
    `data_offsets` span its elements' bytes, the spans follow one another from 0, and the last ends where the file
    does (`size`: the bytes after the header). A copy cut short is the usual cause."""
    end = 0
    for name, (begin, stop, dtype) in sorted(spans.items(), key=lambda item: item[1][:2]):
        elements = 1
        for axis in shapes[name]:
            elements *= axis
        if begin != end or (dtype in DTYPE_BYTES and stop - begin != elements * DTYPE_BYTES[dtype]):
            raise SpectraError(f"{what} {path}: not a safetensors file (tensor '{name}' lies at bytes {begin}–{stop} "
                               f"after the header, which does not follow its shape and the tensors before it)")
        end = stop
    if size < end:
        raise SpectraError(f"{what} {path} is cut short: its tensors take {end} bytes after the header, but the file "
                           f"holds {max(size, 0)}; {AGAIN}")
    if size > end:
        raise SpectraError(f"{what} {path}: holds {size} bytes after the header, but its tensors take {end} (not a "
                           f"whole safetensors file); {AGAIN}")


def check_qfilter(argument: str) -> None:
    """The registry's check of `qfilter(DIR)`: DIR holds whole Q-Filters."""
    QFILTER.shape(argument)


def check_statistics(argument: str) -> None:
    """The registry's check of `expected_attention_stats(DIR)`: DIR holds whole query statistics."""
    STATISTICS.shape(argument)


def check_surrogate(argument: str) -> None:
    """The registry's check of `kvzap(DIR)`: DIR holds a whole KVzap surrogate."""
    SURROGATE.shape(argument)


def surrogate_type(argument: str) -> str:
    """'linear' or 'mlp': the KVzap surrogate in `argument`, checked whole (kvpress's KVzapPress `model_type`)."""
    SURROGATE.shape(argument)
    return "linear" if read_config(Path(argument) / CONFIG_FILE, SURROGATE.what)["hidden_dim"] is None else "mlp"


def fits(kind: str, folder: str | Path, name: str, **model: int | None) -> None:
    """Refuse (one line) the artifact in `folder` where its sizes differ from the model's (`model`: layers, heads,
    kv_heads, head_dim, hidden; None: not known yet, not checked)."""
    found = FORMATS[kind].shape(folder)
    known = {axis: model[axis] for axis in found if model.get(axis) is not None}
    if any(found[axis] != size for axis, size in known.items()):
        def sizes(values: dict[str, Any]) -> str:
            return " × ".join(f"{size} {AXES[axis]}" for axis, size in values.items())

        raise SpectraError(f"{FORMATS[kind].what} {folder} is {sizes(found)}, but {name} has {sizes(known)}; fit "
                           f"them for this model with `spectra artifacts {kind} MODEL --data FILE --out DIR`")


def load(kind: str, folder: str | Path) -> dict[str, Any]:
    """The artifact's tensors (float32 torch tensors by name), checked first."""
    from safetensors.torch import load_file

    FORMATS[kind].shape(folder)
    return load_file(str(Path(folder) / WEIGHTS_FILE))


def write(folder: str | Path, tensors: dict[str, Any], config: dict[str, Any],
          meta: dict[str, Any] | None = None) -> Path:
    """An artifact directory: `tensors` (name → torch tensor) as model.safetensors and `config` as config.json, as
    `PyTorchModelHubMixin.save_pretrained` writes them, and `meta` (what it was fitted on) as run.json beside them,
    which kvpress's loaders leave alone (written under a temporary name, then moved into place)."""
    import shutil

    from safetensors.torch import save_file

    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(partial / WEIGHTS_FILE),
              metadata={"format": "pt"})
    (partial / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if meta is not None:
        from ..rundir import write_meta

        write_meta(partial, meta)
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)
    return folder
