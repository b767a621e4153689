"""Load a model and tokenizer from a hub id or a local directory, switched to the capture attention.

The one module that knows how models are built: their config fields and their attention linears' names.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
)

from . import capture, checkpoints, gguffile, hub, modelcache
from .config import Device, DType, choose
from .errors import SpectraError

DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}
#: families checked to capture exactly what eager attention computes (tests/test_capture.py; README)
CHECKED_FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "modernbert", "llama",
                    "qwen2", "mistral", "gpt2")
#: language-model heads a checkpoint may carry, for end to end
MASKED_LM, CAUSAL_LM = "masked-lm", "causal-lm"
#: families whose position ids start after the padding index, so two positions are not usable
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text"}


@dataclass
class Loaded:
    """A model in eval mode on its device with the capture attention, and what describes it.

    `head` is the language-model head loaded for end to end (MASKED_LM, CAUSAL_LM) or None; `causal` says the
    model is a decoder; `kv_heads` < `heads` under grouped-query attention; `gguf` names the GGUF file and its
    quantization when the weights came from one (dequantized to the forward's dtype)."""

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
    head: str | None = None
    causal: bool = False
    kv_heads: int | None = None
    architecture: str = ""
    gguf: dict | None = None
    head_dim: int | None = None

    @property
    def masked_lm(self) -> bool:
        return self.head == MASKED_LM

    def describe(self) -> dict:
        """The model as run.json records it, with the sha256 of its weight files (`checkpoints.weights_sha256`)."""
        return {"name": self.name, "source": self.source, "revision": self.revision, "layers": self.layers,
                "heads": self.heads, "kv_heads": self.kv_heads or self.heads, "architecture": self.architecture,
                "causal": self.causal, **({"gguf": self.gguf} if self.gguf else {}),
                "weights": checkpoints.weights_sha256(self.source)}


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


def is_decoder(config: transformers.PretrainedConfig, gguf: bool = False) -> bool:
    """A causal language model: a GGUF file (llama.cpp's format holds decoders), a config that says so, or
    architectures ending in ForCausalLM / LMHeadModel."""
    return gguf or bool(getattr(config, "is_decoder", False)) or any(
        name.endswith(("ForCausalLM", "LMHeadModel")) for name in config.architectures or ())


def max_length(config: transformers.PretrainedConfig, tokenizer: transformers.PreTrainedTokenizerBase) -> int:
    """The longest sequence the model can embed (RoBERTa-style models lose padding_idx + 1 positions)."""
    positions = getattr(config, "max_position_embeddings", None) or 10**9
    if config.model_type in _OFFSET_POSITIONS:
        positions -= (config.pad_token_id or 0) + 1
    model_max = getattr(tokenizer, "model_max_length", None)
    if model_max and model_max < 10**6:
        positions = min(positions, int(model_max))
    return positions


#: loaded models kept for reuse inside `reusing()`, by load's arguments
_KEPT: dict[tuple, Loaded] | None = None


@contextlib.contextmanager
def reusing() -> Iterator[None]:
    """Within the block, `load` with the same arguments returns the model it loaded before (spectra scaling runs
    one analysis per sequence length: the model is loaded once). Outside, every call loads afresh."""
    global _KEPT
    outer, _KEPT = _KEPT, {} if _KEPT is None else _KEPT
    try:
        yield
    finally:
        _KEPT = outer


def load(
    source: str | checkpoints.Source,
    *,
    device: str | torch.device = "auto",
    dtype: DType | str = DType.FLOAT32,
    lm_head: bool = False,
    trust_remote_code: bool = False,
    tokenizer: transformers.PreTrainedTokenizerBase | None = None,
) -> Loaded:
    """Load `source` (hub id, directory, GGUF file, or what `checkpoints.inspect` found) with the capture attention.

    `lm_head` asks for the language-model head: the masked-LM head of an encoder or the causal-LM head of a
    decoder, loaded only when the checkpoint has one (see `Loaded.head`), never freshly initialised. `tokenizer`:
    the source's tokenizer when the caller read it first (`load_tokenizer`), so it is not read twice."""
    found = source if isinstance(source, checkpoints.Source) else checkpoints.inspect(source)
    key = (found.where, str(device), str(dtype), lm_head, trust_remote_code)
    if _KEPT is not None and key in _KEPT:
        return _KEPT[key]
    loaded = _load(found, device=device, dtype=dtype, lm_head=lm_head,
                   trust_remote_code=trust_remote_code, tokenizer=tokenizer)
    if _KEPT is not None:
        _KEPT[key] = loaded
    return loaded


def _files(found: checkpoints.Source, trust_remote_code: bool) -> tuple[str, dict, modelcache.Entry | None]:
    """(where transformers reads the source's files, the options it reads them with, the GGUF file's model cache
    entry or None), the hub prepared and transformers quieted. A GGUF file is checked whole first; where its cache
    entry is whole, everything is read from the entry."""
    if not found.local:
        hub.prepare()  # one quick connection attempt; unreachable → the local cache only, no retries
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cached = None
    if found.gguf_file:
        gguffile.check(found.where)
        gguffile.quiet()
        cached = modelcache.entry(found.where)
        if cached is not None and cached.ready():
            return str(cached.directory), {"trust_remote_code": trust_remote_code}, cached
    where = str(found.path) if found.gguf_file else found.given
    options = {"trust_remote_code": trust_remote_code, **({"gguf_file": found.gguf_file} if found.gguf_file else {})}
    return where, options, cached


def _cache(cached: modelcache.Entry, where: str, options: dict,
           tokenizer: transformers.PreTrainedTokenizerBase | None) -> tuple[str, dict]:
    """Build the GGUF file's cache entry — its causal LM dequantized in float32 (what the GGUF holds, lm head
    included, whatever the run asked for), config and tokenizer — and return where to load from: the entry, or the
    GGUF file again when the entry could not be written."""
    def save(folder) -> None:
        modelcache.save(AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **options),
                        tokenizer or AutoTokenizer.from_pretrained(where, **options), folder)

    try:
        cached.write(save)
    except ValueError as error:  # what transformers says of a GGUF file it cannot read (an unknown architecture)
        raise SpectraError(f"could not load '{cached.gguf}': {str(error).splitlines()[0]}") from None
    if cached.ready():
        return str(cached.directory), {"trust_remote_code": options["trust_remote_code"]}
    return where, options


