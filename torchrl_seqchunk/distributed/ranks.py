"""Learner ranks: which env workers feed which rank, each rank's own seed, and how ranks agree."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from .._checks import check_int

__all__ = ["assign_workers", "rank_seed"]


def _world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialized process group."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def _on_every_rank(stage: str, consequence: str) -> Iterator[None]:
    """Runs the block, then every rank learns whether it failed on some rank (an
    ``all_reduce`` of failure flags, also a barrier): a rank that failed raises its own
    error, the others a ``RuntimeError`` naming the ranks that failed, so none is left
    waiting in a later collective. Without a process group it only runs the block."""
    error = None
    try:
        yield
    except Exception as caught:  # raised below, once every rank knows
        error = caught
    if dist.is_initialized():
        rank, world_size = _world()
        flags = [int(r == rank and error is not None) for r in range(world_size)]
        failed = [r for r, flag in enumerate(_all_reduce(flags, dist.ReduceOp.SUM)) if flag]
    else:
        failed = []
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"rank(s) {failed} failed while {stage} (their own errors say why and how to fix "
            f"it); {consequence}"
        )


def _all_reduce(
    values: list[int], op: dist.ReduceOp, group: dist.ProcessGroup | None = None
) -> list[int]:
    """``values`` reduced element-wise with ``op`` over the ranks of ``group`` (the default
    group when ``None``): a collective, every rank of the group calls it. The ints travel on
    the CPU under gloo, on this rank's GPU under NCCL."""
    device = "cpu"
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    reduced = torch.tensor(values, dtype=torch.long, device=device)
    dist.all_reduce(reduced, op=op, group=group)
    return reduced.tolist()


def rank_seed(seed: int, rank: int, *, stream: int = 0) -> int:
    """The seed of rank ``rank``'s sampler in a run seeded with ``seed`` (``stream`` 0), or of
    another of its random streams.

    It is the first 64-bit word of NumPy's ``SeedSequence(seed, spawn_key=(rank,))``
    (``(rank, stream)`` for ``stream > 0``), the standard way to derive independent child
    streams from one seed: different ranks (and streams) get unrelated seeds, the same
    ``(seed, rank, stream)`` always the same one. Pass it as
    ``StreamChunkSampler(..., seed=rank_seed(seed, rank))``; seed each other generator of a
    rank from a stream of its own (e.g. ``torch.manual_seed(rank_seed(seed, rank, stream=1))``
    for the actions a rank's collectors draw): two generators of one kind seeded alike draw
    the same numbers.

    Args:
        seed (int): the run's seed, ``>= 0``.
        rank (int): the learner's rank (or any index: an env worker's), ``>= 0``.

    Keyword Args:
        stream (int): which of the rank's streams, ``>= 0``. Default ``0`` (the sampler's).

    Returns:
        int: a seed in ``[0, 2**64)``.

    Raises:
        TypeError: ``seed``, ``rank`` or ``stream`` not an int (a ``bool`` is refused).
        ValueError: ``seed``, ``rank`` or ``stream`` negative.

    Examples:
        >>> from torchrl_seqchunk import rank_seed
        >>> rank_seed(0, 0) == rank_seed(0, 0), rank_seed(0, 0) == rank_seed(0, 1)
        (True, False)
        >>> 0 <= rank_seed(7, 3) < 2**64
        True
    """
    seed, rank = check_int("seed", seed, low=0), check_int("rank", rank, low=0)
    stream = check_int("stream", stream, low=0)
    sequence = np.random.SeedSequence(seed, spawn_key=(rank, stream) if stream else (rank,))
    return int(sequence.generate_state(1, np.uint64)[0])


def assign_workers(num_workers: int, world_size: int) -> list[int]:
    """The rank each env worker writes to: round robin, worker ``w`` to rank ``w % world_size``.

    Every rank gets ``num_workers // world_size`` or one more workers. A rank with several
    workers holds trajectories numbered from 0 by each of them: give worker ``w`` the
    collector postproc :class:`~torchrl_seqchunk.TagTrajectories` ``(w, num_workers)`` so
    that ids stay unique in the rank's buffer.

    Args:
        num_workers (int): env workers (collectors), ``>= world_size``.
        world_size (int): learner ranks, ``>= 1``.

    Returns:
        list[int]: ``ranks[w]`` is the rank worker ``w`` feeds, of length ``num_workers``.

    Raises:
        TypeError: an argument not an int (a ``bool`` is refused).
        ValueError: ``world_size`` < 1, or fewer workers than ranks (a rank without a
            worker would never get data).

    Examples:
        >>> from torchrl_seqchunk import assign_workers
        >>> assign_workers(5, 2)
        [0, 1, 0, 1, 0]
    """
    world_size = check_int("world_size", world_size, low=1)
    num_workers = check_int("num_workers", num_workers, low=1)
    if num_workers < world_size:
        raise ValueError(
            f"num_workers={num_workers} is less than world_size={world_size}: a rank without "
            "an env worker never gets data; run at least one worker per learner rank."
        )
    return [w % world_size for w in range(num_workers)]
