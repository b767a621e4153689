"""A GGUF file as bytes: whether it is whole (its header readable, every tensor inside the file), its sha256, its
quantization type — told in a second or less, before transformers spends minutes dequantizing it.

GGUF (llama.cpp's format) has no checksum: a file cut short by a failed download or copy is found by its own
tensor table (each tensor's offset and size against the file's length); a header broken anywhere is found
by reading it. transformers would instead fail after loading the whole metadata, or read garbage.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
from pathlib import Path

from .errors import SpectraError

#: GGUF metadata value types → struct format, for the scalar ones (gguf's GGUFValueType)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
#: the alignment of the tensor data when the file does not say (GGUF's GGUF_DEFAULT_ALIGNMENT)
ALIGNMENT = 32
#: a tensor of more dimensions is a broken header, not a real one (GGML_MAX_DIMS is 4)
_MAX_DIMS = 8
AGAIN = "download or copy it again"


def _stamp(path: Path) -> tuple[str, int, int]:
    """What identifies a file's content for the memos below without reading it: path, size, modification time."""
    status = path.stat()
    return str(path.resolve()), status.st_size, status.st_mtime_ns


class _Reader:
    """Little-endian reads from the header (a memory map of the file), an error naming the file when it ends early."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def read(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.data):
            raise self.short()
        value = struct.unpack_from("<" + fmt, self.data, self.at)[0]
        self.at += size
        return value

    def string(self) -> bytes:
        length = self.read("Q")
        if self.at + length > len(self.data):
            raise self.short()
        self.at += length
        return self.data[self.at - length:self.at]

    def skip(self, kind: int) -> None:
        if kind == _STRING:
            length = self.read("Q")  # read before adding: the read moves `at`
            self.at += length
        elif kind == _ARRAY:
            inner, count = self.read("I"), self.read("Q")
            if inner in _SCALARS:
                self.at += count * struct.calcsize("<" + _SCALARS[inner])
            elif inner == _STRING:
                unpack, data, end = struct.Struct("<Q").unpack_from, self.data, len(self.data)
                at = self.at
                for _ in range(count):  # the hot loop: a vocabulary's tokens and merges
                    if at + 8 > end:
                        break
                    at += 8 + unpack(data, at)[0]
                self.at = at
            elif inner == _ARRAY:
                for _ in range(count):
                    self.skip(inner)
            else:
                raise self.corrupt(f"a metadata array of unknown type {inner}")
        elif kind in _SCALARS:
            self.at += struct.calcsize("<" + _SCALARS[kind])
        else:
            raise self.corrupt(f"a metadata value of unknown type {kind}")
        if self.at > len(self.data):
            raise self.short()

    def short(self) -> SpectraError:
        return SpectraError(f"GGUF file {self.path} is truncated or corrupt: its header runs past the end of the "
                            f"file; {AGAIN}")

    def corrupt(self, what: str) -> SpectraError:
        return SpectraError(f"GGUF file {self.path} is corrupt: its header holds {what}; {AGAIN}")


_CHECKED: set[tuple[str, int, int]] = set()


def check(path: str | os.PathLike) -> None:
    """Refuse, in one line, a file that is not GGUF, whose header is broken, or that is cut short (its tensor table
    reaches beyond its end). Reads the header only; remembered per file."""
    path = Path(path)
    stamp = _stamp(path)
    if stamp in _CHECKED:
        return
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = stamp[1]
    with open(path, "rb") as handle, (mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else
                                      contextlib.nullcontext(b"")) as data:
        if data[:4] != b"GGUF":
            raise SpectraError(f"{path} is not a GGUF file (it does not start with GGUF's magic bytes); give a "
                               ".gguf file written by llama.cpp's converters")
        table, start = _tensors(_Reader(data, path))
    end = 0
    for name, shape, kind, offset in table:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise SpectraError(f"GGUF file {path} holds tensor {name} of unknown type {kind}: corrupt, or written "
                               "by a newer llama.cpp than the installed gguf package reads "
                               "(pip install -U gguf)") from None
        elements = 1
        for dim in shape:
            elements *= dim
        end = max(end, start + offset + elements // block * block_bytes)
    if end > size:
        raise SpectraError(f"GGUF file {path} is truncated: its tensors end at byte {end:,} but the file holds "
                           f"{size:,} bytes; {AGAIN}")
    _CHECKED.add(stamp)


def _tensors(reader: _Reader) -> tuple[list[tuple[str, list[int], int, int]], int]:
    """The tensor table (name, shape, type, offset) after the metadata, and where the tensor data starts."""
    reader.at = 4
    version = reader.read("I")
    if version not in (2, 3):
        raise reader.corrupt(f"version {version} (spectra reads GGUF versions 2 and 3)")
    tensors, values = reader.read("Q"), reader.read("Q")
    alignment = ALIGNMENT
    for _ in range(values):
        key, kind = bytes(reader.string()), reader.read("I")
        if key == b"general.alignment" and kind == 4:
            alignment = reader.read("I") or ALIGNMENT
        else:
            reader.skip(kind)
    table = []
    for _ in range(tensors):
        name, dims = bytes(reader.string()).decode("utf-8", "replace"), reader.read("I")
        if dims > _MAX_DIMS:
            raise reader.corrupt(f"a tensor of {dims} dimensions")
        shape = [reader.read("Q") for _ in range(dims)]
        table.append((name, shape, *(reader.read("I"), reader.read("Q"))))
    return table, -(-reader.at // alignment) * alignment


_HASHES: dict[tuple[str, int, int], str] = {}


def sha256(path: str | os.PathLike) -> str:
    """The file's sha256 (hex), read in 4 MiB chunks; remembered per file within the process."""
    stamp = _stamp(Path(path))
    if stamp not in _HASHES:
        _HASHES[stamp] = digest(Path(path))
    return _HASHES[stamp]


