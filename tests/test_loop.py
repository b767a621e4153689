"""The one loop: resume after an interrupt gives the same numbers, an existing run survives until its
replacement is complete, a short corpus is used whole and said so, synthetic runs resume too."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import spectra
from frames import assert_frames_close
from spectra import distributed, shards
from spectra.errors import Interrupted, SpectraError

QUIET = dict(progress=None, notify=lambda line: None)


class Stop(Exception):
    """Raised from a progress callback: an interrupt after some batches."""


def test_resume_ends_with_the_same_numbers(roberta_dir, text_file, tmp_path) -> None:
    settings = dict(length=24, samples=14, batch_size=4, checkpoint_seconds=0.0, notify=lambda line: None)
    whole = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "whole", progress=None, **settings)

    def interrupt(done, total):
        if done >= 8:
            raise Stop

    with pytest.raises(Stop):
        spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "cut", progress=interrupt, **settings)
    assert not (tmp_path / "cut").exists() and (tmp_path / "cut.partial" / "checkpoint.npz").exists()
    with pytest.raises(SpectraError, match="pass resume=True"):
        spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "cut", progress=None, **settings)
    with pytest.raises(SpectraError, match="different samples"):
        spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "cut", progress=None, resume=True,
                        **{**settings, "samples": 15})
    seen = []
    resumed = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "cut", resume=True,
                              progress=lambda done, total: seen.append(done), **settings)
    assert seen[0] == 8 and seen[-1] == 14
    assert np.array_equal(resumed.cum_mean, whole.cum_mean)
    assert np.array_equal(resumed.cum_std, whole.cum_std)
    assert resumed.metrics.equals(whole.metrics)
    assert not (tmp_path / "cut.partial").exists()


def test_existing_run_is_kept_until_overwrite_completes(roberta_dir, text_file, tmp_path) -> None:
    out = tmp_path / "run"
    first = spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=2, out=out, **QUIET)
    with pytest.raises(SpectraError, match="already exists.*overwrite=True"):
        spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=3, out=out, **QUIET)
    assert spectra.load_run(out).meta["samples"] == 2
    second = spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=3, out=out, overwrite=True, **QUIET)
    assert second.meta["samples"] == 3 and first.meta["samples"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_short_corpus_uses_everything_and_says_so(roberta_dir, tmp_path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("\n".join(["the attention matrix is low rank"] * 5) + "\n")
    lines: list[str] = []
    run = spectra.analyze(str(roberta_dir), str(small), length=8, samples=100, mode="truncate", out=tmp_path / "r",
                          progress=None, notify=lines.append)
    assert run.meta["samples"] == 5
    assert any("5 sequences of the 100" in line for line in lines)


def test_synthetic_theorems_resume_to_the_same_tables(tmp_path) -> None:
    settings = dict(synthetic=True, budget=[4, 8], eps=[0.3], d=4, heads=2, length=16, samples=9, batch_size=2,
                    checkpoint_seconds=0.0)
    whole = spectra.theorems(None, out=tmp_path / "whole", progress=None, **settings)

    def interrupt(done, total):
        if done >= 4:
            raise Stop

    with pytest.raises(Stop):
        spectra.theorems(None, out=tmp_path / "cut", progress=interrupt, **settings)
    assert (tmp_path / "cut.partial" / "checkpoint.npz").exists()
    resumed = spectra.theorems(None, out=tmp_path / "cut", resume=True, progress=None, **settings)
    for name, table in whole.tables.items():
        assert resumed.tables[name].equals(table), name
    assert resumed.meta["samples"] == 9


def test_a_run_recorded_before_an_option_existed_resumes_as_if_at_its_default(tmp_path) -> None:
    """An identity option absent from a checkpoint's run.json (the run predates it: `--local-layers` came after the
    board's reruns started) is compared as its declared default on --resume, so adding an option never strands an
    interrupted run; recorded with another value, it is still refused, named."""
    import json

    settings = dict(synthetic=True, budget=[4, 8], eps=[0.3], d=64, heads=1, length=16, samples=9, batch_size=2,
                    checkpoint_seconds=0.0)  # d and heads at TheoremOptions' defaults
    whole = spectra.theorems(None, out=tmp_path / "whole", progress=None, **settings)

    def interrupt(done, total):
        if done >= 4:
            raise Stop

    def recorded(out: str, **changed) -> None:
        with pytest.raises(Stop):
            spectra.theorems(None, out=tmp_path / out, progress=interrupt, **settings)
        path = tmp_path / f"{out}.partial" / "run.json"
        meta = json.loads(path.read_text())
        assert meta["settings"]["d"] == 64 and meta["settings"]["heads"] == 1
        for key in ("d", "heads"):
            del meta["settings"][key]
        path.write_text(json.dumps({**meta, "settings": {**meta["settings"], **changed}}))

    recorded("cut")
    resumed = spectra.theorems(None, out=tmp_path / "cut", resume=True, progress=None, **settings)
    for name, table in whole.tables.items():
        assert resumed.tables[name].equals(table), name
    recorded("other", heads=2)
    with pytest.raises(SpectraError, match="started with different heads"):
        spectra.theorems(None, out=tmp_path / "other", resume=True, progress=None, **settings)


def as_process(monkeypatch, rank: int) -> None:
    """This process as process `rank` of two (spectra.distributed answering so, with no process group): what
    it runs and checkpoints is that process's share, so shards are written without torchrun."""
    monkeypatch.setattr(distributed, "requested", lambda: True)
    monkeypatch.setattr(distributed, "start", lambda device: device)
    monkeypatch.setattr(distributed, "rank", lambda: rank)
    monkeypatch.setattr(distributed, "size", lambda: 2)
    monkeypatch.setattr(distributed, "barrier", lambda: None)


