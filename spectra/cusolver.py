"""Eigenvalues of many symmetric matrices in one call on a CUDA GPU: cuSOLVER's `cusolverDnXsyevBatched` via ctypes.

PyTorch's `eigvalsh` batches matrices only up to 32 × 32 on CUDA and loops one matrix at a time above that;
cuSOLVER (CUDA ≥ 12.6 update 2) has a batched dense symmetric eigensolver for any n. This module binds it from the
libcusolver PyTorch's CUDA wheels ship (site-packages/nvidia/cu*/lib, nvidia/cusolver/lib) or the system's, with
eigenvalues only (jobz = CUSOLVER_EIG_MODE_NOVECTOR), in float32 or float64, on torch's current CUDA stream, the
device workspace allocated through torch (`cusolverDnXsyevBatched_bufferSize`), and the per-matrix info array
checked. The C signatures (cuSOLVER's documentation, "cusolverDnXsyevBatched"):

    cusolverStatus_t cusolverDnXsyevBatched_bufferSize(cusolverDnHandle_t handle, cusolverDnParams_t params,
        cusolverEigMode_t jobz, cublasFillMode_t uplo, int64_t n, cudaDataType dataTypeA, const void *A,
        int64_t lda, cudaDataType dataTypeW, const void *W, cudaDataType computeType,
        size_t *workspaceInBytesOnDevice, size_t *workspaceInBytesOnHost, int64_t batchSize);
    cusolverStatus_t cusolverDnXsyevBatched(cusolverDnHandle_t handle, cusolverDnParams_t params,
        cusolverEigMode_t jobz, cublasFillMode_t uplo, int64_t n, cudaDataType dataTypeA, void *A, int64_t lda,
        cudaDataType dataTypeW, void *W, cudaDataType computeType, void *bufferOnDevice,
        size_t workspaceInBytesOnDevice, void *bufferOnHost, size_t workspaceInBytesOnHost, int *info,
        int64_t batchSize);

The matrices are column-major, packed (A_k(i, j) = A[i + lda·j + lda·n·k]), and limited to n·lda·batchSize ≤ 2³¹ − 1
(`LIMIT`: at most 8,191 matrices of 512 × 512 per call; `spectra.batched` plans the chunks). A contiguous torch
tensor of symmetric matrices is its own column-major transpose, so it is passed as it is; only the lower triangle
(column-major) is read. Every way this can be missing on a machine — no CUDA device, no libcusolver, one too old to
have the symbol — is one `SpectraError` line (`require`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .errors import SpectraError, spell

#: the function this module binds (CUDA ≥ 12.6 update 2)
SYMBOL = "cusolverDnXsyevBatched"
#: cuSOLVER's bound on n · lda · batchSize per call
LIMIT = 2**31 - 1
#: the sonames tried after the wheels' files: CUDA 13's cuSOLVER is major 12, CUDA 12's is major 11
SONAMES = ("libcusolver.so.12", "libcusolver.so.11", "libcusolver.so")
#: cudaDataType_t of the two precisions
DATA_TYPE = {torch.float32: 0, torch.float64: 1}  # CUDA_R_32F, CUDA_R_64F
NOVECTOR, LOWER = 0, 0  # CUSOLVER_EIG_MODE_NOVECTOR, CUBLAS_FILL_MODE_LOWER
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE", 4: "ARCH_MISMATCH",
          5: "MAPPING_ERROR", 6: "EXECUTION_FAILED", 7: "INTERNAL_ERROR", 8: "MATRIX_TYPE_NOT_SUPPORTED",
          9: "NOT_SUPPORTED"}
_CPU = spell("--spectrum-device cpu", 'spectrum_device="cpu"')
_FIX = f"use {_CPU} or same (torch's own solver on the model's GPU)"


class SolverError(RuntimeError):
    """cuSOLVER returned a failure status, or a matrix's info says it did not converge."""


def candidates() -> list[str]:
    """The libcusolver files to try, in order: those of the NVIDIA wheels beside torch (every sys.path entry's
    nvidia/cu*/lib and nvidia/cusolver/lib, newest name first), then the sonames the system's loader finds."""
    found: list[str] = []
    for entry in dict.fromkeys(sys.path):
        if not entry or not os.path.isdir(os.path.join(entry, "nvidia")):
            continue
        for pattern in ("nvidia/cu[0-9]*/lib/libcusolver.so*", "nvidia/cusolver/lib/libcusolver.so*"):
            found += sorted(glob.glob(os.path.join(entry, pattern)), reverse=True)
    return [*dict.fromkeys(found), *SONAMES]


