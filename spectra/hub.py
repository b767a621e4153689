"""The Hugging Face Hub, asked once and quickly: is it reachable, and if not, use the local cache only.

Without a network, transformers and datasets retry every request for tens of seconds and print a
warning each time before failing. spectra instead tries one connection to the Hub with a short timeout
before the first hub look-up; when it fails (or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set) every
look-up goes to the local cache only, so a cached model or dataset still loads and a missing one fails
at once with one line.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from urllib.parse import urlparse

#: seconds to wait for the Hub to accept a connection
TIMEOUT = 3.0
ADVICE = ("with no network, pass a local directory saved with save_pretrained (see README: offline use), or "
          "download it once with network access and set HF_HUB_OFFLINE=1 to use the cache")


def offline_requested() -> bool:
    return any(os.environ.get(name, "") not in ("", "0", "false", "False")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


@lru_cache(maxsize=1)
def reachable() -> bool:
    """Whether one TCP connection to the Hub's endpoint (HF_ENDPOINT) succeeds within TIMEOUT seconds."""
    if offline_requested():
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=TIMEOUT):
            return True
    except OSError:
        return False


def use_cache_only() -> None:
    """Send every later hub look-up of this process to the local cache (no request, no retry)."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"
    try:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True
    except (ImportError, AttributeError):  # pragma: no cover - an older or newer huggingface_hub
        pass
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True
    except (ImportError, AttributeError):  # pragma: no cover
        pass


def prepare() -> bool:
    """Before a hub look-up: True when the Hub will be asked; otherwise the cache alone will be."""
    if reachable():
        return True
    use_cache_only()
    return False