def test_shards_of_processes_stopped_at_different_points_resume_in_one(tmp_path, monkeypatch) -> None:
    """A single process's checkpoint (samples 0-1), then process 0 of two stopped after its first shard (2, 3),
    then process 1 of two of another start stopped after its first (6, 7): one process resumes, skips all six and
    runs 4, 5 and 8, and combines the checkpoint, both shards and its own state into the uninterrupted tables."""
    settings = dict(synthetic=True, budget=[4, 8], eps=[0.3], d=4, heads=2, length=16, samples=9, batch_size=2,
                    checkpoint_seconds=0.0)
    whole = spectra.theorems(None, out=tmp_path / "whole", progress=None, **settings)
    cut, partial = tmp_path / "cut", tmp_path / "cut.partial"

    def interrupt(done, total):
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        spectra.theorems(None, out=cut, progress=interrupt, **settings)
    assert (partial / "checkpoint.npz").exists() and not (partial / "shards").exists()  # one process: as before
    save = shards.Writer.save

    def stop_after_save(self, state):
        save(self, state)
        raise Stop

    monkeypatch.setattr(shards.Writer, "save", stop_after_save)
    for rank, indices in ((0, [2, 3]), (1, [6, 7])):
        with monkeypatch.context() as process:
            as_process(process, rank)
            with pytest.raises(Stop):
                spectra.theorems(None, out=cut, resume=True, progress=None, **settings)
        [written] = [path for path in (partial / "shards").glob(f"{rank}-of-2-*.npz")]
        with np.load(written) as shard:
            assert shard["shard.indices"].tolist() == indices
    monkeypatch.undo()
    seen = []
    resumed = spectra.theorems(None, out=cut, resume=True, progress=lambda done, total: seen.append(done), **settings)
    assert seen[0] == 6 and seen[-1] == 9 and resumed.meta["samples"] == 9 and resumed.meta["processes"] == 1
    assert not partial.exists() and sorted(p.name for p in cut.iterdir()) == sorted(p.name for p in whole.path.iterdir())
    for name, table in whole.tables.items():
        assert_frames_close(resumed.tables[name], table, rtol=1e-12, atol=1e-12, name=name)


def test_a_process_done_with_its_share_checkpoints_it_before_waiting_for_the_others(tmp_path, monkeypatch) -> None:
    """Process 0 of two finishes its share long before its next checkpoint is due; the other crashes while it waits
    to combine their states (here: the combination raises). Its whole share is in its shard all the same."""
    def crashed(state, device):
        raise Stop

    as_process(monkeypatch, 0)
    monkeypatch.setattr(distributed, "reduce_state", crashed)
    with pytest.raises(Stop):
        spectra.theorems(None, out=tmp_path / "run", synthetic=True, budget=[4], eps=[0.3], d=4, heads=2, length=16,
                         samples=9, batch_size=2, checkpoint_seconds=3600.0, progress=None)
    [written] = (tmp_path / "run.partial" / "shards").glob("0-of-2-*.npz")
    with np.load(written) as shard:
        assert shard["shard.indices"].tolist() == [0, 1, 4, 5, 8]  # batches 0, 2 and 4 of [0, 1], [2, 3], …
    assert (tmp_path / "run.partial" / "run.json").exists()


