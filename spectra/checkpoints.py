"""What a model source is, told from its files alone: a hub id or a local directory, whether the directory
holds a usable checkpoint (config, weights, tokenizer), and the short name runs and figures show.

Pure standard library (no torch, no transformers), so these checks run before anything heavy is
imported and every problem is one line naming the file that is missing or broken.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import gguffile
from .gguffile import gguf_field
from . import sliding
from .errors import SpectraError, spell

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
           "tf_model.h5", "flax_model.msgpack")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
#: the endings of a local checkpoint's weight files (sharded ones included), whose sha256 run.json records
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack")
#: folder names that say nothing about the model: a run is then named after the config instead
GENERIC = {"model", "models", "checkpoint", "checkpoints", "final", "latest", "best", "hf", "output", "outputs",
           "snapshot", "snapshots", "weights", "main", "pretrained", "."}


#: families whose position ids start after the padding index, so padding_idx + 1 positions are not usable
OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text"}


@dataclass(frozen=True)
class Shape:
    """What a model is, as far as its files tell before it loads: layers, attention heads, the longest sequence
    it embeds, whether it is a decoder, its key/value heads (fewer than `heads` under grouped-query attention) and its
    hidden size (D, the width of its residual stream); None where they do not say (a hub id: nothing until it loads).
    Every source tells them alike — a config.json, a GGUF header, a loaded model (`sources.OfLoadedModel.shape`) — so
    no analysis reads a model's files itself."""

    layers: int | None = None
    heads: int | None = None
    positions: int | None = None
    causal: bool | None = None
    name: str = "the model"
    kv_heads: int | None = None
    hidden: int | None = None
    #: whether some layers attend through a sliding window (`spectra.sliding`; Gemma 3's local layers)
    windowed: bool | None = None


def config_shape(config: dict, name: str, tokenizer_max: int | None = None) -> Shape:
    """The shape a transformers config.json gives (GPT-2 spells its fields n_layer, n_head, n_positions)."""
    def first(*keys: str) -> int | None:
        return next((int(config[key]) for key in keys if isinstance(config.get(key), int)), None)

    positions = first("max_position_embeddings", "n_positions")
    if positions is not None and config.get("model_type") in OFFSET_POSITIONS:
        positions -= (config.get("pad_token_id") or 0) + 1
    if tokenizer_max is not None and tokenizer_max < 10**6:
        positions = tokenizer_max if positions is None else min(positions, tokenizer_max)
    causal = bool(config.get("is_decoder")) or any(str(name_).endswith(("ForCausalLM", "LMHeadModel"))
                                                   for name_ in config.get("architectures") or ())
    heads = first("num_attention_heads", "n_head")
    # as the loaded model reads it (models.py): without num_key_value_heads every head has its own keys and values
    kv_heads = first("num_key_value_heads") or heads
    return Shape(first("num_hidden_layers", "n_layer"), heads, positions, causal, name, kv_heads,
                 first("hidden_size", "n_embd"), sliding.windowed(config))


@dataclass(frozen=True)
class Source:
    """A model source: `path` for a local directory (None for a hub id), its config.json, its short label, and
    for a GGUF checkpoint the file's name inside `path` (its config and tokenizer are inside the file)."""

    given: str
    path: Path | None
    config: dict
    label: str
    gguf_file: str | None = None

    @property
    def local(self) -> bool:
        return self.path is not None

    def shape(self) -> Shape:
        """The model's shape from its files alone (config.json and tokenizer_config.json, or the GGUF header's
        block_count, attention.head_count, attention.head_count_kv, context_length and embedding_length)."""
        if self.path is None:
            return Shape(name=self.label)
        if self.gguf_file is not None:
            file = self.path / self.gguf_file
            architecture = gguf_field(file, "general.architecture")
            if not isinstance(architecture, str):
                return Shape(causal=True, name=self.label)
            count = lambda key: value if isinstance(value := gguf_field(file, f"{architecture}.{key}"), int) else None
            heads = count("attention.head_count")
            # transformers builds the config from the header: a window there means local layers; Gemma's configs
            # default to one, so a Gemma header without it does not tell
            windowed = bool(count("attention.sliding_window")) or (None if architecture.startswith("gemma") else False)
            return Shape(count("block_count"), heads, count("context_length"), True, self.label,
                         count("attention.head_count_kv") or heads, count("embedding_length"), windowed)
        tokenizer_max = None
        try:
            tokenizer_max = json.loads((self.path / "tokenizer_config.json").read_text()).get("model_max_length")
        except (OSError, ValueError, AttributeError):
            pass
        return config_shape(self.config, self.label, tokenizer_max if isinstance(tokenizer_max, int) else None)

    @property
    def where(self) -> str:
        """The resolved directory (or GGUF file), or the hub id."""
        if self.path is None:
            return self.given
        return str((self.path / self.gguf_file).resolve() if self.gguf_file else self.path.resolve())