def _signatures(lib: ctypes.CDLL) -> None:
    """Declare the argument and result types of the functions used (enums are C ints)."""
    void_p, i64, c_int, size_t = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    for name, arguments in {
        "cusolverDnCreate": [ctypes.POINTER(void_p)],
        "cusolverDnSetStream": [void_p, void_p],
        "cusolverDnCreateParams": [ctypes.POINTER(void_p)],
        f"{SYMBOL}_bufferSize": [void_p, void_p, c_int, c_int, i64, c_int, void_p, i64, c_int, void_p, c_int,
                                 ctypes.POINTER(size_t), ctypes.POINTER(size_t), i64],
        SYMBOL: [void_p, void_p, c_int, c_int, i64, c_int, void_p, i64, c_int, void_p, c_int, void_p, size_t,
                 void_p, size_t, void_p, i64],
    }.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = arguments, c_int


def _version(lib: ctypes.CDLL) -> str:
    """cuSOLVER's version as major.minor.patch, or "unknown"."""
    value = ctypes.c_int(0)
    try:
        if lib.cusolverGetVersion(ctypes.byref(value)) == 0:
            return f"{value.value // 1000}.{value.value % 1000 // 100}.{value.value % 100}"  # CUSOLVER_VERSION
    except AttributeError:
        pass
    return "unknown"


def load(paths: Sequence[str] | None = None) -> Library:
    """The first of `paths` (default `candidates()`) that loads and has the symbol; a SpectraError saying what
    is missing when none does (no library at all, or only ones too old)."""
    tried, old = [], []
    for path in candidates() if paths is None else paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            tried.append(path)
            continue
        try:
            getattr(lib, SYMBOL)  # dlsym: absent from cuSOLVER before CUDA 12.6 update 2
        except AttributeError:
            old.append(f"{path} (cuSOLVER {_version(lib)})")
            continue
        _signatures(lib)
        return Library(lib, path, _version(lib))
    if old:
        raise SpectraError(f"the batched GPU eigensolver needs {SYMBOL} (CUDA ≥ 12.6 update 2), which "
                           f"{', '.join(old)} lacks; install a newer PyTorch CUDA wheel or CUDA toolkit, or {_FIX}")
    raise SpectraError(f"the batched GPU eigensolver needs libcusolver, found nowhere (tried {', '.join(tried)}); "
                       f"install PyTorch's CUDA wheels (they ship nvidia-cusolver), or {_FIX}")


_LOADED: Library | None = None
_LOCK = threading.Lock()


def require(device: torch.device | str | None = None) -> Library:
    """The loaded library, checked to have a CUDA device to run on (and `device`, when given, to be one):
    the one place every missing piece becomes one SpectraError line. Loaded once per process."""
    global _LOADED
    if not torch.cuda.is_available():
        raise SpectraError(f"the batched GPU eigensolver needs a CUDA device, and torch sees none (torch "
                           f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); {_FIX}")
    if device is not None and torch.device(device).type != "cuda":
        raise SpectraError(f"the batched GPU eigensolver runs on the model's CUDA device, and the model is on "
                           f"{torch.device(device)}; use {spell('--device cuda')} or {_FIX}")
    with _LOCK:
        if _LOADED is None:
            _LOADED = load()
        return _LOADED


def available(device: torch.device | str | None = None) -> SpectraError | None:
    """None when `require(device)` succeeds, else the one-line error saying why not (for auto's choice)."""
    try:
        require(device)
    except SpectraError as error:
        return error
    return None


def per_call(n: int) -> int:
    """The most n × n matrices one call may take (n · n · batch ≤ LIMIT); 0 when one matrix is already over."""
    return LIMIT // (n * n)