def test_a_shard_of_another_configuration_is_refused_before_the_run(tmp_path, monkeypatch) -> None:
    """A shard whose settings differ from the run resumed (copied from another run's directory) is refused in one
    line naming it and the setting, before anything runs."""
    settings = dict(synthetic=True, budget=[4], eps=[0.3], d=4, heads=2, length=16, samples=6, batch_size=2,
                    checkpoint_seconds=0.0)
    save = shards.Writer.save

    def stop_after_save(self, state):
        save(self, state)
        raise Stop

    monkeypatch.setattr(shards.Writer, "save", stop_after_save)
    for out, length in (("run", 16), ("other", 12)):
        with monkeypatch.context() as process:
            as_process(process, 0)
            with pytest.raises(Stop):
                spectra.theorems(None, out=tmp_path / out, progress=None, **{**settings, "length": length})
    [foreign] = (tmp_path / "other.partial" / "shards").glob("*.npz")
    foreign.rename(tmp_path / "run.partial" / "shards" / foreign.name)
    monkeypatch.undo()
    with pytest.raises(SpectraError) as refused:
        spectra.theorems(None, out=tmp_path / "run", resume=True, progress=None, **settings)
    message = refused.value.for_cli()
    assert "\n" not in message and message.startswith(
        f"{tmp_path / 'run.partial' / 'shards' / foreign.name} was written by a run with different n: it is "
        f"not a shard of {tmp_path / 'run.partial'}; remove it, or pass --overwrite to start over")


@pytest.mark.parametrize("checkpoint_seconds", [3600.0, 0.0])
def test_two_interrupts_say_whether_a_checkpoint_exists(checkpoint_seconds, roberta_dir, text_file, tmp_path) -> None:
    """Ctrl-C twice stops at once. Before the first checkpoint there is nothing to resume: the message says so
    (never "continue from the last checkpoint") and nothing is on disk; after one, it names where it resumes."""
    def twice(done, total):
        if done >= 4:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    notices = []
    with pytest.raises(Interrupted) as stopped:
        spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "run", length=24, samples=12, batch_size=4,
                        checkpoint_seconds=checkpoint_seconds, progress=twice, notify=notices.append)
    message = stopped.value.for_cli()
    if checkpoint_seconds:
        assert message == ("interrupted twice: stopped at once after 4 sequences, before the first checkpoint: "
                           "nothing was saved; run the command again")
        assert list(tmp_path.iterdir()) == []
    else:
        assert message == ("interrupted twice: stopped at once; continue from the checkpoint after 4 sequences with "
                           f"--resume and the same --out ({tmp_path / 'run'})")
        assert (tmp_path / "run.partial" / "checkpoint.npz").exists()


def test_threads_option_sets_torch_threads_for_the_run(roberta_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    """`threads=` and `--threads` reach the loop: the run's forward passes and spectra see that many torch threads,
    and the count before the run comes back after it (the suite runs on one). Speed is benchmarks/threads.py's."""
    import torch
    from tiny import run_cli

    from spectra import loop

    seen = []
    original = loop._execute

    def recording(job, reporter, timer):
        seen.append(torch.get_num_threads())
        return original(job, reporter, timer)

    monkeypatch.setattr(loop, "_execute", recording)
    before = torch.get_num_threads()
    spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=2, threads=3, out=tmp_path / "api", **QUIET)
    assert seen == [3] and torch.get_num_threads() == before
    spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=2, out=tmp_path / "default", **QUIET)
    assert seen == [3, before], "no --threads: torch's own count (one per usable CPU) is left alone"
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--length", "16", "--samples", "2",
                              "--threads", "2", "--out", str(tmp_path / "cli")], monkeypatch, capsys)
    assert code == 0, err
    assert seen == [3, before, 2] and torch.get_num_threads() == before
    assert "threads" not in spectra.load_run(tmp_path / "cli").meta["settings"], "speed, not identity"
    code, out, err = run_cli(["analyze", str(roberta_dir), "--data", str(text_file), "--threads", "0"], monkeypatch,
                             capsys)
    assert code == 2 and err == "error: --threads must be a positive integer, got 0\n" and len(seen) == 3


