"""The cuSOLVER binding: where it looks for the library, every way it can be missing as one line, the arguments
it passes (through a fake libcusolver compiled here, which records them), and on a GPU its eigenvalues against
torch's."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from spectra import cusolver
from spectra.batched import FLOAT32_ERROR, UNIT
from spectra.errors import SpectraError
from spectra.spectrum import GRAM_ERROR

#: a stand-in libcusolver: records the arguments of every call, returns workspace sizes and a status
FAKE = r"""
#include <stdint.h>
#include <stddef.h>
int64_t seen_n, seen_lda, seen_batch, seen_batch_size_query, seen_device_bytes, seen_host_bytes;
int seen_jobz, seen_uplo, seen_type_a, seen_type_w, seen_compute;
void *seen_a, *seen_w, *seen_info, *seen_stream, *seen_device_buffer, *seen_host_buffer, *seen_handle, *seen_params;
int status = 0;
int cusolverGetVersion(int *version) { *version = VERSION; return 0; }
int cusolverDnCreate(void **handle) { *handle = (void *)0xABC; return 0; }
int cusolverDnCreateParams(void **params) { *params = (void *)0xDEF; return 0; }
int cusolverDnSetStream(void *handle, void *stream) { seen_stream = stream; return 0; }
#ifdef BATCHED
int cusolverDnXsyevBatched_bufferSize(void *handle, void *params, int jobz, int uplo, int64_t n, int type_a,
        const void *a, int64_t lda, int type_w, const void *w, int compute, size_t *device_bytes,
        size_t *host_bytes, int64_t batch) {
    seen_batch_size_query = batch; *device_bytes = 4096; *host_bytes = 64; return 0;
}
int cusolverDnXsyevBatched(void *handle, void *params, int jobz, int uplo, int64_t n, int type_a, void *a,
        int64_t lda, int type_w, void *w, int compute, void *device_buffer, size_t device_bytes,
        void *host_buffer, size_t host_bytes, int *info, int64_t batch) {
    seen_handle = handle; seen_params = params; seen_jobz = jobz; seen_uplo = uplo; seen_n = n; seen_type_a = type_a;
    seen_a = a; seen_lda = lda; seen_type_w = type_w; seen_w = w; seen_compute = compute;
    seen_device_buffer = device_buffer; seen_device_bytes = device_bytes; seen_host_buffer = host_buffer;
    seen_host_bytes = host_bytes; seen_info = info; seen_batch = batch; return status;
}
#endif
"""


def _compile(tmp_path: Path, name: str, *defines: str) -> str:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the fake libcusolver")
    source = tmp_path / "fake.c"
    source.write_text(FAKE)
    target = tmp_path / name
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(target), str(source), *defines], check=True)
    return str(target)


@pytest.fixture
def no_library(monkeypatch):
    """A process that has loaded no libcusolver yet."""
    monkeypatch.setattr(cusolver, "_LOADED", None)


def test_candidates_are_the_wheels_files_then_the_sonames(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site-packages"
    for relative in ("nvidia/cu13/lib/libcusolver.so.12", "nvidia/cusolver/lib/libcusolver.so.11",
                     "nvidia/cublas/lib/libcublas.so.12"):
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(b"")
    monkeypatch.setattr("sys.path", [str(tmp_path / "nowhere"), str(site), str(site)])
    assert cusolver.candidates() == [str(site / "nvidia/cu13/lib/libcusolver.so.12"),
                                     str(site / "nvidia/cusolver/lib/libcusolver.so.11"), *cusolver.SONAMES]


def test_no_library_is_one_line_naming_what_to_do(tmp_path) -> None:
    with pytest.raises(SpectraError) as caught:
        cusolver.load([str(tmp_path / "libcusolver.so.11"), "libcusolver-nonexistent.so.0"])
    message = str(caught.value)
    assert "needs libcusolver, found nowhere" in message and "libcusolver-nonexistent.so.0" in message
    assert "\n" not in message and 'spectrum_device="cpu"' in message
    assert "--spectrum-device cpu" in caught.value.for_cli()


def test_a_library_without_the_batched_solver_is_too_old(tmp_path) -> None:
    old = _compile(tmp_path, "libcusolver.so.11", "-DVERSION=11603")
    with pytest.raises(SpectraError, match=r"needs cusolverDnXsyevBatched \(CUDA ≥ 12.6 update 2\), which .*"
                                           r"libcusolver.so.11 \(cuSOLVER 11.6.3\) lacks"):
        cusolver.load([old])


def test_the_first_library_with_the_symbol_is_taken(tmp_path) -> None:
    old = _compile(tmp_path, "libold.so", "-DVERSION=11603")
    new = _compile(tmp_path, "libnew.so", "-DVERSION=11701", "-DBATCHED")
    library = cusolver.load([str(tmp_path / "missing.so"), old, new])
    assert (library.path, library.version) == (new, "11.7.1")


def test_the_call_passes_cusolvers_arguments_in_order(tmp_path) -> None:
    """Through the fake library: jobz NOVECTOR, lower, n and lda as int64, the data type thrice, the workspace that
    bufferSize asked for, the info array and the batch, on the stream given."""
    library = cusolver.load([_compile(tmp_path, "libfake.so", "-DVERSION=11701", "-DBATCHED")])
    fake = library.lib
    allocated: list[int] = []

    def allocate(size: int) -> int:
        allocated.append(size)
        return 0x5000

    handle, params = ctypes.c_void_p(0xABC), ctypes.c_void_p(0xDEF)
    library.call(handle, params, cusolver.DATA_TYPE[torch.float64], 512, 8191, 0x1000, 0x2000, 0x3000, 0x4000,
                 allocate)
    seen = {name: getattr(ctypes.c_int64, "in_dll")(fake, f"seen_{name}").value
            for name in ("n", "lda", "batch", "batch_size_query", "device_bytes", "host_bytes")}
    assert seen == {"n": 512, "lda": 512, "batch": 8191, "batch_size_query": 8191, "device_bytes": 4096,
                    "host_bytes": 64}
    ints = {name: ctypes.c_int.in_dll(fake, f"seen_{name}").value
            for name in ("jobz", "uplo", "type_a", "type_w", "compute")}
    assert ints == {"jobz": 0, "uplo": 0, "type_a": 1, "type_w": 1, "compute": 1}
    pointers = {name: ctypes.c_void_p.in_dll(fake, f"seen_{name}").value
                for name in ("a", "w", "info", "stream", "device_buffer", "handle", "params")}
    assert pointers == {"a": 0x1000, "w": 0x2000, "info": 0x3000, "stream": 0x4000, "device_buffer": 0x5000,
                        "handle": 0xABC, "params": 0xDEF}
    assert allocated == [4096] and ctypes.c_void_p.in_dll(fake, "seen_host_buffer").value


def test_a_failing_status_is_named(tmp_path) -> None:
    library = cusolver.load([_compile(tmp_path, "libfake.so", "-DVERSION=11701", "-DBATCHED")])
    ctypes.c_int.in_dll(library.lib, "status").value = 3
    with pytest.raises(cusolver.SolverError, match="cusolverDnXsyevBatched failed: CUSOLVER_STATUS_INVALID_VALUE"):
        library.call(ctypes.c_void_p(1), ctypes.c_void_p(2), 0, 4, 1, 1, 2, 3, 4, lambda size: 8)


def test_without_a_cuda_device_require_says_so(monkeypatch, no_library) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpectraError, match="needs a CUDA device, and torch sees none") as caught:
        cusolver.require()
    assert "\n" not in str(caught.value)
    assert isinstance(cusolver.available(), SpectraError)


def test_a_model_off_the_gpu_is_refused(monkeypatch, no_library) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SpectraError, match="runs on the model's CUDA device, and the model is on cpu"):
        cusolver.require("cpu")


def test_with_a_device_but_no_library_require_names_the_library(tmp_path, monkeypatch, no_library) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cusolver, "candidates", lambda: [str(tmp_path / "libcusolver.so.11")])
    with pytest.raises(SpectraError, match="needs libcusolver, found nowhere"):
        cusolver.require()
    assert cusolver._LOADED is None  # nothing half-loaded: the next call looks again


def test_the_limit_per_call() -> None:
    assert cusolver.per_call(512) == 8191 and 512 * 512 * 8191 <= 2**31 - 1 < 512 * 512 * 8192
    assert cusolver.per_call(46341) == 0


def test_info_names_the_first_failed_matrix() -> None:
    cusolver.check(torch.zeros(5, dtype=torch.int32))
    with pytest.raises(cusolver.SolverError, match=r"2 of 4 matrices failed; the first, matrix 1: did not converge "
                                                   r"\(info = 7\)"):
        cusolver.check(torch.tensor([0, 7, 0, 2], dtype=torch.int32))
    with pytest.raises(cusolver.SolverError, match="parameter 5 was invalid"):
        cusolver.check(torch.tensor([-5], dtype=torch.int32))


def test_eigenvalues_refuse_what_cusolver_cannot_take() -> None:
    library = cusolver.Library(ctypes.CDLL(None), "none", "none")
    with pytest.raises(ValueError, match="expected square float32/float64 CUDA matrices"):
        library.eigenvalues(torch.eye(4)[None])


def _gram(batch: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gram matrices P Pᵀ of softmax P at temperatures 0.5…6 (float64 product), in `dtype`, on the GPU."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 6, batch, dtype=torch.float64)[:, None, None]
    p = torch.softmax(scale * torch.randn(batch, n, n, generator=generator, dtype=torch.float64), -1)
    return (p @ p.mT).to(dtype).cuda()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [128, 256, 512])
def test_on_cuda_the_batched_eigenvalues_are_within_the_routes_factor(n: int, dtype: torch.dtype) -> None:
    """Against the float64 reference: within the factor the route's bound assumes (GRAM_ERROR in float64,
    FLOAT32_ERROR in float32) times u·λ₁. torch's own eigvalsh on the GPU is printed beside it, not held to the
    factor: in float32 it measured 678–3662·u·λ₁ on an H200 (n = 128…512), cuSOLVER's batched 8–15."""
    gram = _gram(12, n, dtype, seed=n)
    reference = torch.linalg.eigvalsh(gram.double())
    w, info = cusolver.require().eigenvalues(gram.clone())
    cusolver.check(info)
    torch_w = torch.linalg.eigvalsh(gram)
    factor = {torch.float32: FLOAT32_ERROR, torch.float64: GRAM_ERROR}[dtype]
    scale = UNIT[dtype] * reference[:, -1:]
    measured = ((w.double() - reference).abs() / scale).max().item()
    torchs = ((torch_w.double() - reference).abs() / scale).max().item()
    print(f"n = {n} {dtype}: max |Δλ| = {measured:.2f}·u·λ₁ (torch's: {torchs:.2f})")
    assert measured <= factor