def looks_local(source: str) -> bool:
    """A path rather than a hub id: it exists, starts like a path, or has more than one '/'."""
    return Path(source).exists() or source.startswith((".", "/", "~")) or source.count("/") > 1


def _read_config(path: Path) -> dict:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise SpectraError(f"{path} is a directory but has no config.json: not a saved model (use save_pretrained)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SpectraError(f"{config_path} is not valid JSON ({str(error).splitlines()[0]}); "
                           "save the model again with save_pretrained") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise SpectraError(f"{config_path} has no model_type: not a transformers config; "
                           "save the model again with save_pretrained")
    return config


def check_directory(path: Path, weights: bool = True) -> dict:
    """The config of a local checkpoint directory, after checking its weights (unless not `weights`: a reader of
    the config and tokenizer alone) and tokenizer files exist."""
    config = _read_config(path)
    if weights and not any((path / name).is_file() for name in WEIGHTS):
        raise SpectraError(f"{path} has a config.json but no weights (none of {', '.join(WEIGHTS[:3])}, …); "
                           "save the model with model.save_pretrained")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise SpectraError(f"{path} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
                           "save the tokenizer there too: tokenizer.save_pretrained")
    return config


def label(source: str, config: dict | None = None) -> str:
    """A short name for runs and figures: the folder's name, or for a generic folder name (model, checkpoint,
    a snapshot hash) the config's own name (_name_or_path) or its model type with the parent folder."""
    path = Path(source)
    if not looks_local(source):
        return source.rstrip("/").split("/")[-1]
    name = path.resolve().name if path.exists() else path.name
    if name.lower() not in GENERIC and not re.fullmatch(r"[0-9a-f]{40}", name):
        return name
    config = config or {}
    named = str(config.get("_name_or_path") or "")
    if named and not looks_local(named):
        return named.rstrip("/").split("/")[-1]
    parent = path.resolve().parent.name
    return f"{config.get('model_type', 'model')}-{parent}" if parent else str(config.get("model_type", name))


def _gguf(path: Path, name: str) -> Source:
    file = path / name
    if not file.is_file():
        raise SpectraError(f"GGUF file {file} does not exist" + (
            f"; the directory holds {', '.join(sorted(p.name for p in path.glob('*.gguf')))}" if any(path.glob("*.gguf"))
            else ""))
    try:
        import gguf  # noqa: F401 - transformers reads GGUF files with it
    except ImportError:
        raise SpectraError("loading a GGUF file needs the gguf package: pip install gguf accelerate (or, in a clone of "
                           "spectra, pip install -e '.[gguf]')") from None
    return Source(str(file), path, {}, file.name.removesuffix(".gguf"), name)


def inspect(source: str | os.PathLike, gguf_file: str | os.PathLike | None = None, weights: bool = True) -> Source:
    """A hub id as it is; a local directory checked (config, weights unless not `weights`, tokenizer) and labelled;
    a `.gguf` file (or a directory and `gguf_file`) checked to exist, with the gguf package installed. Paths may be
    str or os.PathLike."""
    source = os.fspath(source)
    gguf_file = None if gguf_file is None else os.fspath(gguf_file)
    if source.endswith(".gguf") and gguf_file is None:
        path = Path(source).expanduser()
        return _gguf(path.parent, path.name)
    if not looks_local(source):
        if gguf_file is not None:
            raise SpectraError(f"{spell('--gguf-file', 'gguf_file')} names a file inside a local directory; give that "
                               f"directory as {spell('MODEL', 'model')}")
        return Source(source, None, {}, label(source))
    path = Path(source).expanduser()
    if not path.exists():
        raise SpectraError(f"model directory {source} does not exist")
    if gguf_file is not None:
        if not path.is_dir():
            raise SpectraError(f"{spell('--gguf-file', 'gguf_file')} needs {spell('MODEL', 'model')} to be the "
                               f"directory holding it, but {source} is a file")
        return _gguf(path, gguf_file)
    if not path.is_dir():
        raise SpectraError(f"model {source} is a file, not a directory saved with save_pretrained (or a .gguf file)")
    config = check_directory(path, weights)
    return Source(source, path, config, label(source, config))


def weights_sha256(where: str) -> dict[str, str] | None:
    """The sha256 of the model's weights as run.json records them, file name → hex: a GGUF file's own (the model cache
    hashed it already: `gguffile.sha256` remembers it), a local directory's weight files (WEIGHT_SUFFIXES); None for a
    hub id, whose files the run never sees (its `revision` names them)."""
    path = Path(where)
    if path.is_file():
        return {path.name: gguffile.sha256(path)}
    if not path.is_dir():
        return None
    return {file.name: gguffile.sha256(file) for file in sorted(path.iterdir())
            if file.is_file() and file.name.endswith(WEIGHT_SUFFIXES)}
