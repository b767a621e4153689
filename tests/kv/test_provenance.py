"""run.json's `artifacts`: per press reading a path, the sha256 of its files and the data they were fitted on."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from spectra.kv.provenance import artifacts


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_each_artifact_press_records_its_files_and_its_data(tmp_path) -> None:
    folder = tmp_path / "qf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    data = {"files": [{"name": "more-licenses.txt", "bytes": 3, "sha256": "ab"}], "length": 512, "blocks": 16}
    (folder / "run.json").write_text(json.dumps({"artifact": "qfilter", "data": data}))
    curve = tmp_path / "curve.npy"
    np.save(curve, np.zeros((99, 2, 2)))
    found = artifacts(["knorm", f"qfilter({folder})", f"lukv({curve})", f"adakv(snapkv)"])
    assert found == [
        {"press": f"qfilter({folder})", "path": str(folder.resolve()), "data": data,
         "sha256": {name: digest(folder / name) for name in ("config.json", "model.safetensors", "run.json")}},
        {"press": f"lukv({curve})", "path": str(curve.resolve()), "data": None, "sha256": {"curve.npy": digest(curve)}}]


def test_a_press_inside_a_wrapper_is_found(tmp_path) -> None:
    curve = tmp_path / "curve.npy"
    np.save(curve, np.zeros((99, 2, 2)))
    found = artifacts([f"composed(snapkv,lukv({curve}))"])
    assert [entry["press"] for entry in found] == [f"lukv({curve})"]
