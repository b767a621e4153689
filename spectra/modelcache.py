"""The model cache: a GGUF file dequantized once, kept as a transformers checkpoint (config, tokenizer,
float32 weights in safetensors) so that every later start reads that instead of dequantizing again.

transformers turns a GGUF file into a model by parsing its whole metadata twice and dequantizing every tensor:
30 s for SmolLM2-135M on an idle machine, minutes for Gemma 3 270M's Q4_K_M, at every start. Here the first start
saves the result under the user's cache directory and later ones load it in seconds, bitwise the same weights
(float32: what the dequantization gives; another --dtype is cast from it at load, as it is from the GGUF file).

- Where: $SPECTRA_CACHE, else $XDG_CACHE_HOME/spectra, else ~/.cache/spectra; the entries under `models/`.
- Key: the GGUF file's sha256 and the transformers and gguf versions that dequantized it
  (`models/<sha256>/transformers-X_gguf-Y/`): a renamed or copied file finds its entry, an edited one does not,
  and another transformers rebuilds rather than trusting a conversion it may do otherwise.
- Written whole or not at all: into a temporary folder beside the entry, each file flushed to disk, its manifest
  (every file's size, modification time and sha256) last, then renamed into place.
- Read only when whole: every file's size is checked against the manifest at each start, and a file whose
  modification time changed is hashed again; a damaged entry is said and rebuilt.
- Skipped by --no-model-cache (`using(False)`); a run says where an entry went and how big when it writes one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import checkpoints, gguffile
from .config import RunConfig
from .errors import SpectraError, spell
from .reporter import QUIET, Reporter

#: the environment variable naming the cache's root directory
ENV = "SPECTRA_CACHE"
MANIFEST = "spectra-cache.json"
#: a temporary folder of a build older than this was left by a process that died: removed by the next build
STALE_SECONDS = 24 * 3600
SKIP = spell("--no-model-cache", "model_cache=False")


def root() -> Path:
    """The cache's root: $SPECTRA_CACHE, else $XDG_CACHE_HOME/spectra, else ~/.cache/spectra."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "spectra"


@dataclass(frozen=True)
class Policy:
    """Whether GGUF models go through the cache, and the reporter its one-line notices go to (the run's)."""

    enabled: bool = True
    reporter: Reporter = QUIET


_POLICY: ContextVar[Policy] = ContextVar("spectra_model_cache", default=Policy())


@contextlib.contextmanager
def using(enabled: bool, reporter: Reporter = QUIET) -> Iterator[None]:
    """Within the block, models load through the cache or not (--no-model-cache), its notices said by `reporter`."""
    token = _POLICY.set(Policy(enabled, reporter))
    try:
        yield
    finally:
        _POLICY.reset(token)


def size_text(size: int) -> str:
    """Bytes as a notice says them: 651 MB, 1.07 GB, 375 kB."""
    if size >= 1e9:
        return f"{size / 1e9:.2f} GB"
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


def versions() -> str:
    """The libraries whose code turns a GGUF file into weights, as the entry's folder names them."""
    from importlib.metadata import version

    return f"transformers-{version('transformers')}_gguf-{version('gguf')}"


