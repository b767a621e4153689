"""A GGUF file told whole or broken from its header alone, its sha256 and its quantization type."""

from __future__ import annotations

import hashlib
import os
import struct

import pytest

from spectra import gguffile
from spectra.errors import SpectraError


def test_a_whole_file_passes(tiny_gguf) -> None:
    gguffile.check(tiny_gguf)
    assert gguffile.quantization(tiny_gguf) == "MOSTLY_Q4_1"


@pytest.mark.parametrize("keep", [-1, 0.5, 0.04, 10])
def test_a_file_cut_short_is_refused(tiny_gguf, tmp_path, keep) -> None:
    """Cut inside the tensor data (by one byte, or by half) or inside the header: one line, never a pass."""
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) + keep] if keep == -1 else data[:int(keep * len(data)) if keep < 1 else keep])
    with pytest.raises(SpectraError, match=r"GGUF file .*cut\.gguf is truncated.*download or copy it again"):
        gguffile.check(cut)


def test_the_cut_is_told_in_bytes(tiny_gguf, tmp_path) -> None:
    """The tensors' end is the file's own length: one byte less is named with both numbers."""
    data = tiny_gguf.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-1])
    with pytest.raises(SpectraError, match=f"end at byte {len(data):,} but the file holds {len(data) - 1:,} bytes"):
        gguffile.check(tmp_path / "cut.gguf")


def test_not_gguf_and_broken_headers_are_refused(tiny_gguf, tmp_path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(SpectraError, match="is not a GGUF file"):
        gguffile.check(other)
    data = bytearray(tiny_gguf.read_bytes())
    broken = tmp_path / "broken.gguf"
    struct.pack_into("<I", data, 4, 7)  # the version
    broken.write_bytes(bytes(data))
    with pytest.raises(SpectraError, match="is corrupt: its header holds version 7"):
        gguffile.check(broken)
    data = bytearray(tiny_gguf.read_bytes())
    data[24:32] = b"\xff" * 8  # the first key's length: far beyond the file
    broken.write_bytes(bytes(data))
    with pytest.raises(SpectraError, match="is truncated or corrupt: its header runs past the end of the file"):
        gguffile.check(broken)


def test_an_unknown_tensor_type_is_refused(tiny_gguf, tmp_path) -> None:
    """The last tensor's type (the 4 bytes before its 8-byte offset at the end of the tensor table) set to 250."""
    import gguf

    reader = gguf.GGUFReader(tiny_gguf)
    last = reader.tensors[-1]
    data = bytearray(tiny_gguf.read_bytes())
    table_end = last.field.offset + sum(part.nbytes for part in last.field.parts)
    struct.pack_into("<I", data, table_end - 12, 250)
    broken = tmp_path / "unknown.gguf"
    broken.write_bytes(bytes(data))
    with pytest.raises(SpectraError, match=f"holds tensor {last.name} of unknown type 250"):
        gguffile.check(broken)


def test_sha256_is_the_files_and_follows_its_changes(tmp_path) -> None:
    path = tmp_path / "file.bin"
    path.write_bytes(os.urandom(5 << 20))  # more than one 4 MiB chunk
    assert gguffile.sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(b"other")
    assert gguffile.sha256(path) == hashlib.sha256(b"other").hexdigest()
