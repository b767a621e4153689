"""Checkpoint shards: one process's sequences in its own file, written whole or not at all, read back only when
they belong to the run, combined with the processes' states by each array's reduction; the sequences left dealt
among any number of processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectra import distributed, shards
from spectra.errors import SpectraError
from spectra.rundir import CHECKPOINT
from spectra.stats import Reduce, Tagged

SETTINGS = {"length": 24, "samples": 8, "extra": {"presses": "knorm"}}
META = {"kind": "evaluate", "settings": SETTINGS, "data": {"sha256": "abc"}}


def same(recorded: dict) -> list[str]:
    """The settings that differ from SETTINGS (the loop passes its own comparison)."""
    return sorted(key for key in set(recorded) | set(SETTINGS) if recorded.get(key) != SETTINGS.get(key))


def written(partial, rank: int, indices: list[int], scale: float = 1.0, meta: dict = META) -> shards.Writer:
    writer = shards.Writer(partial, meta, rank, 2)
    writer.add(indices)
    writer.save({"sums": np.full(3, scale * len(indices)), "count": np.array([len(indices)], dtype=np.int64)})
    return writer


def test_a_shard_holds_its_state_its_sequences_and_its_run(tmp_path) -> None:
    partial = tmp_path / "run.partial"
    writer = written(partial, 1, [5, 1, 3])
    assert not writer.pending
    writer.add([7])
    assert writer.pending
    assert writer.path.parent == partial / "shards" and writer.path.name.startswith("1-of-2-")
    assert shards.Writer(partial, META, 1, 2).path != writer.path  # a process of another start: a file of its own
    [shard] = shards.read(partial, "evaluate", same)
    assert shard.indices == {1, 3, 5} and shard.meta == {**META, "rank": 1, "processes": 2}
    state = shard.state()
    assert sorted(state) == ["count", "sums"] and state["count"].dtype == np.int64
    assert np.array_equal(state["sums"], [3.0, 3.0, 3.0])
    assert shards.read(tmp_path / "none.partial", "evaluate", same) == ()


def test_a_write_that_fails_midway_leaves_the_previous_shard_whole(tmp_path, monkeypatch) -> None:
    """The shard goes through a temporary file and a rename: a crash while its bytes are written (here: half of
    them, then an error) leaves the last shard as it was, and the temporary file a killed process would leave is
    never read as a shard."""
    partial = tmp_path / "run.partial"
    writer = written(partial, 0, [0, 2])
    before = writer.path.read_bytes()
    real = np.savez

    def half(handle, **arrays) -> None:
        real(handle, **arrays)
        handle.seek(0)
        handle.truncate(len(before) // 2)
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", half)
    writer.add([4])
    with pytest.raises(OSError, match="disk full"):
        writer.save({"sums": np.zeros(3), "count": np.array([3])})
    monkeypatch.undo()
    assert writer.path.read_bytes() == before and [p.name for p in writer.path.parent.iterdir()] == [writer.path.name]
    (writer.path.parent / f".{writer.path.name}.x1y2.tmp").write_bytes(before[: len(before) // 2])  # a kill mid-write
    [shard] = shards.read(partial, "evaluate", same)
    assert shard.indices == {0, 2}


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "no indices"])
def test_a_damaged_shard_is_refused_in_one_line(damage, tmp_path) -> None:
    partial = tmp_path / "run.partial"
    path = written(partial, 0, [0, 2]).path
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "not a zip":
        path.write_text("hello")
    else:
        np.savez(path, sums=np.zeros(3))
    with pytest.raises(SpectraError) as refused:
        shards.read(partial, "evaluate", same)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path} is damaged (truncated or not a shard written by spectra)")
    assert "overwrite" in message


def test_a_shard_of_another_run_configuration_is_refused_in_one_line(tmp_path) -> None:
    partial = tmp_path / "run.partial"
    written(partial, 0, [0, 2])
    other = written(partial, 1, [1], meta={**META, "settings": {**SETTINGS, "samples": 9}})
    with pytest.raises(SpectraError) as refused:
        shards.read(partial, "evaluate", same)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{other.path} was written by a run with different samples: it is not a shard of "
                              f"{partial}; remove it, or pass overwrite=True")
    other.path.unlink()
    written(partial, 1, [1], meta={**META, "kind": "analyze"})
    with pytest.raises(SpectraError, match="written by a run with different kind"):
        shards.read(partial, "evaluate", same)


def test_two_shards_holding_one_sequence_are_refused(tmp_path) -> None:
    partial = tmp_path / "run.partial"
    written(partial, 0, [0, 2])
    written(partial, 1, [1, 2])
    with pytest.raises(SpectraError, match=r"is damaged \(sequence 2 is also in 0-of-2-"):
        shards.read(partial, "evaluate", same)


def test_held_sequences_are_a_checkpoint_prefix_and_the_shards(tmp_path) -> None:
    partial = tmp_path / "run.partial"
    partial.mkdir()
    np.savez(partial / CHECKPOINT, sums=np.full(3, 10.0), count=np.array([3]), done=np.array(3))
    found = (*shards.read(partial, "evaluate", same), )
    assert found == ()
    written(partial, 0, [4, 6])
    written(partial, 1, [5])
    held = shards.Held(3, shards.read(partial, "evaluate", same))
    assert len(held) == 6 and [i for i in range(9) if i in held] == [0, 1, 2, 4, 5, 6] and -1 not in held
    states = list(held.states(partial))
    assert [int(state["count"][0]) for state in states] == [3, 2, 1] and "done" not in states[0]
    assert len(shards.Held()) == 0 and 0 not in shards.Held() and not list(shards.Held().states(partial))


def test_held_states_combine_by_each_arrays_reduction(tmp_path) -> None:
    state = {"sums": Tagged(np.zeros(2, np.float32), Reduce.SUM), "low": Tagged(np.zeros(2), Reduce.MIN),
             "high": Tagged(np.zeros(2), Reduce.MAX), "ids": Tagged(np.zeros(2, np.int64), Reduce.SUM)}
    combined = {"sums": np.array([1.5, 2], np.float32), "low": np.array([3.0, -1]), "high": np.array([3.0, -1]),
                "ids": np.array([7, 0])}
    held = [{"sums": np.array([1, 1], np.float32), "low": np.array([2.0, 5]), "high": np.array([2.0, 5]),
             "ids": np.array([0, 9])},
            {"sums": np.array([0.25, 0], np.float32), "low": np.array([4.0, 0]), "high": np.array([4.0, 0]),
             "ids": np.array([0, 0])}]
    out = shards.combine(state, combined, held, tmp_path)
    assert out["sums"].dtype == np.float32 and np.array_equal(out["sums"], [2.75, 3])
    assert np.array_equal(out["low"], [2, -1]) and np.array_equal(out["high"], [4, 5])
    assert out["ids"].dtype == np.int64 and np.array_equal(out["ids"], [7, 9])
    with pytest.raises(SpectraError, match=f"a checkpoint in {tmp_path} holds no low of the run's shape"):
        shards.combine(state, combined, [{**held[0], "low": np.zeros(3)}], tmp_path)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("held", [(), (0, 1, 4, 5, 6), range(3)])
def test_the_sequences_left_are_dealt_once_and_evenly(size, held) -> None:
    shares = [list(distributed.share(range(10), held, (rank, size))) for rank in range(size)]
    left = [i for i in range(10) if i not in held]
    assert sorted(i for share in shares for i in share) == left
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    if not held:
        assert all(i % size == rank for rank, share in enumerate(shares) for i in share)


def test_a_shard_records_json_it_can_read_back(tmp_path) -> None:
    """The shard's record of its run is JSON in a text array: nothing is pickled."""
    path = written(tmp_path / "run.partial", 0, [0]).path
    with np.load(path, allow_pickle=False) as data:
        assert json.loads(str(data[shards.META]))["settings"] == SETTINGS
        assert data[shards.INDICES].dtype == np.int64
