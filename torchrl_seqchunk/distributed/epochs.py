"""Epochs of equal length on every learner rank, so DDP's collectives stay in step."""
from __future__ import annotations

from collections.abc import Iterator

import torch.distributed as dist
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from ..streams.sampler import StreamChunkSampler
from .ranks import _all_reduce

__all__ = ["EvenEpochs"]


class EvenEpochs:
    """Iterating it yields one epoch of chunks, as many on every rank: the fewest any rank has.

    A :class:`~torchrl_seqchunk.StreamChunkSampler` with ``replacement=False`` deals each
    episode once per epoch, so an epoch lasts as many chunks as its longest stream needs
    and ranks holding more data would run more DDP backwards (each a collective) than
    others. Each iteration draws this rank's first chunk, reads the epoch's length from
    :attr:`~torchrl_seqchunk.StreamChunkSampler.remaining_batches`, takes the minimum over
    the ranks (one ``all_reduce(MIN)``) and yields that many chunks (``[B, T]``, as
    ``buffer.sample()``); a longer epoch's rest is drawn and dropped with the last one. An
    epoch left before its end (a ``break``, a prefetcher closed early, which puts the sampler
    back at its last delivered chunk) is drawn off when the next iteration starts, so every
    epoch deals every episode anew.
    :attr:`count` is the number agreed for the last epoch, :attr:`own` this rank's own.

    .. note:: The agreement runs on a gloo group made at construction (a collective:
        build it on every rank at the same point, once), so it can run in a
        :class:`~torchrl_seqchunk.ChunkPrefetcher`'s thread while DDP runs NCCL. Without
        an initialized process group it is one rank's epochs.

    Args:
        buffer (ReplayBuffer): this rank's buffer, sampling with a
            :class:`~torchrl_seqchunk.StreamChunkSampler` built with ``replacement=False``.

    Keyword Args:
        group (ProcessGroup, optional): the group the ranks agree in. Defaults to a new
            gloo group over all ranks when ``torch.distributed`` is initialized.

    Raises:
        TypeError: ``buffer`` is not a TorchRL replay buffer, or its sampler is not a
            :class:`~torchrl_seqchunk.StreamChunkSampler`.
        ValueError: the sampler draws with replacement (its epochs never end); while
            iterating, on every rank, when some rank cannot draw the first chunk of its
            epoch (e.g. no episode in its buffer): that rank raises its own error (the
            sampler's), the others name the agreed count 0, and no rank is left waiting.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_seqchunk import EvenEpochs, StreamChunkSampler
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     sampler=StreamChunkSampler(2, 4, replacement=False, seed=0),
        ...     batch_size=8,
        ... )
        >>> done = (torch.arange(20) % 5 == 4).unsqueeze(-1)  # 4 episodes of 5 steps
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(20), ("next", "done"): done}, [20]))
        >>> epochs = EvenEpochs(rb)  # one process: the count is this rank's own
        >>> [chunk.batch_size for chunk in epochs]  # 2 streams of 10 steps, 4 per chunk
        [torch.Size([2, 4]), torch.Size([2, 4]), torch.Size([2, 4])]
        >>> epochs.count, epochs.own
        (3, 3)
    """

    def __init__(self, buffer: ReplayBuffer, *, group: dist.ProcessGroup | None = None):
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(
                f"buffer must be a TorchRL ReplayBuffer (e.g. TensorDictReplayBuffer), got "
                f"{type(buffer).__name__}."
            )
        sampler = buffer.sampler
        if not isinstance(sampler, StreamChunkSampler):
            raise TypeError(
                f"buffer's sampler must be a StreamChunkSampler, got {type(sampler).__name__}; "
                "build the buffer with sampler=StreamChunkSampler(..., replacement=False)."
            )
        if sampler.replacement:
            raise ValueError(
                "buffer's StreamChunkSampler draws with replacement=True, whose epochs never "
                "end; build it with replacement=False (each episode once per epoch)."
            )
        if group is None and dist.is_initialized():
            group = dist.new_group(backend="gloo")
        self.buffer, self.group = buffer, group
        self.count: int | None = None
        self.own: int | None = None

    def _agree(self, own: int) -> int:
        """The smallest ``own`` over the ranks of the group (``own`` alone without one)."""
        if self.group is None:
            return own
        return _all_reduce([own], dist.ReduceOp.MIN, self.group)[0]

    def __iter__(self) -> Iterator[TensorDictBase]:
        sampler, failure = self.buffer.sampler, None
        try:
            while sampler.remaining_batches:  # an epoch left early (also by a prefetcher put back)
                self.buffer.sample()
            first = self.buffer.sample()
            own = sampler.remaining_batches + 1  # the chunk drawn and those left
        except Exception as error:  # e.g. no episode here: the others must not wait for us
            first, own, failure = None, 0, error
        count = self._agree(own)
        self.own, self.count = own, count
        if failure is not None:
            raise failure
        if count == 0:
            raise ValueError(
                "EvenEpochs: the ranks agreed on 0 chunks for this epoch: another rank has no "
                "episode to sample (it raised the sampler's error). Write whole episodes on "
                "every rank before training (assign at least one env worker to each rank)."
            )
        for i in range(count):
            chunk = first if i == 0 else self.buffer.sample()
            if i == count - 1:  # drop the rest of a longer epoch: the next one is dealt anew
                while not sampler.ran_out:
                    self.buffer.sample()
            yield chunk

    def __repr__(self) -> str:
        return f"{type(self).__name__}(count={self.count}, own={self.own})"
