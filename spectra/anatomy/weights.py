"""The spectra of a head's weights: what rank its query-key and output-value circuits allow.

Per layer and query head h, with g = h // (H / H_kv) its key/value group (grouped-query attention repeats each
key/value head to H/H_kv consecutive query heads, as eager attention does), d the head dimension and D the model
width:

- W_QK = W_Q,hᵀ · W_K,g (D × D): the bilinear form of the scores, x_i W_QK x_jᵀ = q_i · k_j before any rotary
  encoding (pre-RoPE: the linears' weights; a rotation by position changes the form per pair of positions);
- W_OV = W_O,h · W_V,g (D × D): what the head writes for the tokens it reads;

W_Q,h = W^Q[h·d:(h+1)·d, :] (d × D), W_K,g, W_V,g likewise from W^K, W^V, and W_O,h = W^O[:, h·d:(h+1)·d] (D × d).
Both products have rank ≤ d; their singular values are those of a d × d matrix (`product_sigma`: the R factors of
the two thin QR decompositions), not of the D × D product. The normalized cumulative curve and rank90 follow the
definitions used for P (`spectrum`). Biases are left out: they shift the scores by terms a head cannot route.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .diagnosis import energy_rank
from ..errors import SpectraError
from ..models import attention_linears


def group_of(heads: int, kv_heads: int) -> np.ndarray:
    """Each query head's key/value head (heads,): h // (heads / kv_heads), the repeat_interleave convention."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads evenly")
    return np.arange(heads) // (heads // kv_heads)


def product_sigma(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Singular values (descending, min(r, D) of them) of left · right, left (D × r), right (r × D'), in float64,
    from the r × r matrix R_l R_rᵀ (left = Q_l R_l, rightᵀ = Q_r R_r; the Q factors have orthonormal columns)."""
    r_left = np.linalg.qr(np.asarray(left, np.float64), mode="r")
    r_right = np.linalg.qr(np.asarray(right, np.float64).T, mode="r")
    return np.linalg.svd(r_left @ r_right.T, compute_uv=False)


@dataclass(frozen=True)
class LayerWeights:
    """One attention layer's W^Q (H·d × D), W^K, W^V (H_kv·d × D), W^O (D × H·d) and output bias, as float64 numpy."""

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    b_o: np.ndarray | None


def attention_weights(model: torch.nn.Module) -> list[LayerWeights]:
    """Every attention layer's weights in forward order: the modules whose query/key/value and output linears
    `models.attention_linears` finds (BERT's BertAttention, Llama's LlamaAttention, …), each linear once."""
    found, seen = [], set()
    for module in model.modules():
        try:
            linears = attention_linears(module)
        except SpectraError:
            continue
        if linears.w_o is None or id(linears.w_q) in seen:
            continue
        seen.add(id(linears.w_q))

        def plain(linear: torch.nn.Linear) -> np.ndarray:
            return linear.weight.detach().to("cpu", torch.float64).numpy()

        bias = linears.w_o.bias
        found.append(LayerWeights(plain(linears.w_q), plain(linears.w_k), plain(linears.w_v), plain(linears.w_o),
                                  None if bias is None else bias.detach().to("cpu", torch.float64).numpy()))
    return found


def head_spectra(layers: list[LayerWeights], heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    """σ of W_QK and W_OV per (layer, head) (layers, heads, d), their normalized cumulative curves and rank90/99."""
    groups = group_of(heads, kv_heads)
    d = layers[0].w_q.shape[0] // heads
    qk, ov = np.zeros((len(layers), heads, d)), np.zeros((len(layers), heads, d))
    for layer, w in enumerate(layers):
        for head, group in enumerate(groups):
            own, shared = slice(head * d, (head + 1) * d), slice(group * d, (group + 1) * d)
            qk[layer, head] = product_sigma(w.w_q[own].T, w.w_k[shared])
            ov[layer, head] = product_sigma(w.w_o[:, own], w.w_v[shared])
    found: dict[str, np.ndarray] = {}
    for name, sigma in (("qk", qk), ("ov", ov)):
        total = sigma.cumsum(-1)
        found[f"{name}_sigma"] = sigma
        found[f"{name}_cum"] = total / np.maximum(total[..., -1:], np.finfo(float).tiny)
        found[f"{name}_rank90"] = energy_rank(sigma, 0.9)
        found[f"{name}_rank99"] = energy_rank(sigma, 0.99)
    return found
