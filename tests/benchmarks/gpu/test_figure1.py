"""benchmarks/gpu/figure1.py (what run.sh's eigen, figure1 and accuracy parts run on a GPU) runs where no GPU is,
on tiny sizes, with the batched route emulated by torch's eigvalsh: its parts import, run and print their tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu" / "figure1.py"


def _main(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    spec = importlib.util.spec_from_file_location("figure1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["figure1.py", *argv])
    try:
        module.main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    return code, capsys.readouterr().out


def test_the_solvers_part_runs_on_the_cpu(monkeypatch, capsys) -> None:
    code, out = _main(["solvers", "--device", "cpu", "--sizes", "16,40", "--matrices", "8", "--loop", "4"],
                      monkeypatch, capsys)
    rows = [line for line in out.splitlines() if line.startswith("| 16 |") or line.startswith("| 40 |")]
    assert code == 0 and len(rows) == 2 * 9, out
    assert all(float(row.split("|")[4].replace(",", "")) > 0 for row in rows)
    assert "batched route, softmax P, tolerance 1e-04 (emulated)" in out and "float64 100%" in out
    assert "torch eigvalsh float64, Jordan–Wielandt (2n)" in out
    collapsed = [row for row in rows if "rank-collapsed P, tolerance 1e-06" in row]
    assert len(collapsed) == 2 and all("Jordan–Wielandt 0%" not in row for row in collapsed), out


@pytest.mark.slow  # a RoBERTa-base-shaped model (110 M parameters) built and run four times on the CPU
def test_the_workload_and_accuracy_parts_run_on_the_cpu(monkeypatch, capsys, tmp_path) -> None:
    code, out = _main(["workload", "--device", "cpu", "--samples", "2", "--length", "16", "--batch-size", "2",
                       "--dtype", "float32"], monkeypatch, capsys)
    assert code == 0 and "done: 2 sequences" in out and '"spectrum_device": "cpu"' in out, out
    import tiny

    real = tiny.save_model(tmp_path / "encoder", "bert")
    text = tmp_path / "text.txt"
    text.write_text("a short real text, repeated until the workload has its tokens. " * 3)
    code, out = _main(["workload", "--device", "cpu", "--encoder", "real", "--model", str(real), "--data", str(text),
                       "--samples", "3", "--length", "16", "--batch-size", "2", "--dtype", "float32"],
                      monkeypatch, capsys)
    assert code == 0 and "done: 3 sequences" in out and "(real weights)" in out, out
    code, out = _main(["workload", "--device", "cpu", "--encoder", "real", "--model", str(tmp_path / "none")],
                      monkeypatch, capsys)
    assert code == "--encoder real reads --model " + str(tmp_path / "none") + ", which is not there (prepare.py makes it)"
    code, out = _main(["accuracy", "--device", "cpu", "--samples", "2", "--length", "16", "--model", "/nonexistent"],
                      monkeypatch, capsys)
    held = [line for line in out.splitlines() if line.startswith("| batched (cpu)")]
    assert code == 0 and len(held) == 3 and all(line.endswith("| yes |") for line in held), out
