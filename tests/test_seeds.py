"""Where randomness enters: derived seeds, JL matrices (seeds, scale, slicing) and orthogonal matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.seeds import Domain, derive_seed, jl_matrix, orthogonal_matrix


def test_derive_seed_is_fixed_by_its_parts_and_63_bit() -> None:
    seed = derive_seed(0, Domain.THEOREM1, 3, 64)
    assert seed == derive_seed(0, Domain.THEOREM1, 3, 64)
    assert 0 <= seed < 2**63
    others = {
        derive_seed(1, Domain.THEOREM1, 3, 64),  # another run seed
        derive_seed(0, Domain.THEOREM2, 3, 64),  # another domain
        derive_seed(0, Domain.THEOREM1, 4, 64),  # another layer
        derive_seed(0, Domain.THEOREM1, 64, 3),  # the parts' order matters
        derive_seed(0, Domain.THEOREM1, 3),
    }
    assert seed not in others and len(others) == 5
    assert len({int(domain) for domain in Domain}) == len(Domain)  # no two domains share a stream
    # what the seed is made of: numpy's SeedSequence of (seed, *parts), its first 64-bit word shifted to 63
    want = int(np.random.SeedSequence([0, 201, 3, 64]).generate_state(1, dtype=np.uint64)[0]) >> 1
    assert seed == want


def test_jl_matrix_seeds_scale_and_slicing() -> None:
    r = jl_matrix(64, 300, seed=3)
    assert r.shape == (64, 300) and r.dtype == torch.float32
    assert torch.equal(r, jl_matrix(64, 300, seed=3))
    assert not torch.equal(r, jl_matrix(64, 300, seed=4))
    assert torch.equal(r[:, :123], jl_matrix(64, 123, seed=3))  # slicing rule is free
    assert abs(r.var().item() - 1 / 64) < 0.001
    assert jl_matrix(4, 8, seed=3, dtype=torch.float64).dtype == torch.float64


def test_orthogonal_matrix_rows_are_orthonormal_and_scaled() -> None:
    q = orthogonal_matrix(40, 40, seed=1)
    assert torch.allclose(q.T @ q, torch.eye(40), atol=1e-5)
    wide = orthogonal_matrix(10, 40, seed=1)
    assert torch.allclose(wide @ wide.T, 4 * torch.eye(10), atol=1e-5)  # rows orthonormal · √(n/k)
    assert torch.equal(wide, orthogonal_matrix(10, 40, seed=1))
    assert not torch.equal(wide, orthogonal_matrix(10, 40, seed=2))


@pytest.mark.parametrize("make, message", [
    (lambda: orthogonal_matrix(10, 8), "exceeds"),
    (lambda: jl_matrix(0, 8), "positive integer"),
    (lambda: jl_matrix(4, 0), "n must be ≥ 1"),
    (lambda: derive_seed(-1, 3), "non-negative"),
    (lambda: derive_seed(0, Domain.THEOREM1, -2), "non-negative"),
])
def test_bad_input_is_one_line(make, message) -> None:
    with pytest.raises(SpectraError, match=message) as error:
        make()
    assert "\n" not in str(error.value)
