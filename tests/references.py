"""Independent reference computations the tests hold spectra's numbers against (scipy/numpy in float64)."""

from __future__ import annotations

import numpy as np
import scipy.linalg


def spectrum_reference(p: np.ndarray, at: int, size: int, sink_from: int | None = None
                       ) -> tuple[np.ndarray, dict[str, float]]:
    """Curve on the relative grid and the metrics of one m×m matrix (its valid block), in float64 with scipy;
    the sink mass counts queries from `sink_from` on (default: spectra's rule, 16 or size/8)."""
    m = p.shape[0]
    sigma = scipy.linalg.svdvals(p.astype(np.float64))
    cum = np.cumsum(sigma) / sigma.sum()
    grid = np.interp(np.arange(1, size + 1) / size, np.arange(0, m + 1) / m, np.concatenate([[0.0], cum]))
    share = sigma / sigma.sum()
    share = share[share > 0]
    metrics = {
        "sigma1": sigma[0],
        "nuclear": sigma.sum(),
        "stable_rank": np.linalg.norm(p, "fro") ** 2 / np.linalg.norm(p, 2) ** 2,
        "erank": np.exp(-(share * np.log(share)).sum()),
        "rank90": next(i + 1 for i, c in enumerate(cum) if c >= 0.9),
        "rank99": next(i + 1 for i, c in enumerate(cum) if c >= 0.99),
        "c_at": grid[at - 1],
        "length": m,
    }
    begin = min(max(1, min(16, size // 8)) if sink_from is None else sink_from, m - 1)
    rows = p.astype(np.float64)
    metrics["sink"] = rows[begin:, 0].mean()
    metrics["entropy"] = np.mean([-(row[row > 0] * np.log(row[row > 0])).sum() for row in rows])
    return grid, metrics


def eager_ranks(model_dir, text_file, n: int, samples: int, mode: str = "pack", seed: int = 0) -> np.ndarray:
    """rank90 and rank99 (sequences, layers, heads, 2) of every sequence of a run, each from its own forward pass
    alone through eager attention and a float64 scipy SVD of its P."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from spectra import data

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file), seed=seed)
    ranks = []
    for batch in data.batches(tokenizer, corpus, n, mode, samples, 1):
        with torch.no_grad():
            attentions = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               output_attentions=True).attentions
        m = int(batch.attention_mask.sum())
        p = torch.stack(attentions, dim=1)[0, :, :, :m, :m].double().numpy()  # (layers, heads, m, m)
        sigma = np.stack([[scipy.linalg.svdvals(head) for head in layer] for layer in p])
        cum = np.cumsum(sigma, -1) / sigma.sum(-1, keepdims=True)
        ranks.append(np.stack([(cum < share).sum(-1) + 1 for share in (0.9, 0.99)], axis=-1))
    return np.array(ranks, dtype=np.float64)


def poisson_replicates(values: np.ndarray, replicates: int, seed: int = 0) -> np.ndarray:
    """Poisson-bootstrap replicates (replicates, *values.shape[1:]) of the mean over axis 0 of `values`, sequence i
    weighted by `replicates` Poisson(1) draws from the generator seeded by (seed, bootstrap domain, i)."""
    from spectra.seeds import Domain, derive_seed

    weights = np.stack([np.random.default_rng(derive_seed(seed, Domain.BOOTSTRAP, i)).poisson(1.0, replicates)
                        for i in range(len(values))]).astype(np.float64)  # (sequences, replicates)
    total = np.tensordot(weights, values, axes=(0, 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / weights.sum(0).reshape(-1, *[1] * (values.ndim - 1))


def additive_attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, valid: np.ndarray, causal: bool,
                                 w_q: np.ndarray, w_k: np.ndarray, w_r: np.ndarray, b_r: np.ndarray) -> np.ndarray:
    """Fastformer's additive attention on one head of one sequence (n, d), in numpy, position by position: each
    query's global query and key pool the valid positions it may see (all, or for `causal` those at or before
    it, p_j formed with position j's own global query); o_i = W_r (k_g ⊙ v_i) + b_r."""
    n, d = q.shape
    scale = d ** -0.5

    def pool(logits: np.ndarray, x: np.ndarray, seen: list[int]) -> np.ndarray:
        if not seen:
            return np.zeros(d)
        weights = np.exp(logits[seen] - logits[seen].max())
        return weights / weights.sum() @ x[seen]

    def seen(i: int) -> list[int]:
        return [j for j in range(n) if valid[j] and (j <= i or not causal)]

    q_g = np.stack([pool(q @ w_q * scale, q, seen(i)) for i in range(n)])
    p = q_g * k
    k_g = np.stack([pool(p @ w_k * scale, p, seen(i)) for i in range(n)])
    return (k_g * v) @ w_r.T + b_r