def load_tokenizer(source: str | checkpoints.Source, *,
                   trust_remote_code: bool = False) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of `source` alone, before its weights load: what a run reads with it (a task file's prompts) is
    checked first, and `load(…, tokenizer=…)` takes it."""
    found = source if isinstance(source, checkpoints.Source) else checkpoints.inspect(source)
    source, (where, options, _) = found.given, _files(found, trust_remote_code)
    try:
        return AutoTokenizer.from_pretrained(where, **options)
    except OSError:
        raise _not_found(source) from None
    except ValueError as error:
        raise SpectraError(f"could not read the tokenizer of '{source}': {str(error).splitlines()[0]}") from None


def _load(found: checkpoints.Source, *, device: str | torch.device, dtype: DType | str, lm_head: bool,
          trust_remote_code: bool, tokenizer: transformers.PreTrainedTokenizerBase | None) -> Loaded:
    source = found.given
    dtype = choose(DType, dtype, "--dtype")
    torch_device = pick_device(device)
    where, options, cached = _files(found, trust_remote_code)
    if cached is not None and "gguf_file" in options:
        where, options = _cache(cached, where, options, tokenizer)
    try:
        config = AutoConfig.from_pretrained(where, **options)
    except OSError:
        raise _not_found(source) from None
    except ValueError as error:
        raise SpectraError(f"could not read the config of '{source}': {str(error).splitlines()[0]}") from None
    causal = is_decoder(config, gguf=found.gguf_file is not None)
    head = None
    if lm_head and causal:
        head = CAUSAL_LM
    elif lm_head and has_masked_lm_head(config):
        head = MASKED_LM
    model_class = {MASKED_LM: AutoModelForMaskedLM, CAUSAL_LM: AutoModelForCausalLM}.get(head, AutoModel)
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
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(where, **options)
        model = model_class.from_pretrained(where, attn_implementation=capture.NAME, dtype=DTYPES[dtype], **options)
    except OSError:
        raise _not_found(source) from None
    except ValueError as error:
        raise SpectraError(f"could not load '{source}' with the capture attention: {str(error).splitlines()[0]}") from None
    model.to(torch_device).eval()
    gguf = {"file": found.gguf_file, "quantization": gguffile.quantization(found.where)} if found.gguf_file else None
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
        head=head,
        causal=causal,
        kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        architecture=type(model).__name__ if gguf else (config.architectures or [type(model).__name__])[0],
        gguf=gguf,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    )


#: attribute names of (query, key, value) linears, and of the output linear, in common attention modules
_LINEAR_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"))
_OUT_NAMES = ("output.dense", "o_proj", "out_proj", "out_lin", "dense")
_HEAD_NAMES = ("num_attention_heads", "num_heads", "n_heads")


@dataclass
class Linears:
    """A pretrained attention module's W^Q, W^K, W^V, W^O (None when not found), head count and score scale, and
    its per-head query and key norms where it has them (QK-norm: Gemma 3, Qwen 3), applied before RoPE."""

    w_q: torch.nn.Linear
    w_k: torch.nn.Linear
    w_v: torch.nn.Linear
    w_o: torch.nn.Linear | None
    heads: int | None
    scaling: float | None
    q_norm: torch.nn.Module | None = None
    k_norm: torch.nn.Module | None = None


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
    return Linears(*linears, w_o, heads, getattr(inner, "scaling", None), getattr(inner, "q_norm", None),
                   getattr(inner, "k_norm", None))


def output_projections(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Layer index → that attention layer's output projection W^O (D × H·d, the Linear's weight, not a copy), for
    the attention modules with a `layer_idx` whose output linear `attention_linears` finds: what a press weighing a
    token by what its heads write reads (criticalkv)."""
    return {layer: linears.w_o.weight.detach() for layer, linears in layer_attentions(model)
            if linears.w_o is not None}


def layer_attentions(model: torch.nn.Module) -> Iterator[tuple[int, Linears]]:
    """(layer index, its linears) of every attention module with an integer `layer_idx` whose linears
    `attention_linears` finds, in module order: what the hooks and W^O's lookup walk."""
    for module in model.modules():
        layer = getattr(module, "layer_idx", None)
        if not isinstance(layer, int):
            continue
        try:
            found = attention_linears(module)
        except SpectraError:
            continue
        yield layer, found


def rotary(model: torch.nn.Module) -> bool:
    """Whether the model rotates queries and keys by position (RoPE) between its projections and attention."""
    config = getattr(model, "config", None)
    return any(getattr(config, name, None) for name in ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim"))


#: positions (n,) → RoPE's (cos, sin), each (n, d): the rotation the model gives a query or key at those positions
Rope = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def rope(model: torch.nn.Module) -> Rope | None:
    """The model's own rotary embedding as a function of positions (its `rotary_emb`: cos and sin with its scaling, in
    the model's dtype; a global layer's where local ones differ, Gemma 3), or None for a model without one."""
    if not rotary(model):
        return None
    found = next((module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "rotary_emb"), None)
    if found is None:
        return None
    dtype = next(model.parameters()).dtype
    kind = {"layer_type": "full_attention"} if "layer_type" in inspect.signature(found.forward).parameters else {}

    def cos_sin(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dummy = torch.zeros((), dtype=dtype, device=positions.device)
        cos, sin = found(dummy, positions.reshape(1, -1), **kind)
        return cos[0], sin[0]

    return cos_sin


#: callback(layer, which ∈ {"q", "k", "v"}, output (B, n, heads·d)) for the projections' outputs
ProjectionHook = Callable[[int, str, torch.Tensor], None]


def watch_projections(model: torch.nn.Module, callback: ProjectionHook) -> list:
    """Forward hooks on every attention module's W^Q, W^K, W^V (modules with a layer_idx whose linears are found):
    `callback` sees each projection's output before RoPE — after the query and key norms where the model has them
    (QK-norm: RoPE rotates the normed heads). Returns the handles (remove them when done)."""
    handles = []
    for layer, found in layer_attentions(model):
        for which, linear, norm in (("q", found.w_q, found.q_norm), ("k", found.w_k, found.k_norm),
                                    ("v", found.w_v, None)):
            handles.append(linear.register_forward_hook(  # a QK-norm normalises each head's d entries, as here
                lambda _module, _inputs, output, layer=layer, which=which, norm=norm: callback(layer, which, (
                    output if norm is None else norm(output.unflatten(-1, (-1, norm.weight.shape[-1]))).flatten(-2)))))
    return handles


#: called with (layer, the attention module's input (B, n, D)) before each attention layer
InputHook = Callable[[int, torch.Tensor], None]


def watch_inputs(model: torch.nn.Module, callback: InputHook) -> list:
    """Forward pre-hooks on every attention module's W^K (modules with a layer_idx whose linears are found):
    `callback` sees the attention's input after the layer's input norm (kvpress's `hidden_states`). Returns the
    handles (remove them when done)."""
    return [found.w_k.register_forward_pre_hook(lambda _module, inputs, layer=layer: callback(layer, inputs[0]))
            for layer, found in layer_attentions(model)]