def test_a_second_run_started_while_the_first_loads_its_model_is_refused(roberta_dir, text_file, tmp_path,
                                                                         monkeypatch) -> None:
    """Issue 41, defect 3: the lock was taken after the model loaded, so a second run started meanwhile passed every
    check, loaded too, and replaced the first one's results once that had finished (both said 'written'). The second
    run starts here inside the first's model load, deterministically: it is refused at once, and the first run's
    results are its own."""
    from spectra.sources import ModelSource

    out, second = tmp_path / "run", []
    start = ModelSource.start

    def load_and_race(source) -> None:
        if not second:  # the first run's load: the second, same command, starts now and runs to its end
            second.append(None)
            try:
                spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=3, out=out, **QUIET)
            except SpectraError as refused:
                second[0] = str(refused)
        start(source)

    monkeypatch.setattr(ModelSource, "start", load_and_race)
    first = spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=2, out=out, **QUIET)
    assert second[0] is not None and "is being written by another spectra run" in second[0]
    assert first.meta["samples"] == spectra.load_run(out).meta["samples"] == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_a_run_finished_between_the_checks_and_the_lock_is_seen_under_the_lock(roberta_dir, text_file, tmp_path,
                                                                               monkeypatch) -> None:
    """The rest of the window: a run that finishes after this one checked its target and before this one holds the
    lock. The checks run again under the lock, so it is refused before its model loads instead of replacing it."""
    from spectra import models, rundir

    out, raced = tmp_path / "run", []
    writable, load = rundir.check_writable, models.load

    def checked_then_race(path, *args, **kwargs) -> None:
        writable(path, *args, **kwargs)
        if not raced and path == out:  # the last of this run's checks has passed: another run writes `out` now
            raced.append("racing")
            raced[0] = spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=3, out=out, **QUIET)
            monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model loaded after the race"))

    monkeypatch.setattr(rundir, "check_writable", checked_then_race)
    with pytest.raises(SpectraError, match="run directory .*run already exists; pass overwrite=True"):
        spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=2, out=out, **QUIET)
    assert raced[0].meta["samples"] == spectra.load_run(out).meta["samples"] == 3, "the finished run is kept"
    monkeypatch.setattr(models, "load", load)


def test_a_changed_data_key_is_said_in_a_sentence() -> None:
    """Issue 41, item 15: a run whose data kept its size but not its content said "its sha256 differ"."""
    from spectra.loop import differ

    assert differ(["sha256"]) == "its sha256 differs"
    assert differ(["bytes", "sha256"]) == "its bytes and sha256 differ"
    assert differ(["bytes", "sha256", "documents"]) == "its bytes, sha256 and documents differ"


def test_the_probe_input_a_source_feeds_is_counted_to_the_probes_stage() -> None:
    """Issue 37, item 1: the loop hands a source the probe itself (`Staged`), not an untyped callable; both inputs
    reach the probe, their time counted to the stage 'probes'."""
    from spectra import timings
    from spectra.loop import Staged
    from spectra.probes import Probe

    class Keep(Probe):
        def __init__(self) -> None:
            self.seen: list[object] = []

        def update(self, captured) -> None:
            self.seen.append(captured)

        def prefilled(self, prefill) -> None:
            self.seen.append(prefill)

    kept = Keep()
    with timings.recording() as recorded:
        staged = Staged(kept)
        staged.update("layer")
        staged.prefilled("prefill")
    assert kept.seen == ["layer", "prefill"] and "probes" in recorded.seconds()


def test_a_calibrated_checkpoint_is_not_resumed_across_processes(roberta_dir, text_file, tmp_path,
                                                                  monkeypatch) -> None:
    """Across processes only the first would hold a checkpoint's fitted parameters: resuming a run with calibrated
    methods there is refused in one line, before any process group is joined; in one process it resumes."""
    settings = dict(budget=[4], methods=["linformer-pca(kv)"], samples=4, fit_samples=8, length=24, batch_size=4,
                    checkpoint_seconds=0.0, notify=lambda line: None)

    def interrupt(done, total):
        if done >= 12:
            raise Stop

    with pytest.raises(Stop):
        spectra.approx(str(roberta_dir), str(text_file), out=tmp_path / "fit", progress=interrupt, **settings)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SpectraError, match=r"cannot resume .*fit\.partial across processes: its calibrated .*resume "
                                           r"it with a single process"):
        spectra.approx(str(roberta_dir), str(text_file), out=tmp_path / "fit", progress=None, resume=True, **settings)
    monkeypatch.delenv("WORLD_SIZE")
    resumed = spectra.approx(str(roberta_dir), str(text_file), out=tmp_path / "fit", progress=None, resume=True,
                             **settings)
    assert resumed.meta["samples"] == 4
