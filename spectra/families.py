"""The other efficient-attention families as training-free approximations of a pretrained model's attention.

Registered into `approximate.METHODS` next to svd/jl/linformer/pooling, so `spectra approx` and
`HeadProbe` measure them on the same footing: per-head output error, P error (every method here has an
n×n P̃), end-to-end drift and perplexity. s is the captured model's score scale (`Layer.scaling`,
usually 1/√d) and the budget k means k random features, k landmarks or k active queries.

| method | P̃ (n×n); the head output is Ṽ = P̃ V | cost per head |
| --- | --- | --- |
| performer | D̂⁻¹ φ(Q) φ(K)ᵀ, φ(x) = exp(−‖x‖²/2)/√m · exp(W x) on √s q, √s k, m = k features | O(n k d) |
| nystrom | softmax(Q K̃ᵀ s) A⁺ softmax(Q̃ Kᵀ s), A = softmax(Q̃ K̃ᵀ s), k segment means | O(n k d + k³) |
| nystrom-iter6 | the same, A⁺ by 6 steps of Nyströmformer's iteration (`nystrom_method`) | O(n k d + k³) |
| skyformer | D̃⁻¹ κ(Q, L) κ(L, L)⁺ κ(L, K) diag(exp(s‖k_j‖²/2)), Gaussian κ, k landmarks L | O(n k d + k³) |
| probsparse | P's rows for the top-k queries by M̄(q), uniform rows for the others | O(n d (k + c ln n)) |

Fastformer is not here: its additive attention needs trained w_q, w_k, so it approximates nothing of a
pretrained model's P V (see docs/methods.md). The costs are the methods' own; to measure ‖P − P̃‖ this
module also forms the n×n P̃, which no efficient implementation would.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .approximate import Approximation, Layer, Method, _pool, _windows, method
from .theory import derive_seed

_TAG_PERFORMER, _TAG_SKYFORMER, _TAG_PROBSPARSE = 601, 602, 603  # seed domains (approximate.py uses 401)
#: Informer's sampling factor c: c·⌈ln m⌉ sampled keys per query for M̄
INFORMER_FACTOR = 5
#: Nyströmformer's default number of iterations of its pseudo-inverse approximation
NYSTROM_ITERATIONS = 6


def _masked_softmax(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)


def _valid_first(valid: torch.Tensor) -> torch.Tensor:
    """Positions (B, n) with the valid ones first, in order: rank r ↦ the r-th valid position."""
    return torch.argsort((~valid).int(), dim=-1, stable=True)


# ---------------------------------------------------------------- Performer (Choromanski et al. 2021)


def orthogonal_features(m: int, d: int, seed: int) -> np.ndarray:
    """W (m, d): stacked d×d blocks of Haar-orthonormal rows, each row rescaled by an independent
    χ_d-distributed norm, so every row is marginally N(0, I_d) (FAVOR+'s orthogonal random features)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):
        basis, upper = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append((basis * np.sign(np.diag(upper))).T)  # sign fix: Haar-distributed rows
    norms = np.linalg.norm(rng.standard_normal((m, d)), axis=1)
    return np.concatenate(blocks)[:m] * norms[:, None]


@lru_cache(maxsize=256)
def _performer_w(seed: int, budget: int, layer: int, heads: int, d: int) -> np.ndarray:
    return np.stack([orthogonal_features(budget, d, derive_seed(seed, _TAG_PERFORMER, budget, layer, head))
                     for head in range(heads)])


def performer_features(x: Layer, budget: int) -> torch.Tensor:
    """The seeded W (H, m = k, d) of each head, fixed by (seed, budget, layer, head)."""
    w = _performer_w(x.seed, budget, x.layer, x.q.shape[1], x.q.shape[-1])
    return torch.tensor(w, device=x.q.device, dtype=x.q.dtype)  # a copy: the cached array stays intact


def log_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """log φ(x) (B, H, n, m) = W x − ‖x‖²/2 − ½ log m for x (B, H, n, d), W (H, m, d):
    E_W[φ(x)·φ(y)] = exp(x·y) (positive random features, Lemma 1 of the paper)."""
    return (torch.einsum("bhnd,hmd->bhnm", x, w) - x.square().sum(-1, keepdim=True) / 2
            - 0.5 * math.log(w.shape[-2]))


@method("performer")
def performer(x: Layer, budget: int) -> Approximation:
    """FAVOR+: Ṽ = D̂⁻¹ φ(Q)(φ(K)ᵀ V), D̂ = diag(φ(Q) φ(K)ᵀ 1), on √s·q and √s·k so that
    φ(q)·φ(k) is an unbiased estimate of exp(s q·k); padded keys get φ = 0.

    No additive stabiliser ε. For float safety each query's features are divided by their largest
    entry, and all keys' features of one (sequence, head) by one common largest entry: both factors
    cancel exactly in D̂⁻¹ φ(Q) φ(K)ᵀ. (A per-key shift would not cancel: it would reweight the keys.)
    D̂ is kept above the dtype's tiny, so a query whose estimate underflows gets a zero row, not NaN.
    """
    w, root = performer_features(x, budget), math.sqrt(x.scaling)
    log_q, log_k = log_features(x.q * root, w), log_features(x.k * root, w)
    phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))  # (B, H, n, m), a factor per query
    log_k = log_k.masked_fill(~x.valid[:, None, :, None], float("-inf"))
    phi_k = torch.exp(log_k - log_k.amax((-2, -1), keepdim=True))  # one factor per (sequence, head)
    d_hat = torch.einsum("bhim,bhm->bhi", phi_q, phi_k.sum(-2)).clamp_min(torch.finfo(x.q.dtype).tiny)
    out = torch.einsum("bhim,bhme->bhie", phi_q, torch.einsum("bhjm,bhje->bhme", phi_k, x.v)) / d_hat[..., None]
    p_tilde = torch.einsum("bhim,bhjm->bhij", phi_q, phi_k) / d_hat[..., None]
    return Approximation(out, p_tilde)


