"""The spectrum stage's two library calls per matrix, made so that every core can run one matrix at once.

For the singular values of an attention matrix the exact route needs the float64 Gram matrix (a symmetric
rank-k update, `dsyrk`: half the flops of a general product) and its eigenvalues without eigenvectors
(`dsyevd`, JOBZ = 'N': a tridiagonal reduction and a root-free QR), with the float64 SVD (`dgesdd`, no
vectors) for the few matrices whose error bound asks for it. scipy ships these as C functions with fixed
signatures (`scipy.linalg.cython_blas`, `scipy.linalg.cython_lapack`, public API since scipy 0.16); this
module calls them through ctypes, which releases the GIL for the duration of the call, so threads run
them in parallel. scipy.linalg's Python wrappers hold the GIL instead: two threads calling `eigh` on
512×512 matrices took turns (speed-up 0.96× on 2 cores), and torch's `eigvalsh` (MKL) was 1.6× slower
than scipy's LAPACK on this project's AMD machine (benchmarks/spectrum.py). The library's own threads are limited to one while the
matrices run (`one_blas_thread`), so the cores are not oversubscribed.

Every buffer a call needs lives in a `Workspace` that a thread allocates once and reuses, so the per-matrix
cost is the library's arithmetic plus one exact float32 → float64 copy of the matrix.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator

import numpy as np
import scipy.linalg.cython_blas as _cython_blas
import scipy.linalg.cython_lapack as _cython_lapack

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def _routine(module: object, name: str, arguments: int) -> Callable[..., None]:
    """The C function `name` of a scipy cython module, callable with `arguments` pointers (GIL released)."""
    capsule = module.__pyx_capi__[name]  # type: ignore[attr-defined]
    address = _capsule_pointer(capsule, _capsule_name(capsule))
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * arguments)(address)


# dsyrk(uplo, trans, n, k, alpha, a, lda, beta, c, ldc)
_dsyrk = _routine(_cython_blas, "dsyrk", 10)
# dsyevd(jobz, uplo, n, a, lda, w, work, lwork, iwork, liwork, info)
_dsyevd = _routine(_cython_lapack, "dsyevd", 11)
# dgesdd(jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, iwork, info)
_dgesdd = _routine(_cython_lapack, "dgesdd", 14)

_CHAR = {letter: ctypes.c_char_p(letter) for letter in (b"N", b"T", b"U")}


def _int(value: int) -> ctypes.c_int:
    return ctypes.c_int(value)


def _at(array: np.ndarray) -> int:
    return array.ctypes.data


class LapackError(RuntimeError):
    """A LAPACK routine reported failure (INFO ≠ 0)."""


class Workspace:
    """One thread's buffers for matrices of up to n rows and columns: the float64 copy of a matrix, its Gram
    matrix, the eigenvalues and LAPACK's work arrays, sized once by LAPACK's own workspace queries."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.copy = np.empty(n * n)
        self.gram = np.empty(n * n)
        self.values = np.empty(n)
        self.info = _int(0)
        size, query, iquery = _int(n), np.empty(1), np.empty(1, np.intc)
        _dsyevd(_CHAR[b"N"], _CHAR[b"U"], ctypes.byref(size), _at(self.gram), ctypes.byref(size), _at(self.values),
                _at(query), ctypes.byref(_int(-1)), _at(iquery), ctypes.byref(_int(-1)), ctypes.byref(self.info))
        self._check("dsyevd (workspace query)")
        self.work = np.empty(max(int(query[0]), 2 * n + 1))
        self.iwork = np.empty(max(int(iquery[0]), 1), np.intc)
        self._svd_work: np.ndarray | None = None

    def _check(self, routine: str) -> None:
        if self.info.value != 0:
            raise LapackError(f"{routine} failed with INFO = {self.info.value}")

    def _load(self, block: np.ndarray) -> tuple[int, int]:
        """Copy block (r, m) into `copy` as float64, C order; returns (r, m). In column-major terms (what LAPACK
        reads) the buffer then holds Bᵀ, an m × r matrix with leading dimension m."""
        rows, cols = block.shape
        if rows > self.n or cols > self.n:
            raise ValueError(f"a {rows}×{cols} matrix does not fit a workspace for {self.n}×{self.n}")
        np.copyto(self.copy[: rows * cols].reshape(rows, cols), block)
        return rows, cols

    def gram_eigenvalues(self, block: np.ndarray) -> np.ndarray:
        """Ascending eigenvalues (min(r, m)) of the smaller Gram matrix of block (r, m), BᵀB or BBᵀ (the same
        nonzero eigenvalues), in float64. The result is a view into the workspace, valid until its next use."""
        rows, cols = self._load(block)
        # the buffer is M = Bᵀ (m × r, column-major): BᵀB = M·Mᵀ (trans 'N'), BBᵀ = Mᵀ·M (trans 'T')
        size, depth, trans = (cols, rows, b"N") if cols <= rows else (rows, cols, b"T")
        one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
        n, k, lead = _int(size), _int(depth), _int(cols)
        _dsyrk(_CHAR[b"U"], _CHAR[trans], ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), _at(self.copy),
               ctypes.byref(lead), ctypes.byref(zero), _at(self.gram), ctypes.byref(n))
        _dsyevd(_CHAR[b"N"], _CHAR[b"U"], ctypes.byref(n), _at(self.gram), ctypes.byref(n), _at(self.values),
                _at(self.work), ctypes.byref(_int(self.work.size)), _at(self.iwork),
                ctypes.byref(_int(self.iwork.size)), ctypes.byref(self.info))
        self._check("dsyevd")
        return self.values[:size]

    def singular_values(self, block: np.ndarray) -> np.ndarray:
        """Descending singular values (min(r, m)) of block (r, m) by the float64 SVD (dgesdd, no vectors). The
        result is a view into the workspace, valid until its next use."""
        rows, cols = self._load(block)
        m, n, lead, unused = _int(cols), _int(rows), _int(cols), _int(1)  # the buffer is Bᵀ: same σ
        dummy = np.empty(1)
        if self._svd_work is None:
            query = np.empty(1)
            self.info.value = 0
            size = _int(self.n)
            _dgesdd(_CHAR[b"N"], ctypes.byref(size), ctypes.byref(size), _at(self.copy), ctypes.byref(size),
                    _at(self.values), _at(dummy), ctypes.byref(unused), _at(dummy), ctypes.byref(unused), _at(query),
                    ctypes.byref(_int(-1)), _at(self._svd_iwork()), ctypes.byref(self.info))
            self._check("dgesdd (workspace query)")
            self._svd_work = np.empty(max(int(query[0]), 7 * self.n + 1))
        _dgesdd(_CHAR[b"N"], ctypes.byref(m), ctypes.byref(n), _at(self.copy), ctypes.byref(lead), _at(self.values),
                _at(dummy), ctypes.byref(unused), _at(dummy), ctypes.byref(unused), _at(self._svd_work),
                ctypes.byref(_int(self._svd_work.size)), _at(self._svd_iwork()), ctypes.byref(self.info))
        self._check("dgesdd")
        return self.values[: min(rows, cols)]

    def _svd_iwork(self) -> np.ndarray:
        if self.iwork.size < 8 * self.n:
            self.iwork = np.empty(8 * self.n, np.intc)
        return self.iwork


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit the BLAS libraries loaded in the process (scipy's OpenBLAS, or whatever scipy was built with) to
    one thread each for the block, so threads each running one matrix do not oversubscribe the cores
    (with OpenBLAS's own 2 threads per call, a 512×512 Gram eigenvalue problem ran 8× slower on 2 cores
    that other processes kept busy)."""
    with _controller().limit(limits=1, user_api="blas"):
        yield


_CONTROLLER = None


def _controller():
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER
