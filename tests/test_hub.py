"""The Hub asked once and quickly: an unreachable Hub sends every look-up to the local cache, at once and quietly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from spectra import hub


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connecting is refused at once


def test_offline_variables_are_honoured(monkeypatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert not hub.offline_requested()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert hub.offline_requested()
    hub.reachable.cache_clear()
    assert not hub.reachable()
    hub.reachable.cache_clear()


def test_an_unreachable_endpoint_is_told_within_the_timeout(monkeypatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    hub.reachable.cache_clear()
    start = time.perf_counter()
    assert not hub.reachable()
    assert time.perf_counter() - start < hub.TIMEOUT + 0.5
    hub.reachable.cache_clear()


@pytest.mark.slow  # a fresh interpreter that imports torch and transformers
def test_a_hub_model_with_no_network_fails_fast_in_one_line(tmp_path, text_file) -> None:
    env = {key: value for key, value in os.environ.items() if not key.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf"))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "spectra", "analyze", "no-such-org/no-such-model", "--data",
                           str(text_file), "--samples", "2"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "could not load model 'no-such-org/no-such-model'" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert "Hub was not reachable" in lines[0]
    assert seconds < 30, f"{seconds:.0f} s: retries are back"
    assert list(tmp_path.iterdir()) == [tmp_path / "hf"] or list(tmp_path.iterdir()) == []
