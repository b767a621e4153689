"""Training-free approximations of a pretrained model's attention at a budget k: one file per family.

Each file registers plain functions `(Layer, budget) -> Approximation` with their label, plot style and
terminal header (`base.register`). Adding a method is adding a file here (and importing it below) with
its test file under tests/methods/. See docs/methods.md for every formula, what k means and the cost.

| method | P̃ | budget k |
| --- | --- | --- |
| svd | the truncated SVD P_k (Eckart–Young floor, an O(n³) oracle) | rank |
| jl | P Rᵀ R, R seeded N(0, 1/k) or orthogonal (Theorem 1) | projected dimension |
| linformer(s) | softmax(Q (E K)ᵀ s) F with seeded E, F under sharing s (eq. 7) | projected dimension |
| pool-mean, pool-max | keys and values pooled over k windows (the paper's general projections) | windows |
| performer | FAVOR+ positive orthogonal random features | features |
| nystrom, nystrom-iter6 | Nyströmformer with segment-mean landmarks | landmarks |
| skyformer | Nyström of the Gaussian kernel, reweighted into softmax | landmarks |
| probsparse | Informer's top-k queries by sparsity, uniform rows for the rest | active queries |
"""

# imported in the order methods are listed (registration order is the order of tables and legends)
from . import svd  # noqa: F401, I001
from . import jl  # noqa: F401
from . import linformer  # noqa: F401
from . import pooling  # noqa: F401
from . import performer  # noqa: F401
from . import nystrom  # noqa: F401
from . import skyformer  # noqa: F401
from . import probsparse  # noqa: F401
from .base import REGISTRY, Approximation, Entry, Layer, Method, expand, register, substitute

__all__ = ["REGISTRY", "Approximation", "Entry", "Layer", "Method", "expand", "register", "substitute"]