@dataclass(frozen=True)
class Entry:
    """The cache entry of one GGUF file (which may not exist yet)."""

    gguf: Path
    sha256: str
    reporter: Reporter = QUIET

    @property
    def directory(self) -> Path:
        return root() / "models" / self.sha256 / versions()

    def damage(self) -> str | None:
        """What is wrong with the entry on disk (None: whole). Sizes always; a file's sha256 when its modification
        time is not the one recorded (it was touched since it was written)."""
        try:
            files = json.loads((self.directory / MANIFEST).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"its {MANIFEST} is missing or unreadable"
        for name, recorded in files.items():
            path = self.directory / name
            try:
                status = path.stat()
            except OSError:
                return f"{name} is missing"
            if status.st_size != recorded["bytes"]:
                return f"{name} holds {status.st_size:,} bytes where {recorded['bytes']:,} were written"
            if status.st_mtime_ns != recorded["mtime_ns"] and gguffile.digest(path) != recorded["sha256"]:
                return f"{name} changed since it was written (its sha256 differs)"
        return None

    def ready(self) -> bool:
        """Whether a whole entry is there to load; a damaged one is said, removed, and reported missing."""
        if not self.directory.exists():
            return False
        damage = self.damage()
        if damage is None:
            return True
        self.reporter.notify(f"model cache: the entry of {self.gguf.name} at {self.directory} is damaged ({damage}); "
                    "rebuilding it")
        try:
            shutil.rmtree(self.directory)
        except OSError as error:
            raise SpectraError(f"cannot remove the damaged model cache entry {self.directory} ({error.strerror}); "
                               f"delete it, or pass {SKIP}") from None
        return False

    def require_writable(self) -> None:
        """Refuse in one line, before the long work, a cache that cannot take a new entry."""
        parent = self.directory.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(dir=parent, prefix=".probe-")
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            raise SpectraError(f"the model cache {root()} is not writable ({error.strerror or error}): set {ENV} to "
                               f"a writable directory, or pass {SKIP} to dequantize {self.gguf.name} at every "
                               "start") from None

    def write(self, save: Callable[[Path], None]) -> None:
        """Build the entry: `save(folder)` writes the checkpoint into a temporary folder, which becomes the entry
        once every file is on disk and listed in the manifest. A build that fails leaves nothing behind (and the
        run goes on without the cache, warned); a concurrent build of the same entry that finished first wins. Of a
        distributed run's processes the first writes; the others load the GGUF file."""
        from .distributed import rank

        if rank() != 0:
            return
        self.require_writable()
        parent = self.directory.parent
        for stale in parent.glob(".build-*"):
            with contextlib.suppress(OSError):  # another process may be removing it too
                if time.time() - stale.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(stale, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(dir=parent, prefix=".build-"))
        try:
            save(folder)
            files = {}
            for path in sorted(folder.iterdir()):
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                status = path.stat()
                files[path.name] = {"bytes": status.st_size, "mtime_ns": status.st_mtime_ns,
                                    "sha256": gguffile.digest(path)}
            manifest = {"gguf": {"name": self.gguf.name, "bytes": self.gguf.stat().st_size, "sha256": self.sha256},
                        "files": files}
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
            try:
                folder.rename(self.directory)
            except OSError:
                if not self.ready():  # another process's build got there first; otherwise this one failed
                    raise
                return
        except (OSError, NotCacheable) as error:
            self.reporter.warn(f"could not write the model cache entry of {self.gguf.name} "
                               f"({getattr(error, 'strerror', None) or error}); this run loads it from the GGUF file")
            return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        size = sum(entry["bytes"] for entry in files.values())
        self.reporter.notify(f"model cache: wrote {self.gguf.name} dequantized to {self.directory} "
                             f"({size_text(size)}); later starts load it from there")


class NotCacheable(Exception):
    """transformers kept some weights quantized (its GGUF kernels): the cache holds dequantized weights only."""


def save(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write a causal LM dequantized from a GGUF file as a transformers checkpoint into `folder`: its float weights in
    model.safetensors (a tied tensor once, under its first name, as save_pretrained writes it), its config without
    the GGUF quantization marker (the weights are plain), its generation config and its tokenizer."""
    import copy

    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            raise NotCacheable(f"transformers kept {name} quantized ({tensor.dtype})")
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    vars(config).pop("quantization_config", None)  # the GGUF's quantization: the entry holds float32 weights
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def entry(gguf: str | os.PathLike) -> Entry | None:
    """The cache entry of a GGUF file (checked whole first), or None under --no-model-cache."""
    policy = _POLICY.get()
    if not policy.enabled:
        return None
    path = Path(gguf)
    gguffile.check(path)
    return Entry(path, gguffile.sha256(path), policy.reporter)


def prepare(config: RunConfig) -> None:
    """Before a run reads anything: a GGUF model's file is whole, and its cache entry is there or can be written.
    Other sources pass, and so do sources the run refuses in its own words."""
    if config.model is None:
        return
    try:
        found = checkpoints.inspect(config.model, config.gguf_file)
    except SpectraError:
        return
    if found.gguf_file is None:
        return
    gguffile.check(found.where)
    cached = entry(found.where)
    if cached is not None and not cached.ready():
        cached.require_writable()