# ---------------------------------------------------------------- Nyströmformer (Xiong et al. 2021)


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Nyströmformer's approximation of A⁺ (…, k, k): Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))) from
    Z₀ = Aᵀ/(‖A‖₁‖A‖_∞), the norms taken per matrix (the released code takes one maximum over the whole
    batch, which would make a sequence's result depend on the others). Zero rows/columns stay zero."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)
    z = a.transpose(-1, -2) / norms[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_method(iterations: int | None = None) -> Method:
    """Nyströmformer with the pseudo-inverse exact (None) or by `iterations` steps of `iterative_pinv`."""

    def nystrom(x: Layer, budget: int) -> Approximation:
        """P̃ = softmax(Q K̃ᵀ s) A⁺ softmax(Q̃ Kᵀ s), A = softmax(Q̃ K̃ᵀ s), with landmarks Q̃, K̃ the means of
        Q and K over k contiguous windows of the valid positions (as pool-mean). Empty windows (k > m
        valid tokens) are masked: their landmarks get zero rows and columns, so A⁺ ignores them."""
        window = _windows(x.valid, budget)
        q_tilde, k_tilde = _pool(x.q, window, budget, "mean"), _pool(x.k, window, budget, "mean")
        present = torch.zeros(window.shape[0], budget + 1, dtype=torch.bool, device=window.device)
        present = present.scatter(-1, window, True)[:, None, :budget]  # (B, 1, k)
        rows = present[..., None].to(x.q.dtype)  # zero the rows of empty landmarks
        s = x.scaling
        f = _masked_softmax(torch.einsum("bhid,bhcd->bhic", x.q, k_tilde) * s, present[:, :, None, :])
        a = _masked_softmax(torch.einsum("bhcd,bhed->bhce", q_tilde, k_tilde) * s, present[:, :, None, :]) * rows
        b = _masked_softmax(torch.einsum("bhcd,bhjd->bhcj", q_tilde, x.k) * s, x.valid[:, None, None, :]) * rows
        a_plus = torch.linalg.pinv(a) if iterations is None else iterative_pinv(a, iterations)
        out = f @ (a_plus @ (b @ x.v))
        return Approximation(out, f @ a_plus @ b)

    return nystrom


#: registered Nyström variants: name → iterations of the pseudo-inverse (None: exact `torch.linalg.pinv`)
NYSTROM_VARIANTS = {"nystrom": None, f"nystrom-iter{NYSTROM_ITERATIONS}": NYSTROM_ITERATIONS}
for _name, _iterations in NYSTROM_VARIANTS.items():
    method(_name)(nystrom_method(_iterations))


# ---------------------------------------------------------------- Skyformer (Chen et al. 2021)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, scaling: float) -> torch.Tensor:
    """κ(x, y) = exp(−s‖x − y‖²/2) for x (…, n, d), y (…, c, d) → (…, n, c)."""
    distance = (x.square().sum(-1)[..., :, None] + y.square().sum(-1)[..., None, :]
                - 2 * torch.einsum("...nd,...cd->...nc", x, y)).clamp_min(0)
    return torch.exp(-scaling * distance / 2)


def skyformer_landmarks(x: Layer, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (B, H, k) of the landmarks and their mask (B, 1, k): the first ⌈k/2⌉ index queries and
    the other ⌊k/2⌋ keys, each a seeded uniform sample without replacement of the valid positions (as
    Skyformer samples half from Q, half from K), fixed by (seed, budget, layer, head, m); a sequence
    with fewer than ⌈k/2⌉ valid tokens takes them all and masks the rest."""
    batch, heads = x.valid.shape[0], x.q.shape[1]
    halves = (budget - budget // 2, budget // 2)
    ranks = np.zeros((batch, heads, budget), dtype=np.int64)
    present = np.zeros((batch, 1, budget), dtype=bool)
    lengths = x.valid.sum(-1).tolist()
    for m in set(lengths):
        rows = [b for b, length in enumerate(lengths) if length == m]
        for head in range(heads):
            rng = np.random.default_rng(derive_seed(x.seed, _TAG_SKYFORMER, budget, x.layer, head, m))
            start = 0
            for half in halves:
                chosen = rng.permutation(m)[:half]
                ranks[rows, head, start:start + len(chosen)] = chosen
                present[rows, 0, start:start + len(chosen)] = True
                start += half
    ranks_t = torch.from_numpy(ranks).to(x.valid.device)
    positions = torch.gather(_valid_first(x.valid)[:, None, :].expand(-1, heads, -1), -1, ranks_t)
    return positions, torch.from_numpy(present).to(x.valid.device)


@method("skyformer")
def skyformer(x: Layer, budget: int) -> Approximation:
    """Skyformer's Nyström of the Gaussian kernel, reweighted into softmax attention.

    exp(s q·k) = exp(s‖q‖²/2) κ(q, k) exp(s‖k‖²/2) with κ(q, k) = exp(−s‖q − k‖²/2), and the query
    factor cancels in the row normalisation, so P = D⁻¹ κ(Q, K) diag(w), w_j = exp(s‖k_j‖²/2) over
    valid keys. Nyström over the joint set [Q; K] with landmarks L (`skyformer_landmarks`) gives
    κ(Q, K) ≈ κ(Q, L) κ(L, L)⁺ κ(L, K), exact pseudo-inverse, no regulariser; then
    P̃ = D̃⁻¹ κ(Q, L) κ(L, L)⁺ κ(L, K) diag(w) with D̃ = P̃'s unnormalised row sums. w is divided by its
    largest entry (a common factor that cancels). Nyström entries may be negative, so D̃ can be ≈ 0 or
    negative for a query far from every landmark; |D̃| is only kept above the dtype's tiny.
    """
    positions, present = skyformer_landmarks(x, budget)
    half = budget - budget // 2
    index = positions[..., None].expand(-1, -1, -1, x.q.shape[-1])
    landmarks = torch.cat([torch.gather(x.q, -2, index[:, :, :half]), torch.gather(x.k, -2, index[:, :, half:])], -2)
    keep = present.to(x.q.dtype)  # (B, 1, k)
    s = x.scaling
    kernel_ql = gaussian_kernel(x.q, landmarks, s) * keep[..., None, :]  # (B, H, n, k)
    kernel_ll = gaussian_kernel(landmarks, landmarks, s) * keep[..., None, :] * keep[..., :, None]
    kernel_lk = gaussian_kernel(landmarks, x.k, s) * keep[..., :, None]  # (B, H, k, n)
    norms = (s * x.k.square().sum(-1) / 2).masked_fill(~x.valid[:, None, :], float("-inf"))
    w = torch.exp(norms - norms.amax(-1, keepdim=True))  # (B, H, n), 0 on padded keys
    kernel_lk_w = kernel_lk * w[..., None, :]
    middle = kernel_ql @ torch.linalg.pinv(kernel_ll, hermitian=True)  # (B, H, n, k)
    d_tilde = middle @ kernel_lk_w.sum(-1, keepdim=True)  # (B, H, n, 1)
    tiny = torch.finfo(x.q.dtype).tiny
    d_tilde = torch.where(d_tilde < 0, d_tilde.clamp_max(-tiny), d_tilde.clamp_min(tiny))
    out = middle @ (kernel_lk_w @ x.v) / d_tilde
    return Approximation(out, middle @ kernel_lk_w / d_tilde)


# ---------------------------------------------------------------- Informer ProbSparse (Zhou et al. 2021)


@lru_cache(maxsize=256)
def _informer_draws(seed: int, layer: int, heads: int, n: int, count: int) -> np.ndarray:
    """Uniforms (H, n, count); column t of head h comes from its own generator, so a shorter n is a prefix."""
    return np.stack([
        np.stack([np.random.default_rng(derive_seed(seed, _TAG_PROBSPARSE, layer, head, t)).random(n)
                  for t in range(count)], axis=-1)
        for head in range(heads)
    ])


def probsparse_sample(x: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Key positions (B, H, n, c) sampled for each query and their mask (B, 1, 1, c).

    As Informer: c = min(INFORMER_FACTOR·⌈ln m⌉, m) keys per query, uniform over the m valid keys, with
    replacement. Draw t of query i of head h is ⌊u·m⌋ with u the i-th number of a generator fixed by
    (seed, layer, head, t): the same for every budget (so the top-k sets are nested) and, for right
    padding, the same for a sequence alone or padded in a batch.
    """
    heads, n = x.q.shape[1:3]
    lengths = np.maximum(x.valid.sum(-1).cpu().numpy(), 1)[:, None, None, None]  # (B, 1, 1, 1)
    counts = np.minimum(INFORMER_FACTOR * np.ceil(np.log(lengths[:, 0, 0, 0])).astype(np.int64), lengths[:, 0, 0, 0])
    counts = np.maximum(counts, 1)
    draws = _informer_draws(x.seed, x.layer, heads, n, int(counts.max()))  # (H, n, c) in float64, any device
    ranks = torch.from_numpy(np.minimum((draws[None] * lengths).astype(np.int64), lengths - 1)).to(x.valid.device)
    order = _valid_first(x.valid)[:, None, :].expand(-1, heads, -1)  # (B, H, n)
    positions = torch.gather(order, -1, ranks.flatten(-2)).view(ranks.shape)
    used = np.arange(counts.max()) < counts[:, None]
    return positions, torch.from_numpy(used).to(x.valid.device)[:, None, None, :]


@method("probsparse")
def probsparse(x: Layer, budget: int) -> Approximation:
    """Informer's ProbSparse self-attention: the u = k queries with the largest sparsity measurement
    M̄(q_i) = max_j s_ij − mean_j s_ij, s_ij = s q_i·k_j over the sampled keys (`probsparse_sample`),
    keep their exact rows of P; every other query gets the mean of V over the valid keys (a uniform row
    of P̃). Padded queries are never chosen; with u ≥ m every valid row is exact."""
    positions, used = probsparse_sample(x)
    scores = torch.einsum("bhid,bhjd->bhij", x.q, x.k) * x.scaling  # only the sampled entries are read
    sampled = torch.gather(scores, -1, positions)  # (B, H, n, c)
    peak = sampled.masked_fill(~used, float("-inf")).amax(-1)
    mean = (sampled * used).sum(-1) / used.sum(-1)
    sparsity = (peak - mean).masked_fill(~x.valid[:, None, :], float("-inf"))  # M̄ (B, H, n)
    rank = torch.argsort(torch.argsort(sparsity, dim=-1, descending=True, stable=True), dim=-1)
    active = (rank < budget)[..., None]  # (B, H, n, 1)
    keys = x.valid[:, None, None, :].to(x.q.dtype)
    uniform = keys / keys.sum(-1, keepdim=True)
    p_tilde = torch.where(active, x.p, uniform)  # x.p's rows are softmax(q_i Kᵀ s) over valid keys
    return Approximation(p_tilde @ x.v, p_tilde)