@dataclass
class Library:
    """A loaded libcusolver with the batched eigensolver: one handle per (thread, device), set to torch's current
    stream at every call."""

    lib: ctypes.CDLL
    path: str
    version: str

    def __post_init__(self) -> None:
        self._local = threading.local()

    def _call(self, name: str, *arguments: object) -> None:
        status = getattr(self.lib, name)(*arguments)
        if status != 0:
            raise SolverError(f"{name} failed: CUSOLVER_STATUS_{STATUS.get(status, status)}")

    def _handle(self, device: torch.device) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        handles = self._local.__dict__.setdefault("handles", {})
        if device.index not in handles:
            handle, params = ctypes.c_void_p(), ctypes.c_void_p()
            with torch.cuda.device(device):
                self._call("cusolverDnCreate", ctypes.byref(handle))
                self._call("cusolverDnCreateParams", ctypes.byref(params))
            handles[device.index] = handle, params
        return handles[device.index]

    def call(self, handle: ctypes.c_void_p, params: ctypes.c_void_p, kind: int, n: int, batch: int, a: int, w: int,
             info: int, stream: int, allocate: Callable[[int], int]) -> None:
        """The raw calls on device pointers: set the stream, size the workspace, allocate it (`allocate(bytes)` →
        a device pointer) and enqueue the eigensolve of `batch` n × n matrices at a into w, info."""
        self._call("cusolverDnSetStream", handle, ctypes.c_void_p(stream))
        device_bytes, host_bytes = ctypes.c_size_t(0), ctypes.c_size_t(0)
        shape = (NOVECTOR, LOWER, n, kind, ctypes.c_void_p(a), n, kind, ctypes.c_void_p(w), kind)
        self._call(f"{SYMBOL}_bufferSize", handle, params, *shape, ctypes.byref(device_bytes),
                   ctypes.byref(host_bytes), batch)
        on_device = ctypes.c_void_p(allocate(device_bytes.value))
        on_host = ctypes.create_string_buffer(max(host_bytes.value, 1))
        self._call(SYMBOL, handle, params, *shape, on_device, device_bytes.value, ctypes.cast(on_host, ctypes.c_void_p),
                   host_bytes.value, ctypes.c_void_p(info), batch)
        self._local.host = on_host  # the host workspace outlives the (asynchronous) call until the next one

    def eigenvalues(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ascending eigenvalues (b, n) of the symmetric matrices a (b, n, n), float32 or float64 on a CUDA
        device, and the info array (b,) int32 (0: converged), enqueued on torch's current stream; no host
        synchronisation. a is overwritten (pass a copy to keep it)."""
        if a.dtype not in DATA_TYPE or a.device.type != "cuda" or a.dim() != 3 or a.shape[-1] != a.shape[-2]:
            raise ValueError(f"expected square float32/float64 CUDA matrices (b, n, n), got {a.dtype} "
                             f"{tuple(a.shape)} on {a.device}")
        batch, n = a.shape[0], a.shape[-1]
        if n * n * batch > LIMIT:
            raise ValueError(f"{batch} matrices of {n} × {n} exceed cuSOLVER's n·lda·batch ≤ 2³¹ − 1 per call: "
                             f"at most {per_call(n)} per call")
        a = a.contiguous()
        w = torch.empty(batch, n, dtype=a.dtype, device=a.device)
        info = torch.zeros(batch, dtype=torch.int32, device=a.device)
        if batch == 0:
            return w, info
        handle, params = self._handle(a.device)
        workspace: list[torch.Tensor] = []

        def allocate(size: int) -> int:  # stream-ordered: freed after the call is enqueued, reused only after it
            workspace.append(torch.empty(max(size, 1), dtype=torch.uint8, device=a.device))
            return workspace[-1].data_ptr()

        self.call(handle, params, DATA_TYPE[a.dtype], n, batch, a.data_ptr(), w.data_ptr(), info.data_ptr(),
                  torch.cuda.current_stream(a.device).cuda_stream, allocate)
        return w, info


def check(info: torch.Tensor) -> None:
    """Raise SolverError if any matrix's info is not 0 (reads info back: a host synchronisation)."""
    bad = torch.nonzero(info).flatten().tolist()
    if bad:
        value = int(info[bad[0]])
        what = f"parameter {-value} was invalid" if value < 0 else f"did not converge (info = {value})"
        raise SolverError(f"{SYMBOL}: {len(bad)} of {info.numel()} matrices failed; the first, matrix {bad[0]}: {what}")
