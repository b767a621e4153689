"""KVgrad's attribution pass (arXiv: KVgrad, OpenReview cg1wTCJjjk): how much each cached context pair moves the
model's last hidden states while it repeats the context, by input × gradient — scored once per example for every
layer.

As KVzip (`kv.reconstruction`), the model reads, after the exact prefill of the L context tokens, a prompt asking it
to repeat the context and the context itself, chunk by chunk (`Repetition.chunks`, here `CHUNK` = 512 tokens, kvpress
0.5.5's `KVgradPress` default), attending to the prefilled cache. Each chunk's pass is differentiated: the objective
Φ = Σ_p ‖h_p‖² (h: the last decoder layer's output, before the final norm, over the n repeat tokens p) is
backpropagated to every layer's attention output a_p (after W^O), whose gradient says how much Φ relies on the
residual stream there. A cached pair c of the chunk, in layer l and key/value head h, scores

    S = max over the group's query heads g and the repeat tokens p of  A_{g,p,c} · ‖v_c W^O_g‖ · ‖∂Φ/∂a_p‖,

A being KVzip's reconstruction weights (`reconstruction.chunk_weights`: the softmax over the sinks, the chunk's
cached keys and the repeat's own keys), ‖v_c W^O_g‖ the size of what the pair writes into the residual stream
through query head g. The first `SINKS` positions are then raised above every score (max + 1), as in KVzip; the
`kvgrad` press ranks the result across layers as `kvzip` does.

The pass runs outside inference mode with gradients on: the prefilled keys and values (made under inference mode)
are cloned, the model's parameters are frozen for the pass (only activations are differentiated), and the repeat
enters as embeddings that require a gradient. Each layer's attention is the exact SDPA over the whole cache and the
repeat (`reconstruction.repeat_attention`), differentiable through the repeat's queries, keys and values; a
sliding-window layer (Gemma 3's local layers, `spectra.sliding`) attends within its window, as the model's own forward
over context and repeat does, so the hidden states, their gradients and the later layers' queries are the model's
(the weights A stay KVzip's subset softmax, as in `kv.reconstruction`). On a model with local layers the `kvgrad`
press ranks the global layers' pairs alone (`KVzip.for_run`), the local ones keeping their windows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from .. import capture, models, sliding
from ..capture import Captured
from ..kernels import softmax_dtype
from .reconstruction import SINKS, Repetition, chunk_weights, repeat_attention

#: kvpress's KVgradPress chunk_size: context tokens repeated (and differentiated) per pass
CHUNK = 512


@contextlib.contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """The model's trainable parameters made constant for the block (gradients of activations only)."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    for parameter in trainable:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


def value_norms(w_o: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(H_kv, G, t): ‖v W^O_g‖ for each value v of `values` (H_kv, t, d) through each query head g of its group, W^O
    `w_o` (D, H·d) split per query head."""
    kv_heads, _, dim = values.shape
    split = w_o.view(w_o.shape[0], kv_heads, -1, dim)  # (D, H_kv, G, d)
    return torch.einsum("jhgi,hti->hgtj", split, values).norm(dim=-1)


def chunk_attribution(weights: torch.Tensor, norms: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """(H_kv, t): max over g and p of weights (H_kv, G, n, t) · norms (H_kv, G, t) · gradient (n,) norms."""
    return (weights * norms[:, :, None, :] * gradient[None, None, :, None]).amax(dim=(1, 2))


def scores(model: torch.nn.Module, layers: int, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
           ids: torch.Tensor, repetition: Repetition, index: int, chunk: int = CHUNK) -> torch.Tensor:
    """(layers, H_kv, L): every cached pair's attribution score (see the module docstring), given each layer's
    prefilled `keys` and `values` (H_kv, L, d, post-RoPE) of the context `ids` (L,); `index` is the example's global
    index (the captured records carry it)."""
    length = ids.shape[-1]
    w_o = models.output_projections(model)
    decoder = model.get_decoder()
    windows = sliding.of_model(model) or [None] * layers
    with torch.inference_mode(False), torch.enable_grad(), frozen(model):
        keys = [key.clone() for key in keys]
        values = [value.clone() for value in values]
        found = keys[0].new_zeros(layers, keys[0].shape[0], length)
        for start, stop, repeat in repetition.chunks(ids, chunk):
            weights: dict[int, torch.Tensor] = {}
            outputs: dict[int, torch.Tensor] = {}
            last: list[torch.Tensor] = []

            def substitute(captured: Captured, start: int = start, stop: int = stop) -> torch.Tensor:
                layer = captured.layer
                with torch.no_grad():
                    weights[layer] = chunk_weights(captured.q[0].detach(), captured.key[0].detach(), keys[layer],
                                                   start, stop)
                return repeat_attention(captured.q, keys[layer], values[layer], captured.key, captured.value,
                                        captured.scaling, windows[layer])

            def attended(module: torch.nn.Module, args: tuple, output: tuple) -> None:
                out = output[0] if isinstance(output, tuple) else output
                out.retain_grad()
                outputs[int(module.layer_idx)] = out

            def ended(module: torch.nn.Module, args: tuple, output: tuple) -> None:
                last.append(output[0] if isinstance(output, tuple) else output)

            hooks = [decoder.layers[-1].register_forward_hook(ended)]
            hooks += [layer.self_attn.register_forward_hook(attended) for layer in decoder.layers]
            try:
                embedded = model.get_input_embeddings()(repeat[None].to(ids.device)).detach().requires_grad_(True)
                positions = torch.arange(length, length + repeat.shape[-1], device=ids.device)[None]
                with capture.capturing(None, substitute, [index]):
                    decoder(inputs_embeds=embedded, position_ids=positions, use_cache=False)
            finally:
                for handle in hooks:
                    handle.remove()
            hidden = last[-1]
            hidden.to(softmax_dtype(hidden.dtype)).square().sum().backward()  # float32 or wider, as kvpress
            with torch.no_grad():
                for layer in range(layers):
                    grad = outputs[layer].grad[0]
                    gradient = grad.to(softmax_dtype(grad.dtype)).norm(dim=-1)  # (n,)
                    norms = value_norms(w_o[layer], values[layer][:, start:stop])
                    found[layer, :, start:stop] = chunk_attribution(weights[layer], norms, gradient)
        found = found.detach()
        found[..., :SINKS] = found.amax() + 1.0
    return found
