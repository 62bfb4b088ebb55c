"""Writer tags: trajectory ids that stay unique when several env workers feed one buffer.

Every TorchRL collector numbers its trajectories from 0, so two ``RayCollector`` workers
writing into one buffer hand out the same ids, and a
:class:`~torchrl_seqchunk.StreamChunkSampler` with ``traj_key=("collector", "traj_ids")``
would file one worker's steps under the other's running trajectory. Tagging each worker's
batches with its worker number keeps them apart.
"""
from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from .._checks import check_int

__all__ = ["TagTrajectories"]


class TagTrajectories:
    """Rewrites a worker's trajectory ids as ``id * num_workers + worker``.

    Ids from different workers then never collide (worker ``w`` owns the ids equal to
    ``w`` modulo ``num_workers``), and steps of one trajectory keep one id. Give each env
    worker its own instance as the collector's ``postproc`` (e.g. ``RayCollector(...,
    collector_kwargs=[{"postproc": TagTrajectories(w, n)} for w in range(n)])``), or call
    it on every batch a worker yields before ``rb.extend``. It is a plain picklable object,
    so it can be sent to a worker process.

    Args:
        worker (int): this worker's number, ``0 <= worker < num_workers``.
        num_workers (int): how many workers write into the buffer (>= 1).

    Keyword Args:
        traj_key (NestedKey): the trajectory ids. Defaults to ``("collector", "traj_ids")``,
            where TorchRL collectors write them.

    Calling it on a TensorDict ``td`` (any batch size, e.g. a collector's ``[num_envs, T]``
    batch) sets ``td[traj_key]`` (integer, non-negative, of ``td``'s batch shape) to the
    tagged ids as a new int64 tensor of the same shape (a narrower dtype would wrap; the
    tensor ``td`` held is left as it was) and returns ``td``.

    Raises:
        TypeError: ``worker`` / ``num_workers`` not integers (a ``bool`` is refused); ids
            of a floating-point dtype.
        ValueError: ``num_workers`` < 1 or ``worker`` outside ``[0, num_workers)``; a batch
            without ``traj_key``; negative ids, or ids whose tag would pass int64's range.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_seqchunk import TagTrajectories
        >>> batch = TensorDict({("collector", "traj_ids"): torch.tensor([0, 0, 1])}, [3])
        >>> TagTrajectories(1, num_workers=2)(batch)["collector", "traj_ids"]
        tensor([1, 1, 3])
    """

    def __init__(self, worker: int, num_workers: int, *,
                 traj_key: NestedKey = ("collector", "traj_ids")):
        num_workers = check_int("num_workers", num_workers, low=1)
        worker = check_int("worker", worker, low=0, high=num_workers - 1)
        self.worker, self.num_workers, self.traj_key = worker, num_workers, traj_key

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        ids = td.get(self.traj_key, default=None)
        if ids is None:
            raise ValueError(
                f"traj_key {self.traj_key!r} not found in the batch (its keys: "
                f"{sorted(map(str, td.keys(True, True)))}); pass traj_key= naming the "
                "trajectory ids the collector writes."
            )
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(
                f"traj_key {self.traj_key!r} must hold integer ids, got dtype {ids.dtype}; "
                "store the ids as torch.long."
            )
        if (ids < 0).any():
            raise ValueError(
                f"traj_key {self.traj_key!r} holds negative ids (smallest {int(ids.min())}), "
                "which the tag would map onto another worker's ids; tag the collector's own "
                "ids (numbered from 0) before any padding."
            )
        largest = (torch.iinfo(torch.long).max - self.worker) // self.num_workers
        if ids.numel() and int(ids.max()) > largest:
            raise ValueError(
                f"traj_key {self.traj_key!r} holds id {int(ids.max())}, whose tag would pass "
                f"int64's range (at most {largest} with {self.num_workers} workers) and wrap onto "
                "another trajectory's; tag the collector's own ids (numbered from 0)."
            )
        # in int64: a narrower dtype would wrap and merge two workers' trajectories
        td.set(self.traj_key, ids.long() * self.num_workers + self.worker)
        return td

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(worker={self.worker}, num_workers={self.num_workers}, "
            f"traj_key={self.traj_key!r})"
        )
