"""Runs spread over processes with torch.distributed (`torchrun --nproc-per-node N -m spectra …`).

Each process takes every N-th sequence (on a resume, of those no checkpoint holds: `share`), accumulates its own
streaming statistics, and the states are combined exactly at the end: counts, sums and histograms are summed (in
float64, exact for counts below 2⁵³), minima and maxima reduced; process 0 alone writes the run directory. gloo serves CPU
processes, nccl GPU ones (one GPU per process, chosen by LOCAL_RANK).
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from .stats import Reduce, State

_OPS = {Reduce.SUM: dist.ReduceOp.SUM, Reduce.MIN: dist.ReduceOp.MIN, Reduce.MAX: dist.ReduceOp.MAX}


def requested() -> bool:
    """True when launched by torchrun (or any launcher setting WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: torch.device) -> torch.device:
    """Join the process group once; on CUDA each process takes the GPU of its LOCAL_RANK."""
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def rank() -> int:
    """This process's rank (before the group is joined: the launcher's RANK)."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0")) if requested() else 0


def size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def share(candidates: Iterable[int], held: Container[int] = (), shard: tuple[int, int] = (0, 1)) -> Iterator[int]:
    """The candidate sequences one process takes, shard = (rank, size): those no checkpoint holds (`held`), the i-th
    of them to process i mod size; with nothing held, sequence i goes to process i mod size."""
    rank, size = shard
    left = 0
    for index in candidates:
        if index in held:
            continue
        if left % size == rank:
            yield index
        left += 1


def reduce_state(state: State, device: torch.device) -> dict[str, np.ndarray]:
    """Every process's state combined exactly, each array by its own reduction (see module docstring)."""
    if size() == 1:
        return {name: part.array for name, part in state.items()}
    combined = {}
    for name in sorted(state):
        value = np.asarray(state[name].array)
        tensor = torch.from_numpy(value.astype(np.float64)).to(device)
        dist.all_reduce(tensor, op=_OPS[state[name].reduce])
        combined[name] = tensor.cpu().numpy().astype(value.dtype)
    return combined


def total(count: int, device: torch.device) -> int:
    """The sum of an integer over all processes."""
    if size() == 1:
        return count
    tensor = torch.tensor([count], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return int(tensor.item())


def barrier() -> None:
    if size() > 1:
        dist.barrier()
