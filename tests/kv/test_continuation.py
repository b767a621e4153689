"""The cache engine against dense references written here: the continuation scored against a compressed cache equals
one forward pass over context + continuation in which every layer and head hides the evicted context keys from
the continuation queries (ThinK: shows them with the pruned channels zeroed); the full cache equals the plain
model; the per-head measures and the token measures equal numpy formulas. Float64 throughout, so the routes agree to
float64 rounding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from spectra import capture, models
from spectra.kv import cell, composition, continuation, gradient, headpattern, reconstruction
from spectra.kv.presses import REGISTRY, full, per_head, run_presses
from spectra.kv.presses.simlayerkv import SimLayerKV

import tiny
from ..anatomy.test_headweights import fake_run

CONTEXT, CONTINUATION = 72, 9


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    """A tiny Llama with 6 query heads over 2 key/value heads, in float64, and a sequence of its tokens."""
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    ids = torch.randint(3, len(loaded.tokenizer), (1, CONTEXT + CONTINUATION),
                        generator=torch.Generator().manual_seed(0))
    return loaded, ids


def prefilled(loaded, ids) -> dict:
    """Each layer's prefill and captured record, read off one forward over the whole sequence (with the context's
    keys and queries before RoPE, the model's RoPE and each layer's W^O, which expected_attention, compactor and
    criticalkv read), and every prefill pass (`kv.passes`): the received attention, the queries before RoPE, KVzip's
    reconstruction scores of the context, KVCompose's replay scores, KVgrad's attribution scores and each layer's
    attention input (kvzap's)."""
    found, pre, w_o, states = {}, {}, models.output_projections(loaded.model), {}

    def observe(captured):
        key_pre = pre.pop((captured.layer, "k"))[0, :CONTEXT].unflatten(-1, (captured.key.shape[1], -1))
        hooked = {"q": pre.pop((captured.layer, "q"))[0, :CONTEXT]}
        found[captured.layer] = (captured, continuation.from_captured(
            captured, 0, CONTEXT, key_pre.transpose(0, 1), 0, 0, w_o[captured.layer], models.rope(loaded.model),
            reads=("received", "query_pre"), hooked=hooked))

    def projection(layer, which, output):
        pre[layer, which] = output

    hooks = models.watch_projections(loaded.model, projection) + models.watch_inputs(loaded.model, states.__setitem__)
    try:
        outputs = capture.forward(loaded.model, loaded.layers, observe, None, [0], input_ids=ids)
    finally:
        for handle in hooks:
            handle.remove()
    parts = [found[layer][1] for layer in range(loaded.layers)]
    keys, values = [part.key for part in parts], [part.value for part in parts]
    repetition = reconstruction.Repetition.of(loaded.tokenizer)
    scores = reconstruction.scores(loaded.model, loaded.layers, keys, values, ids[0, :CONTEXT], repetition, 0)
    composed = composition.scores(loaded.model, loaded.layers, ids[0, :CONTEXT], 0)  # KVCompose's replay pass
    attributed = gradient.scores(loaded.model, loaded.layers, keys, values, ids[0, :CONTEXT], repetition, 0)
    found = {layer: (captured, replace(part, passes={**part.passes, "reconstruction": scores, "composition": composed,
                                                     "gradient": attributed, "hidden": states[layer][0, :CONTEXT]}))
             for layer, (captured, part) in found.items()}
    return found, outputs.logits[0]


def dense_reference(loaded, ids, parts: dict) -> torch.Tensor:
    """Logits of one forward pass over all tokens where continuation query i ≥ L of layer ℓ, head h sees the context
    keys kept for (ℓ, h's key/value head) — with their rows as the press left them, or a transform's rows — and
    continuation keys ≤ i; the continuation at positions L, L + 1, … or, after a press that renumbered its m kept
    tokens, m, m + 1, …"""
    start = {part.start for part in parts.values()}.pop() or CONTEXT
    positions = torch.cat([torch.arange(CONTEXT), torch.arange(start, start + ids.shape[-1] - CONTEXT)])[None]

    def substitute(captured):
        q, key, value = captured.q[0], captured.key[0], captured.value[0]  # (H, n, d), (H_kv, n, d)
        part = parts[captured.layer]
        groups = q.shape[0] // key.shape[0]
        n = q.shape[1]
        outputs = torch.zeros_like(q)
        for head in range(q.shape[0]):
            kv = head // groups
            if part.kept is None:  # a transform: its rows are what the continuation sees of the context
                seen_keys, seen_values = part.key[kv], part.value[kv]
            else:  # the kept tokens, with their rows as the press left them (ThinK: zeroed channels)
                rows = slice(None) if part.valid is None else part.valid[kv]  # per-head counts: padding hidden
                kept = part.kept[kv][rows]
                seen_keys = key[kv, :CONTEXT][kept] if part.key is None else part.key[kv][rows]
                seen_values = value[kv, :CONTEXT][kept] if part.value is None else part.value[kv][rows]
            for i in range(n):
                if i < CONTEXT:
                    keys, values = key[kv, : i + 1], value[kv, : i + 1]
                else:
                    keys = torch.cat([seen_keys, key[kv, CONTEXT: i + 1]])
                    values = torch.cat([seen_values, value[kv, CONTEXT: i + 1]])
                weights = torch.softmax(keys @ q[head, i] * captured.scaling, dim=-1)
                outputs[head, i] = weights @ values
        return outputs[None]

    return capture.forward(loaded.model, loaded.layers, None, substitute, [0], input_ids=ids,
                           position_ids=positions).logits[0]


def engine(loaded, ids, parts_per_variant: list[dict], layers: dict, first: torch.Tensor) -> torch.Tensor:
    """Logits (variants, C, vocab) of the continuation through the engine: the prefill's last position, then the
    batched continuation against the compressed caches."""
    stacked = {layer: continuation.stack([parts[layer] for parts in parts_per_variant], prefill.key, prefill.value)
               for layer, (_, prefill) in layers.items()}
    starts = [cell.start(list(parts.values()), CONTEXT) for parts in parts_per_variant]
    rest = continuation.continuation_logits(loaded.model, loaded.layers, stacked.__getitem__, ids[0, CONTEXT:-1], starts,
                                            0, len(parts_per_variant))
    return torch.cat([first.expand(len(parts_per_variant), 1, -1), rest], dim=1)


def learned_artifacts(folder, layers: dict) -> list[str]:
    """`qfilter(DIR)`, `expected_attention_stats(DIR)` and `kvzap(DIR)` (linear and MLP) with random artifacts of the
    model's shape."""
    from spectra.kv import artifacts

    prefill = layers[0][1]
    count, heads, kv_heads, dim = len(layers), prefill.q.shape[0], prefill.kv_heads, prefill.head_dim
    generator = torch.Generator().manual_seed(5)
    filters = artifacts.write(folder / "qf", {"q_filters": torch.randn(count, kv_heads, dim, generator=generator)},
                              {"num_layers": count, "num_kv_heads": kv_heads, "kv_head_dim": dim})
    factor = torch.randn(count, heads, dim, dim, generator=generator) * 0.2
    stats = artifacts.write(folder / "stats", {"query_mean": torch.randn(count, heads, dim, generator=generator),
                                               "query_cov": factor @ factor.transpose(-1, -2)},
                            {"num_layers": count, "num_heads": heads, "head_dim": dim})
    width, surrogates = prefill.read("hidden").shape[-1], []
    for hidden_dim in (None, 7):
        parts = ({"": (kv_heads, width)} if hidden_dim is None else
                 {"0.": (hidden_dim, width), "2.": (kv_heads, hidden_dim)})
        tensors = {f"layers.{layer}.{part}{which}": torch.randn(shape if which == "weight" else shape[:1],
                                                                  generator=generator)
                   for layer in range(count) for part, shape in parts.items() for which in ("weight", "bias")}
        surrogates.append(artifacts.write(folder / f"zap{hidden_dim}", tensors, {
            "model_type": "kvzap", "input_dim": width, "output_dim": kv_heads, "n_modules": count,
            "hidden_dim": hidden_dim}))
    return [f"qfilter({filters})", f"expected_attention_stats({stats})", *(f"kvzap({zap})" for zap in surrogates)]


def test_every_press_equals_the_dense_forward_that_hides_its_evicted_keys(gqa_llama, tmp_path) -> None:
    loaded, ids = gqa_llama
    layers, logits = prefilled(loaded, ids)
    pattern = headpattern.write(tmp_path / "duo", np.array([[0.2, 0.9], [0.8, 0.1]]), 4, 8)
    run, _ = fake_run(tmp_path / "run")
    plan = pd.DataFrame([{"budget": 0.5, "layer": layer, "kv_head": head, "press": press, "ratio": 0.5, "best": True}
                         for layer in range(loaded.layers) for head, press in enumerate(("knorm", "think"))])
    plan.to_csv(tmp_path / "cache_axes.csv", index=False)
    curve = tmp_path / "curve.npy"  # LU-KV's budget: heads pruned 30 % and 70 % at the ratio 0.5
    np.save(curve, np.broadcast_to(np.array([0.3, 0.7]), (99, loaded.layers, 2)))
    arguments = ["adakv(knorm)", "adakv(snapkv)", f"duo({pattern})", f"headbudget({run})", f"mixed({tmp_path})",
                 "criticaladakv(knorm)", f"lukv({curve})"]
    wrapped = ["criticalkv(snapkv)", "chunkkv(knorm)", "entropy_gated_chunkkv(snapkv)", "chunk(keydiff)",
               "block(streaming)", "key_rerotation(knorm)", "key_rerotation(snapkv)", "composed(snapkv,knorm)",
               "composed(knorm,think)", "merging(knorm)", *learned_artifacts(tmp_path, layers)]
    names = [*REGISTRY.bare(), *arguments, *wrapped]  # presses with an argument too
    built = run_presses(names, layers=loaded.layers)  # as a run builds them (pyramidkv reads the layer count)
    built["simlayerkv: all lazy"] = SimLayerKV(0.0, n_recent=40)  # kvpress's defaults compress nothing at L = 72
    names.append("simlayerkv: all lazy")
    variants = [{layer: built[name].compress(prefill, 0.5) for layer, (_, prefill) in layers.items()}
                for name in names]
    through_cache = engine(loaded, ids, variants, layers, logits[CONTEXT - 1])
    for name, parts, got in zip(names, variants, through_cache):
        reference = dense_reference(loaded, ids, parts)[CONTEXT - 1: -1]
        assert torch.allclose(got, reference, atol=1e-10, rtol=0), name
        if name.startswith("kivi") or name == "simlayerkv":  # KIVI quantizes 128 tokens at a time, SimLayerKV
            # streams no layer at its threshold of 1.0 nor below 4 + 1024 + 1 tokens: a 72-token context stays whole
            assert parts[0].saved == 0 and torch.allclose(got, logits[CONTEXT - 1: -1], atol=1e-10), name
            continue
        assert not torch.allclose(got, logits[CONTEXT - 1: -1], atol=1e-4), f"{name} changed nothing"
    knorm = variants[names.index("knorm")][0].kept
    assert not torch.equal(knorm[0], knorm[1]), "key/value heads keep different tokens"
    for name in arguments:  # the presses with an argument keep different counts per head
        assert any(part.valid is not None for part in variants[names.index(name)].values()), f"{name}: equal counts"


def per_head_caches(layers: dict, seed: int) -> dict:
    """Each layer's cache keeping a different random number of random context tokens per key/value head."""
    generator = torch.Generator().manual_seed(seed)
    found = {}
    for layer, (_, prefill) in layers.items():
        keep = torch.zeros(prefill.kv_heads, CONTEXT, dtype=torch.bool)
        for head, count in enumerate((5 + 30 * layer, 60 - 20 * layer)):
            keep[head, torch.randperm(CONTEXT, generator=generator)[:count]] = True
        found[layer] = per_head(prefill, keep)
    return found


def test_per_head_counts_equal_the_dense_forward_that_hides_what_each_head_evicted(gqa_llama) -> None:
    loaded, ids = gqa_llama
    layers, logits = prefilled(loaded, ids)
    variants = [per_head_caches(layers, 0), {layer: full(prefill) for layer, (_, prefill) in layers.items()},
                per_head_caches(layers, 1)]
    assert all(part.valid is not None for parts in variants[::2] for part in parts.values())
    through_cache = engine(loaded, ids, variants, layers, logits[CONTEXT - 1])
    for parts, got in zip(variants, through_cache):
        reference = dense_reference(loaded, ids, parts)[CONTEXT - 1: -1]
        assert torch.allclose(got, reference, atol=1e-10, rtol=0)
    captured, prefill = layers[0]
    mass, _ = continuation.head_measures(captured, 0, CONTEXT, [variants[0][0]], prefill)
    p = captured.p[0, :, CONTEXT:].numpy()
    for head in range(6):
        part = variants[0][0]
        kept = part.kept[head // 3][part.valid[head // 3]].numpy()
        share = p[head][:, kept].sum(-1) / p[head][:, :CONTEXT].sum(-1)
        assert mass[0, head].item() == pytest.approx(share.mean(), abs=1e-12)


def test_a_quantized_cache_equals_the_dense_forward_over_its_dequantized_rows(gqa_llama) -> None:
    from spectra.kv.presses.kivi import Kivi

    loaded, ids = gqa_llama
    layers, logits = prefilled(loaded, ids)
    press = Kivi(2, group=8, residual=16)  # 64 keys and 56 values quantized of 72
    parts = {layer: press.compress(prefill, 0.5) for layer, (_, prefill) in layers.items()}
    got = engine(loaded, ids, [parts], layers, logits[CONTEXT - 1])[0]
    assert torch.allclose(got, dense_reference(loaded, ids, parts)[CONTEXT - 1: -1], atol=1e-10, rtol=0)
    assert not torch.allclose(got, logits[CONTEXT - 1: -1], atol=1e-4), "2 bits changed nothing"


def test_the_full_cache_equals_the_plain_model(gqa_llama) -> None:
    loaded, ids = gqa_llama
    layers, logits = prefilled(loaded, ids)
    whole = {layer: full(prefill) for layer, (_, prefill) in layers.items()}
    got = engine(loaded, ids, [whole], layers, logits[CONTEXT - 1])[0]
    plain = loaded.model(input_ids=ids).logits[0]
    assert torch.allclose(got, plain[CONTEXT - 1: -1], atol=1e-10, rtol=0)
    reference = dense_reference(loaded, ids, whole)[CONTEXT - 1: -1]
    assert torch.allclose(got, reference, atol=1e-10, rtol=0)


def test_head_measures_equal_numpy(gqa_llama) -> None:
    loaded, ids = gqa_llama
    layers, _ = prefilled(loaded, ids)
    captured, prefill = layers[1]
    parts = [full(prefill), REGISTRY["knorm"].compress(prefill, 0.5), REGISTRY["think"].compress(prefill, 0.5)]
    mass, error = continuation.head_measures(captured, 0, CONTEXT, parts, prefill)
    p = captured.p[0, :, CONTEXT:].numpy()  # (H, C, n)
    v = np.repeat(captured.value[0].numpy(), 3, axis=0)
    exact = p @ v
    kept = np.repeat(parts[1].kept.numpy(), 3, axis=0)
    for head in range(6):
        share = p[head][:, kept[head]].sum(-1) / p[head][:, :CONTEXT].sum(-1)
        assert mass[1, head].item() == pytest.approx(share.mean(), abs=1e-12)
        q = captured.q[0, head, CONTEXT:].numpy()
        key = captured.key[0, head // 3].numpy()
        keys = np.r_[key[kept[head]], key[CONTEXT:]]
        values = np.r_[v[head][kept[head]], v[head][CONTEXT:]]
        scores = q @ keys.T * captured.scaling
        scores[:, len(kept[head]):] = np.where(np.tril(np.ones((CONTINUATION, CONTINUATION), bool)),
                                               scores[:, len(kept[head]):], -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        out = (weights / weights.sum(-1, keepdims=True)) @ values
        relative = np.linalg.norm(out - exact[head]) / np.linalg.norm(exact[head])
        assert error[1, head].item() == pytest.approx(relative, rel=1e-9)
    assert torch.all(mass[0] == 1) and error[0].max() < 1e-12, "the full cache loses nothing"
    assert torch.allclose(mass[2], torch.ones(6, dtype=mass.dtype)) and error[2].min() > 0, "ThinK keeps every token"


def test_token_measures_equal_numpy() -> None:
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.standard_normal((3, 5, 11)))
    targets = torch.from_numpy(rng.integers(0, 11, 5))
    reference = torch.log_softmax(torch.from_numpy(rng.standard_normal((5, 11))), dim=-1)
    nll, kl, agree = continuation.token_measures(logits, targets, reference)
    logp = logits.numpy() - np.log(np.exp(logits.numpy()).sum(-1, keepdims=True))
    ref = reference.numpy()
    np.testing.assert_allclose(nll.numpy(), -np.take_along_axis(logp, targets.numpy()[None, :, None].repeat(3, 0),
                                                                 -1)[..., 0], rtol=1e-12)
    np.testing.assert_allclose(kl.numpy(), (np.exp(ref) * (ref - logp)).sum(-1), rtol=1e-10)
    np.testing.assert_array_equal(agree.numpy(), logp.argmax(-1) == ref.argmax(-1))


def numpy_rope(rows: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """rows (…, n, d) rotated by RoPE to `positions` (n,): angle p · θ^(−2i/d) on channels i and d/2 + i."""
    dim = rows.shape[-1]
    angles = positions.astype(np.float64)[:, None] * theta ** (-np.arange(0, dim, 2) / dim)
    angles = np.concatenate([angles, angles], axis=-1)
    half = np.concatenate([-rows[..., dim // 2:], rows[..., :dim // 2]], axis=-1)
    return rows * np.cos(angles) + half * np.sin(angles)


def rerotated(loaded, layers: dict, ratio: float) -> tuple[dict, dict]:
    """key_rerotation(knorm)'s caches, and the same caches with their keys rotated here: the keys before RoPE of the
    kept positions turned to 0 … m − 1 by numpy."""
    theta = loaded.model.config.rope_parameters["rope_theta"]
    press = REGISTRY["key_rerotation(knorm)"]
    parts = {layer: press.compress(prefill, ratio) for layer, (_, prefill) in layers.items()}
    independent = {}
    for layer, (_, prefill) in layers.items():
        kept = parts[layer].kept.numpy()
        pre = np.take_along_axis(prefill.key_pre.numpy(), kept[..., None], axis=1)
        rows = torch.from_numpy(numpy_rope(pre, np.arange(kept.shape[-1]), theta))
        independent[layer] = replace(parts[layer], key=rows)
    return parts, independent


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_key_rerotation_equals_the_dense_forward_with_its_keys_at_0_to_m_and_the_continuation_from_m(
        gqa_llama, ratio) -> None:
    loaded, ids = gqa_llama
    layers, logits = prefilled(loaded, ids)
    parts, independent = rerotated(loaded, layers, ratio)
    m = parts[0].kept.shape[-1]
    assert all(part.start == m for part in parts.values()) and m == int(CONTEXT * (1 - ratio))
    knorm = {layer: REGISTRY["knorm"].compress(prefill, ratio) for layer, (_, prefill) in layers.items()}
    got, unrotated = engine(loaded, ids, [parts, knorm], layers, logits[CONTEXT - 1])  # one batch, two starts
    reference = dense_reference(loaded, ids, independent)[CONTEXT - 1: -1]
    # the model's rotary module computes its angles in float32 (transformers), numpy in float64: the keys differ by
    # ~1e-6 and the logits by ~1e-5 at most, where rerotating moves them by ~10
    assert torch.allclose(got, reference, atol=1e-4, rtol=0)
    assert torch.allclose(unrotated, dense_reference(loaded, ids, knorm)[CONTEXT - 1: -1], atol=1e-10, rtol=0)
    assert not torch.allclose(got, unrotated, atol=1e-4), "rerotation changed nothing"


def test_head_measures_of_key_rerotation_put_the_continuation_at_m(gqa_llama) -> None:
    loaded, ids = gqa_llama
    layers, _ = prefilled(loaded, ids)
    captured, prefill = layers[1]
    theta = loaded.model.config.rope_parameters["rope_theta"]
    part = rerotated(loaded, layers, 0.5)[1][1]
    _, error = continuation.head_measures(captured, 0, CONTEXT, [part], prefill)
    shift = np.full(CONTINUATION, part.start - CONTEXT)
    p = captured.p[0, :, CONTEXT:].numpy()
    v = np.repeat(captured.value[0].numpy(), 3, axis=0)
    exact = p @ v
    for head in range(6):
        kv = head // 3
        q = numpy_rope(captured.q[0, head, CONTEXT:].numpy(), shift, theta)  # from L + i to m + i
        keys = np.r_[part.key[kv].numpy(), numpy_rope(captured.key[0, kv, CONTEXT:].numpy(), shift, theta)]
        values = np.r_[v[head][part.kept[kv].numpy()], v[head][CONTEXT:]]
        scores = q @ keys.T * captured.scaling
        scores[:, part.start:] = np.where(np.tril(np.ones((CONTINUATION, CONTINUATION), bool)),
                                          scores[:, part.start:], -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        out = (weights / weights.sum(-1, keepdims=True)) @ values
        relative = np.linalg.norm(out - exact[head]) / np.linalg.norm(exact[head])
        assert error[0, head].item() == pytest.approx(relative, rel=1e-6)  # the model's float32 angles, as above
    _, at_context = continuation.head_measures(captured, 0, CONTEXT, [replace(part, start=None)], prefill)
    assert not torch.allclose(error, at_context, rtol=1e-3), "the continuation's positions changed nothing"
