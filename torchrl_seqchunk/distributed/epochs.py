"""Epochs of equal length on every learner rank.

A :class:`~torchrl_seqchunk.StreamChunkSampler` with ``replacement=False`` deals each
episode once per epoch, so an epoch lasts as many chunks as its longest stream needs:
a rank holding more (or longer) episodes runs more chunks than another. Under
``DistributedDataParallel`` every backward is a collective, so ranks with different chunk
counts fall out of step (parameters drift apart, then a collective fails).
:class:`EvenEpochs` makes the ranks agree on the count first.
"""
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

    Each iteration draws this rank's first chunk of an epoch (``buffer.sample()``), reads
    how many chunks the epoch has from the sampler's
    :attr:`~torchrl_seqchunk.StreamChunkSampler.remaining_batches`, and takes the
    minimum over the ranks with one ``all_reduce(MIN)``. Every rank then yields exactly
    that many chunks; a rank whose epoch is longer draws the rest of it (and drops it)
    with its last chunk, so the next iteration deals a new epoch on every rank. The
    chunks dropped are the ends of that rank's streams (its episodes dealt last); over
    epochs the sampler's random order spreads the loss over all episodes.

    Use it as the source of a :class:`~torchrl_seqchunk.ChunkPrefetcher` (e.g.
    ``ChunkPrefetcher(itertools.chain.from_iterable(itertools.repeat(even, epochs)))``):
    the agreement then runs in the prefetcher's thread while the training thread runs
    DDP's collectives, which is why it uses a process group of its own (a gloo group made
    at construction, so the count travels on the CPU even when DDP runs NCCL). Build it
    on every rank at the same point of the program, once (making a group is a
    collective). Without an initialized process group it is one rank's epochs.

    Iterating yields TensorDicts of batch size ``[B, T]`` as ``buffer.sample()`` does
    (see :class:`~torchrl_seqchunk.StreamChunkSampler`; ``("collector", "mask")`` is False
    on padding). :attr:`count` is the number agreed for the last epoch, :attr:`own` this
    rank's own count before the agreement (ints, ``None`` before the first epoch).

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
