"""Load a model and tokenizer from a hub id or a local directory, switched to the capture attention.

The one module that knows how models are built: their config fields and the names of their attention
linears (`attention_linears`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel

from . import capture, checkpoints, hub
from .config import Device, DType, choose
from .errors import SpectraError

DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}
#: families checked to capture exactly what eager attention computes (tests/test_capture.py; README)
CHECKED_FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "modernbert")
#: families whose position ids start after the padding index, so two positions are not usable
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text"}


@dataclass
class Loaded:
    """A model in eval mode on its device with the capture attention, and what describes it."""

    model: PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    source: str
    revision: str | None
    device: torch.device
    dtype: torch.dtype
    layers: int
    heads: int
    max_length: int
    masked_lm: bool


def pick_device(device: Device | str | torch.device) -> torch.device:
    """auto → cuda when present, else cpu; an explicit device must be available."""
    if isinstance(device, torch.device):
        return device
    device = choose(Device, device, "--device")
    if device == Device.AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == Device.CUDA and not torch.cuda.is_available():
        raise SpectraError("--device cuda was asked for but torch sees no CUDA device; use --device cpu or auto")
    if device == Device.MPS and not torch.backends.mps.is_available():
        raise SpectraError("--device mps was asked for but torch sees no MPS device; use --device cpu or auto")
    return torch.device(device.value)


def _not_found(source: str) -> SpectraError:
    where = "the local cache (the Hub was not reachable or HF_HUB_OFFLINE is set)" if not hub.reachable() else \
        "the Hugging Face Hub or the local cache"
    return SpectraError(f"could not load model '{source}': no local directory of that name and not found in {where}; "
                        + hub.ADVICE)


def has_masked_lm_head(config: transformers.PretrainedConfig) -> bool:
    """Whether the checkpoint was saved with a masked-LM head (its architectures say so)."""
    return any(name.endswith(("ForMaskedLM", "ForPreTraining")) for name in config.architectures or ())


def max_length(config: transformers.PretrainedConfig, tokenizer: transformers.PreTrainedTokenizerBase) -> int:
    """The longest sequence the model can embed (RoBERTa-style models lose padding_idx + 1 positions)."""
    positions = getattr(config, "max_position_embeddings", None) or 10**9
    if config.model_type in _OFFSET_POSITIONS:
        positions -= (config.pad_token_id or 0) + 1
    model_max = getattr(tokenizer, "model_max_length", None)
    if model_max and model_max < 10**6:
        positions = min(positions, int(model_max))
    return positions


def load(
    source: str,
    *,
    device: str | torch.device = "auto",
    dtype: DType | str = DType.FLOAT32,
    masked_lm: bool = False,
    trust_remote_code: bool = False,
) -> Loaded:
    """Load `source` (hub id or directory) with the capture attention.

    `masked_lm` asks for the masked-LM head; it is loaded only when the checkpoint has one (see
    `Loaded.masked_lm`), never freshly initialised.
    """
    dtype = choose(DType, dtype, "--dtype")
    torch_device = pick_device(device)
    found = checkpoints.inspect(source)
    if not found.local:
        hub.prepare()  # one quick connection attempt; unreachable → the local cache only, no retries
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError:
        raise _not_found(source) from None
    except ValueError as error:
        raise SpectraError(f"could not read the config of '{source}': {str(error).splitlines()[0]}") from None
    masked_lm = masked_lm and has_masked_lm_head(config)
    model_class = AutoModelForMaskedLM if masked_lm else AutoModel
    try:
        supports = model_class._model_mapping[type(config)]._supports_attention_backend
    except (KeyError, AttributeError):
        supports = None
    if supports is False:
        raise SpectraError(
            f"model family '{config.model_type}' does not route attention through transformers' AttentionInterface, "
            f"so spectra cannot capture it (checked families: {', '.join(CHECKED_FAMILIES)})"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        model = model_class.from_pretrained(
            source, attn_implementation=capture.NAME, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except OSError:
        raise _not_found(source) from None
    except ValueError as error:
        raise SpectraError(f"could not load '{source}' with the capture attention: {str(error).splitlines()[0]}") from None
    model.to(torch_device).eval()
    return Loaded(
        model=model,
        tokenizer=tokenizer,
        name=found.label if found.local else checkpoints.label(source),
        source=found.where,
        revision=getattr(config, "_commit_hash", None),
        device=torch_device,
        dtype=DTYPES[dtype],
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        max_length=max_length(config, tokenizer),
        masked_lm=masked_lm,
    )


#: attribute names of (query, key, value) linears, and of the output linear, in common attention modules
_LINEAR_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"))
_OUT_NAMES = ("output.dense", "o_proj", "out_proj", "out_lin", "dense")
_HEAD_NAMES = ("num_attention_heads", "num_heads", "n_heads")


@dataclass
class Linears:
    """A pretrained attention module's W^Q, W^K, W^V, W^O (None when not found), head count and score scale."""

    w_q: torch.nn.Linear
    w_k: torch.nn.Linear
    w_v: torch.nn.Linear
    w_o: torch.nn.Linear | None
    heads: int | None
    scaling: float | None


def _find(module: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def attention_linears(attention: torch.nn.Module) -> Linears:
    """The linears of an attention module: query/key/value, q_proj/k_proj/v_proj or q_lin/k_lin/v_lin in the
    module or its `self` child (BERT-style), W^O in output.dense, o_proj, out_proj, out_lin or dense."""
    inner = attention
    for candidate in (attention, getattr(attention, "self", None)):
        if candidate is not None and any(hasattr(candidate, names[0]) for names in _LINEAR_NAMES):
            inner = candidate
            break
    names = next((names for names in _LINEAR_NAMES if hasattr(inner, names[0])), None)
    linears = None if names is None else tuple(getattr(inner, name, None) for name in names)
    if linears is None or not all(isinstance(m, torch.nn.Linear) for m in linears):
        raise SpectraError(
            f"cannot find the query/key/value linears of {type(attention).__name__}; pass w_q, w_k, w_v explicitly"
        )
    w_o = next((m for name in _OUT_NAMES for m in (_find(attention, name),) if isinstance(m, torch.nn.Linear)), None)
    heads = next((int(getattr(inner, n)) for n in _HEAD_NAMES if hasattr(inner, n)), None)
    heads = heads or getattr(getattr(inner, "config", None), "num_attention_heads", None)
    return Linears(*linears, w_o, heads, getattr(inner, "scaling", None))
