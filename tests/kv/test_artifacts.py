"""Artifact directories (the layout kvpress's `PyTorchModelHubMixin.from_pretrained` loads): written and read back,
their shapes read from the safetensors header without torch, and every damaged or ill-fitting directory refused in
one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from spectra.errors import SpectraError
from spectra.kv import artifacts

QFILTER_CONFIG = {"num_layers": 2, "num_kv_heads": 3, "kv_head_dim": 4}


def test_a_written_directory_reads_back_whole(tmp_path) -> None:
    filters = torch.randn(2, 3, 4)
    folder = artifacts.write(tmp_path / "qf", {"q_filters": filters}, QFILTER_CONFIG)
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert not (tmp_path / "qf.partial").exists()
    assert json.loads((folder / "config.json").read_text()) == QFILTER_CONFIG
    assert artifacts.QFILTER.shape(folder) == {"layers": 2, "kv_heads": 3, "head_dim": 4}
    torch.testing.assert_close(artifacts.load("qfilter", folder)["q_filters"], filters, rtol=0, atol=0)
    again = artifacts.write(folder, {"q_filters": filters * 2}, QFILTER_CONFIG)  # replaced whole
    torch.testing.assert_close(artifacts.load("qfilter", again)["q_filters"], filters * 2, rtol=0, atol=0)


def test_damaged_directories_are_refused_in_one_line(tmp_path) -> None:
    def refused(folder, message: str) -> None:
        with pytest.raises(SpectraError, match=message) as error:
            artifacts.check_qfilter(str(folder))
        assert "\n" not in str(error.value)

    refused(tmp_path / "none", "no such directory")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "config.json is missing")
    folder = artifacts.write(tmp_path / "qf", {"q_filters": torch.zeros(2, 3, 4)}, QFILTER_CONFIG)
    (folder / "config.json").write_text("{nope")
    refused(folder, "not JSON")
    (folder / "config.json").write_text(json.dumps({**QFILTER_CONFIG, "num_kv_heads": 5}))
    refused(folder, "num_kv_heads is 5, but the tensors have 3")
    (folder / "config.json").write_text(json.dumps(QFILTER_CONFIG))
    (folder / "model.safetensors").write_bytes(b"\x00" * 4)
    refused(folder, "not a safetensors file")
    artifacts.write(folder, {"filters": torch.zeros(2, 3, 4)}, QFILTER_CONFIG)
    refused(folder, "holds no tensor 'q_filters'")
    artifacts.write(folder, {"q_filters": torch.zeros(2, 12)}, QFILTER_CONFIG)
    refused(folder, "'q_filters' has 2 axes, not 3")
    stats = artifacts.write(tmp_path / "st", {"query_mean": torch.zeros(2, 3, 4), "query_cov": torch.zeros(2, 3, 5, 5)},
                            {"num_layers": 2, "num_heads": 3, "head_dim": 4})
    with pytest.raises(SpectraError, match="disagree on head_dim"):
        artifacts.check_statistics(str(stats))


def test_an_artifact_of_another_model_is_refused_naming_both_shapes(tmp_path) -> None:
    folder = artifacts.write(tmp_path / "qf", {"q_filters": torch.zeros(2, 3, 4)}, QFILTER_CONFIG)
    artifacts.fits("qfilter", folder, "M", layers=2, kv_heads=3, head_dim=None, heads=9)
    artifacts.fits("qfilter", folder, "M", layers=None, kv_heads=None)
    with pytest.raises(SpectraError, match=r"Q-Filters .* is 2 layers × 3 key/value heads × 4 head dimensions, but "
                                           r"M has 30 layers × 3 key/value heads; fit them for this model"):
        artifacts.fits("qfilter", folder, "M", layers=30, kv_heads=3, heads=9)
    with pytest.raises(SpectraError, match="but M has 2 layers × 3 key/value heads × 64 head dimensions"):
        artifacts.fits("qfilter", folder, "M", layers=2, kv_heads=3, head_dim=64)


@pytest.mark.parametrize("kind", ["qfilter", "expected_attention_stats", "kvzap"])
def test_a_weights_file_cut_short_or_padded_is_refused_before_safetensors_reads_it(kind, tmp_path) -> None:
    """Issue 55, item 1: model.safetensors cut to half passed the header's check and failed in safetensors' loader,
    after the model had loaded (a traceback). Its length is held to the header's extent: cut short (in its data or in
    its header), padded, or with a tensor whose bytes do not follow its shape, one line; whole, it loads."""
    tensors, config = {
        "qfilter": ({"q_filters": torch.randn(4, 3, 16)}, {"num_layers": 4, "num_kv_heads": 3, "kv_head_dim": 16}),
        "expected_attention_stats": ({"query_mean": torch.randn(2, 3, 16), "query_cov": torch.randn(2, 3, 16, 16)},
                                     {"num_layers": 2, "num_heads": 3, "head_dim": 16}),
        "kvzap": ({f"layers.{i}.{part}": torch.randn(*shape) for i in range(2)
                   for part, shape in (("weight", (3, 64)), ("bias", (3,)))},
                  {"model_type": "kvzap", "input_dim": 64, "output_dim": 3, "n_modules": 2, "hidden_dim": None}),
    }[kind]
    folder = artifacts.write(tmp_path / kind, tensors, config)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    assert artifacts.load(kind, folder).keys() == tensors.keys()
    header = 8 + int.from_bytes(whole[:8], "little")
    data = sum(tensor.numel() * 4 for tensor in tensors.values())
    assert len(whole) == header + data and len(whole) // 2 > header  # half the file cuts into the tensors' data
    check = getattr(artifacts, {"qfilter": "check_qfilter", "expected_attention_stats": "check_statistics",
                                "kvzap": "check_surrogate"}[kind])
    for damaged, message in ((whole[:len(whole) // 2], f"is cut short: its tensors take {data} bytes after the "
                                                       f"header, but the file holds {len(whole) // 2 - header}"),
                             (whole[:-1], f"is cut short: its tensors take {data} bytes"),
                             (whole[:header - 5], f"is cut short: its header takes {header - 8} bytes, but the file "
                                                  f"holds {header - 13}"),
                             (whole + b"\0" * 4, f"holds {data + 4} bytes after the header, but its tensors take "
                                                 f"{data}")):
        weights.write_bytes(damaged)
        with pytest.raises(SpectraError) as refused:
            check(str(folder))
        assert message in str(refused.value) and "\n" not in str(refused.value), refused.value
        assert "spectra artifacts" in str(refused.value)
        with pytest.raises(Exception):  # what safetensors itself says of it, once the model has loaded
            load_file(str(weights))
    shifted = whole[8:header].replace(b'"data_offsets":[0,', b'"data_offsets":[4,')
    assert shifted != whole[8:header]
    weights.write_bytes(whole[:8] + shifted + whole[header:])
    with pytest.raises(SpectraError, match="does not follow its shape"):
        check(str(folder))


def test_a_file_named_for_a_directory_is_said_to_be_one(tmp_path) -> None:
    """Issue 55, item 7: kvzap(FILE) said "no such directory" of a file that exists. A file is said to be a file: the
    press reads the directory `spectra artifacts KIND` writes, and a file inside such a directory names its folder."""
    from spectra import registry

    folder = artifacts.write(tmp_path / "kz", {**{f"layers.{i}.weight": torch.zeros(3, 8) for i in range(2)},
                                               **{f"layers.{i}.bias": torch.zeros(3) for i in range(2)}},
                             {"model_type": "kvzap", "input_dim": 8, "output_dim": 3, "n_modules": 2,
                              "hidden_dim": None})
    loose = tmp_path / "notes.txt"
    loose.write_text("not an artifact")
    for press, message in (
            (f"kvzap({loose})", f"KVzap surrogate {loose} is a file: kvzap(DIR) reads the directory `spectra "
                                "artifacts kvzap` writes, holding config.json and model.safetensors; give that "
                                "directory"),
            (f"kvzap({folder / 'model.safetensors'})", f"is a file: kvzap(DIR) reads the directory `spectra artifacts "
                                                       f"kvzap` writes, holding config.json and model.safetensors; "
                                                       f"give its folder, kvzap({folder})"),
            (f"qfilter({loose})", f"Q-Filters {loose} is a file: qfilter(DIR) reads the directory `spectra artifacts "
                                  "qfilter` writes"),
            (f"expected_attention_stats({loose})", "expected_attention_stats(DIR) reads the directory `spectra "
                                                   "artifacts expected_attention_stats` writes"),
            (f"kvzap({tmp_path / 'none'})", "no such directory (`spectra artifacts kvzap` writes one")):
        with pytest.raises(SpectraError) as refused:
            registry.press_names([press])
        assert message in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert registry.press_names([f"kvzap({folder})"]) == (f"kvzap({folder})",)
