"""The Hub asked once and quickly: an unreachable Hub sends every look-up to the local cache, at once and quietly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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


def test_an_unreachable_endpoint_is_asked_once_within_the_timeout(monkeypatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    asked: list[tuple[tuple[str, int], float]] = []
    connect = socket.create_connection

    def recorded(address, timeout):
        asked.append((address, timeout))
        return connect(address, timeout=timeout)

    monkeypatch.setattr(hub.socket, "create_connection", recorded)
    hub.reachable.cache_clear()
    assert not hub.reachable() and not hub.reachable()
    assert len(asked) == 1 and asked[0][1] == hub.TIMEOUT  # one connection, bounded by the timeout, then cached
    hub.reachable.cache_clear()


@pytest.mark.slow  # a fresh interpreter that imports torch and transformers
def test_a_hub_model_with_no_network_fails_fast_in_one_line(tmp_path, text_file) -> None:
    env = {key: value for key, value in os.environ.items() if not key.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-m", "spectra", "analyze", "no-such-org/no-such-model", "--data",
                           str(text_file), "--samples", "2"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "could not load model 'no-such-org/no-such-model'" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    # the reachability check answered, so every look-up went to the cache: no request was sent, none retried
    # (how long that takes is a property of the machine's load, not asserted here)
    assert "Hub was not reachable" in lines[0]
    assert list(tmp_path.iterdir()) == [tmp_path / "hf"] or list(tmp_path.iterdir()) == []