def digest(path: Path) -> str:
    """The sha256 (hex) of any file, streamed."""
    found = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            found.update(chunk)
    return found.hexdigest()


def gguf_field(path: str | Path, wanted: str) -> object | None:
    """One scalar or string value of a GGUF file's metadata (e.g. general.file_type), read from its header alone.

    Reads the key/value records in order and skips the others without decoding them, so it stays fast on
    files whose metadata holds a whole tokenizer vocabulary. None when the key is absent or the file is not GGUF.
    """
    def read(handle, fmt: str):
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, handle.read(size))[0]

    def skip(handle, kind: int) -> None:
        if kind == _STRING:
            handle.seek(read(handle, "Q"), 1)
        elif kind == _ARRAY:
            inner, count = read(handle, "I"), read(handle, "Q")
            if inner in _SCALARS:
                handle.seek(count * struct.calcsize("<" + _SCALARS[inner]), 1)
            else:
                for _ in range(count):
                    skip(handle, inner)
        else:
            handle.seek(struct.calcsize("<" + _SCALARS[kind]), 1)

    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"GGUF" or read(handle, "I") < 2:
                return None
            read(handle, "Q")  # tensor count
            for _ in range(read(handle, "Q")):
                key = handle.read(read(handle, "Q")).decode("utf-8", "replace")
                kind = read(handle, "I")
                if key == wanted and kind in _SCALARS:
                    return read(handle, _SCALARS[kind])
                if key == wanted and kind == _STRING:
                    return handle.read(read(handle, "Q")).decode("utf-8", "replace")
                skip(handle, kind)
    except (OSError, struct.error, KeyError):
        return None
    return None


def quantization(path: str | os.PathLike) -> str | None:
    """The file's quantization type (general.file_type, e.g. MOSTLY_Q4_1), read from its header."""
    import gguf

    value = gguf_field(path, "general.file_type")
    try:
        return gguf.LlamaFileType(int(value)).name if value is not None else None
    except ValueError:
        return None


def quiet() -> None:
    """transformers draws its own tqdm bar while dequantizing a GGUF file, outside its logging switches."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover
        return
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
