"""Approximations of a pretrained model's attention at a budget k, training-free or fitted: one file per family.

Each file defines a `base.Method` subclass decorated `@register`, whose class body states what it is (family,
causal, random, calibrates) and its `variants` — each label with its instance's keyword arguments: a parameter, its
plot style and terminal header — as literals that `spectra.registry` reads from the source (with the file's `ORDER`,
where its labels come in listings), so --help lists them and an unknown name is refused without importing torch;
and `approximate(layer, budget, draws) -> Approximation`. `REGISTRY[label]` imports the file on first use, and
`register` builds the variants. Adding a method is adding a file here and its test file under tests/methods/. See
docs/methods.md for every formula, what k means and the cost.

| method | P̃ | budget k |
| --- | --- | --- |
| svd | the truncated SVD P_k (Eckart–Young floor, an O(n³) oracle) | rank |
| svd-causal | row i of the truncated SVD of the prefix block P[:i+1, :i+1] (the causal oracle, O(n⁴/4)) | rank |
| jl | P Rᵀ R, R seeded N(0, 1/k) or orthogonal (Theorem 1) | projected dimension |
| linformer(s) | softmax(Q (E K)ᵀ s) F with seeded E, F under sharing s (eq. 7) | projected dimension |
| pool-mean, pool-max | keys and values pooled over k windows (the paper's general projections) | windows |
| performer | FAVOR+ positive orthogonal random features | features |
| performer-causal | FAVOR+ with prefix sums over the keys at or before each query | features |
| nystrom, nystrom-iter6 | Nyströmformer with segment-mean landmarks | landmarks |
| skyformer | Nyström of the Gaussian kernel, reweighted into softmax | landmarks |
| probsparse | Informer's top-k queries by sparsity, uniform rows for the rest | active queries |
| linformer-pca(s), linformer-fit(s) | eq. 7 with E, F from the calibration set's principal directions, or fitted | projected dimension |
| window | StreamingLLM: softmax over min(4, k/4) sink tokens and the nearest (most recent) keys | keys per query |
| topk | softmax over each query's k highest-scoring keys (the sparse oracle) | keys per query |
| fastformer-fit(-causal) | — (Fastformer's additive attention, w_q, w_k, W_r fitted per head) | none: one fit for every k |

svd-causal, performer-causal, window, topk and fastformer-fit-causal are causal: on a decoder's layer a query's
output depends on no later position (on a bidirectional layer they use every key the query may see; svd-causal
is then svd, performer-causal performer, fastformer-fit-causal fastformer-fit). Each causal variant lives in its
family's file. jl, linformer, performer(-causal), skyformer and probsparse are random (their draws come from
`Draws`, per sequence unless fixed); linformer-pca, linformer-fit and fastformer-fit(-causal) calibrate.
"""

from .base import (REGISTRY, Approximation, Calibrated, Draws, Layer, Method, register,
                   resolve, substitute)

__all__ = ["REGISTRY", "Approximation", "Calibrated", "Draws", "Layer", "Method",
           "register", "resolve", "substitute"]
