"""Stream chunks: episodes concatenated into persistent streams and cut into ``[B, T]`` chunks.

The sampler keeps ``B`` streams. Each stream is a queue of episodes (what is left of
them). On every call a stream short of ``T`` unread steps appends whole episodes, drawn
in proportion to their length, and then its first ``T`` unread steps become row ``b`` of
the chunk. ``is_first`` marks the steps where an episode starts. This is the data layout of
truncated backpropagation through time over concatenated episodes (as in DreamerV3's
replay, Hafner et al. 2023, "Mastering Diverse Domains through World Models").

Its pieces: the stream queues (:mod:`~torchrl_seqchunk.streams.queues`), which episodes the
storage holds (:mod:`~torchrl_seqchunk.streams.episodes`) and the checks that every write
was seen (:mod:`~torchrl_seqchunk.streams.write_checks`). This file keeps the sampling, the
epochs, the state (with the snapshots that let a closed
:class:`~torchrl_seqchunk.ChunkPrefetcher` hand back undelivered chunks) and the class
docstring, the sampler's user manual (about 150 lines), which is why it runs past the
layout's ~450 lines.
"""
from __future__ import annotations

import collections
import heapq
import numbers
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from .episodes import _as_long, _EpisodeTracker, _WriteLog
from .queues import _Segment, _Stream
from .write_checks import check_buffers, check_writes_seen, newest_unrecorded

__all__ = ["StreamChunkSampler"]

# Set by a ChunkPrefetcher's worker thread before it asks for a chunk: a list that every
# StreamChunkSampler drawing that chunk joins (so the chunk can be handed back on close).
_prefetching = threading.local()

def _tensors_as(state: dict, convert) -> dict:
    """``state`` (nested dicts) with every tensor or NumPy leaf passed through ``convert``."""
    return {
        key: _tensors_as(value, convert) if isinstance(value, dict)
        else convert(value) if isinstance(value, (torch.Tensor, np.ndarray)) else value
        for key, value in state.items()
    }


class _NoReplacementDispatch(type(Sampler)):
    # TorchRL's sampler metaclass consumes a ``replacement`` keyword to swap in another
    # class; this sampler handles both modes itself, so the keyword goes to ``__init__``.
    def __call__(cls, *args, **kwargs):
        return type.__call__(cls, *args, **kwargs)


class StreamChunkSampler(Sampler, metaclass=_NoReplacementDispatch):
    """Samples ``[B, T]`` chunks of ``B`` persistent streams of concatenated episodes.

    Each of the ``num_streams`` streams is a queue of episodes. On every :meth:`sample`,
    a stream holding fewer than ``seq_len`` unread steps appends whole episodes until it
    holds at least ``seq_len`` (never more episodes than needed); then the first
    ``seq_len`` unread steps of each stream, in time order, form row ``b`` of the chunk
    (stream ``b`` is always row ``b``) and the rest waits for the next call. With
    ``replacement=True`` an episode is drawn with probability proportional to its length,
    ``P(e) = len(e) / (steps of all eligible episodes)`` (the episode of a uniformly drawn
    step). The layout is that of truncated backpropagation through time over
    concatenated episodes, as in DreamerV3's replay (Hafner et al., 2023, "Mastering
    Diverse Domains through World Models").

    Use it in a :class:`~torchrl.data.TensorDictReplayBuffer` with ``batch_size =
    num_streams * seq_len`` over a one-dimensional storage filled with ``rb.extend`` /
    ``rb.add`` (steps in time order, TorchRL layout: the step's keys at the root, reward
    and done flags under ``"next"``). ``rb.sample()`` then returns a TensorDict of batch
    size ``[B, T]`` holding the stored keys (e.g. ``"observation"`` ``[B, T, *obs]``,
    ``("next", "done")`` ``[B, T, 1]``) plus:

    - ``is_first_key``: bool ``[B, T, 1]``, True exactly where an episode starts (at
      ``t = 0`` only when a new episode starts there; False when the chunk continues one);
    - ``"index"``: long ``[B, T]``, the storage slots (set by the replay buffer);
    - ``episode_key`` / ``step_key`` when given: long ``[B, T]``, the episode id (write
      count of its first step) and the step-in-episode of every slot (diagnostics);
    - ``mask_key`` with ``replacement=False``: bool ``[B, T]``, False on padding.

    These keys travel in the sampler's info, which a plain
    :class:`~torchrl.data.ReplayBuffer` leaves out of what ``rb.sample()`` returns: the
    sampler warns when the buffer reading its storage is not a ``TensorDictReplayBuffer``
    (``rb.sample(return_info=True)`` then hands them over in the info dict).

    Episodes come from ``end_key`` flags (the last step of an episode has it True); steps
    are then read as one sequence in write order. A collector's ``[num_envs, T]`` batch,
    written flat (``rb.extend(batch.reshape(-1))``, env after env), interleaves several
    envs' trajectories: give ``traj_key=("collector", "traj_ids")`` so that each step is
    filed under its trajectory, an episode ends at its ``end_key`` flag, and a trajectory
    cut by the batch end continues with its steps of the next batch (with ``traj_key``
    and no stored ``end_key``, an episode ends where the id changes). Episodes still being
    written are drawn only with ``only_complete=False`` (as they are at that moment); an
    episode that lost steps to overwriting is never drawn.

    Ring buffers: a step whose slot was rewritten after its episode was queued is never
    emitted; the stream drops the rest of that episode and its next step is an episode
    start. The sampler learns about writes through the replay buffer's ``extend``/``add``
    calls (write through the buffer, not the storage): at every sample it compares the
    steps counted by the buffer's :class:`~torchrl.data.RoundRobinWriter` (a count shared
    with worker processes) and the storage's last written slot with the writes it was told
    of, and raises when a write bypassed ``rb.extend`` (e.g. a multi-process collector given
    ``replay_buffer=``: feed the buffer from the collector in the owning process instead,
    e.g. an ingest thread calling ``rb.extend``). A storage that was already filled
    when the sampler first saw it is read in time order, a wrapped ring from the slot after
    its cursor (refused when the buffer wrote into a full storage before the sampler first
    saw it: that order is lost). A ring wrapped (its cursor not at the last slot, or its
    writers counted more steps than it holds) lost the steps before its oldest one, so the
    rule for steps overwritten between two samples (below) applies: the episode holding the
    oldest step is dropped (with ``traj_key``, every stored episode), with a warning. Rows a
    writer skips (index ``-1``, e.g. ``TensorDictMaxValueWriter``) are not steps of the
    storage (with a warning). It reads
    the new steps at the next sample, so write at most the capacity between two samples:
    a step overwritten before it was read belongs to an unknown trajectory (with
    ``traj_key``: the episodes written after it in that stretch are dropped) or hides
    whether the next stored step starts an episode (end flags alone: the episode holding
    that step is dropped), with a warning in both cases. An episode still being
    written is forgotten once none of its steps is stored (a trajectory that never ends,
    e.g. cut by a collector's ``reset_at_each_iter``, keeps nothing), so the bookkeeping
    stays within the capacity; should its trajectory id come back after that, the new
    steps are read as an episode starting there.

    ``replacement=False`` (on-policy use): an epoch starts with every eligible episode
    dealt once, longest first, to the stream with the fewest steps so far (streams
    balanced in length), each stream then playing its episodes in random order. Chunks
    then run until every stream is empty; a stream that runs out first is padded
    (``mask_key`` False, ``is_first`` True, the padding repeats a valid slot).
    :attr:`ran_out` turns True with the last chunk of an epoch, so ``for chunk in rb:``
    runs exactly one epoch; the next :meth:`sample` starts a new one. A write that
    overwrites every step still queued ends the epoch there (:attr:`ran_out` turns True).

    The sampler is stateful: chunk ``k + 1`` continues chunk ``k``. It refuses the replay
    buffer's ``prefetch > 1``, whose worker threads may run two samples out of order (a
    deliberate difference from TorchRL's samplers, which accept it); use :class:`~torchrl_seqchunk.ChunkPrefetcher`, which keeps the order and, when
    closed, hands back the chunks it drew but did not deliver (they come next).
    :meth:`state_dict` / :meth:`dumps` hold the stream queues, the write stamps and the
    generator state, so a resumed run emits the same chunks as an uninterrupted one. A
    pickled sampler (``pickle``, ``copy.deepcopy``, a process started with spawn, after
    ``rb.share()`` too) is an independent copy built from that state: the owner's write
    stamps never move to shared memory, and writes the copy records in another process are
    writes the owner did not see (named at its next sample).

    Cost: each sample does O(B + queued pieces) Python work besides the gather, plus
    O(new steps) to read the end flags of the steps written since the last sample.

    Args:
        num_streams (int): number of streams ``B`` (>= 1), the first batch dim.
        seq_len (int): chunk length ``T`` (>= 1), the time (last) batch dim.

    Keyword Args:
        end_key (NestedKey): bool flag marking the last step of an episode. Defaults to
            ``("next", "done")``.
        traj_key (NestedKey, optional): trajectory id per step (e.g.
            ``("collector", "traj_ids")``), needed when writes interleave several envs.
            Defaults to ``None`` (use ``end_key`` only).
        is_first_key (NestedKey): key written with the episode-start flags. Defaults to
            ``"is_first"``; ``"is_init"`` matches TorchRL's ``InitTracker``.
        replacement (bool): ``True`` draws episodes in proportion to their length;
            ``False`` deals every episode once per epoch. Defaults to ``True``.
        only_complete (bool): draw only episodes whose last step is stored; ``False``
            also draws the one being written (continuing tasks). Defaults to ``True``.
        generator (torch.Generator, optional): source of randomness. Defaults to the
            replay buffer's generator when it has one, else a CPU generator seeded from
            torch's global RNG.
        seed (int, optional): seeds a CPU generator of the sampler's own, in ``[0, 2**64)``:
            ``seed=k`` draws exactly as ``generator=torch.Generator().manual_seed(k)``,
            and only an int has to reach a process that builds its sampler (a learner
            rank). Exclusive with ``generator``. Defaults to ``None``.
        episode_key (NestedKey, optional): where to write episode ids. Defaults to ``None``.
        step_key (NestedKey, optional): where to write steps-in-episode. Defaults to ``None``.
        mask_key (NestedKey): padding mask key (``replacement=False`` only). Defaults to
            ``("collector", "mask")``, as TorchRL's slice samplers.

    Raises:
        TypeError: ``num_streams`` / ``seq_len`` not integers (``int``, numpy integers; a
            ``bool`` is refused), non-bool ``end_key`` flags, ``generator`` not a
            ``torch.Generator``, ``seed`` not an integer; a storage that does not read as
            one TensorDict of steps (a ``ListStorage``: use ``LazyTensorStorage`` or
            ``LazyMemmapStorage``; tensors written instead of TensorDicts).
        ValueError: ``num_streams`` / ``seq_len`` < 1; ``seed`` outside ``[0, 2**64)`` or
            given with ``generator``; a batch size other than
            ``num_streams * seq_len``; a buffer with ``prefetch > 1``; a storage that is
            not one-dimensional (at its first write), lacks
            ``end_key`` (or ``traj_key``), or holds no eligible episode (also the case when
            an episode is longer than the storage); a state dict for other sizes; steps
            written into the storage without ``rb.extend`` / ``rb.add`` (by the buffer's
            writer, or by another buffer's after the first sample).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_seqchunk import StreamChunkSampler
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     sampler=StreamChunkSampler(1, 4, seed=0),
        ...     batch_size=4,
        ... )
        >>> done = torch.tensor([0, 0, 1, 0, 0, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(8), ("next", "done"): done}, [8]))
        >>> chunk = rb.sample()
        >>> chunk.batch_size
        torch.Size([1, 4])
        >>> chunk["is_first"].shape, chunk["is_first"].dtype
        (torch.Size([1, 4, 1]), torch.bool)
        >>> first = chunk["obs"][0, 0].item()
        >>> first in (0, 3)  # every chunk row starts where an episode starts
        True
    """

    def __init__(
        self,
        num_streams: int,
        seq_len: int,
        *,
        end_key: NestedKey = ("next", "done"),
        traj_key: NestedKey | None = None,
        is_first_key: NestedKey = "is_first",
        replacement: bool = True,
        only_complete: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        episode_key: NestedKey | None = None,
        step_key: NestedKey | None = None,
        mask_key: NestedKey = ("collector", "mask"),
    ):
        for name, value in (("num_streams", num_streams), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(
                    f"{name} must be an int >= 1, got {value!r} ({type(value).__name__})."
                )
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}; pass a positive number.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}; "
                "pass torch.Generator().manual_seed(seed)."
            )
        if seed is not None:
            if generator is not None:
                raise ValueError(
                    f"pass either seed= or generator=, not both; got seed={seed!r} and "
                    f"generator={generator!r}. Drop one of them."
                )
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise TypeError(
                    f"seed must be an int in [0, 2**64), got {seed!r} ({type(seed).__name__})."
                )
            if not 0 <= seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64), got {seed}; pass a seed in range.")
            generator = torch.Generator().manual_seed(int(seed))
        self.num_streams, self.seq_len = int(num_streams), int(seq_len)
        self.end_key, self.traj_key, self.is_first_key = end_key, traj_key, is_first_key
        self.replacement, self.only_complete = bool(replacement), bool(only_complete)
        self.episode_key, self.step_key, self.mask_key = episode_key, step_key, mask_key
        self._generator = generator
        self._lock = threading.RLock()  # a ChunkPrefetcher samples in its own thread
        self._empty()
        self._writes_base["own"] = 0  # built with its buffer: it sees that writer's writes

    # ----------------------------------------------------------------- replay-buffer hooks
    def add(self, index: int | None) -> None:
        if index is not None:  # None: the writer kept nothing (TensorDictMaxValueWriter)
            self._record(index)

    def extend(self, index: torch.Tensor) -> None:
        self._record(index)

    def _record(self, index) -> None:
        if isinstance(index, tuple) or torch.as_tensor(index).dim() > 1:
            raise ValueError(
                "StreamChunkSampler needs a one-dimensional storage, got a multi-dimensional "
                "write index (a storage built with ndim=2, [envs, time]); build the storage "
                "with ndim=1 and write collector batches flat, rb.extend(batch.reshape(-1)), "
                "with traj_key=('collector', 'traj_ids')."
            )
        with self._lock:
            self._record_locked(torch.as_tensor(index))

    def _record_locked(self, index: torch.Tensor) -> None:
        self._log.record(index)
        if not self.replacement and any(stream.unread for stream in self._streams):
            for stream in self._streams:  # the epoch ends if the write leaves nothing to read
                stream.drop_stale(self._log.stamps)
            if not any(stream.unread for stream in self._streams):
                self._ran_out, self._remaining_batches = True, 0

    def _empty(self) -> None:
        self._log = _WriteLog()
        # write counts that need no hook call: of the own buffer's writer (its count minus
        # the clock) and of other buffers' writers on the storage; None: taken at next sync
        self._writes_base = {"own": None, "others": None}
        self._tracker = _EpisodeTracker(self.end_key, self.traj_key, self.only_complete)
        self._streams = [_Stream() for _ in range(self.num_streams)]
        self._ran_out = False
        self._remaining_batches = torch.iinfo(torch.int64).max if self.replacement else 0
        self._prefetch_thread = None  # the worker thread of the prefetcher drawing ahead
        self._undelivered = collections.deque()  # stream state before each chunk a
        # ChunkPrefetcher drew but has not delivered yet, oldest first

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = value

    @property
    def generator(self) -> torch.Generator:
        """The generator in use (see ``generator`` in the class docstring)."""
        if self._generator is None:
            if self._rng is not None:
                self._generator = self._rng
            else:
                seed = int(torch.randint(2**62, (1,)))
                self._generator = torch.Generator().manual_seed(seed)
        return self._generator

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        self._sync(storage)
        return len(self._tracker) > 0

    # ---------------------------------------------------------------------------- sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        B, T = self.num_streams, self.seq_len
        if batch_size != B * T:
            raise ValueError(
                f"batch_size must be num_streams * seq_len = {B} * {T} = {B * T}, got "
                f"{batch_size}; build the replay buffer with batch_size={B * T}."
            )
        check_buffers(self, storage)
        with self._lock:
            self._sync(storage)
            if not len(self._tracker):
                raise ValueError(
                    f"StreamChunkSampler found no {'complete ' if self.only_complete else ''}"
                    f"episode in the storage: it holds {len(storage)} step(s) of capacity "
                    f"{storage.max_size} and no whole episode ends in it "
                    f"({self._end_rule(storage)}). Write whole episodes before sampling, or "
                    "pass only_complete=False to draw the episode still being written; an "
                    "episode longer than the storage capacity can never be stored whole, so "
                    "raise the capacity."
                )
            prefetcher = getattr(_prefetching, "samplers", None)
            if prefetcher is not None:  # drawn ahead: keep the state to go back to
                self._check_prefetcher()
                self._undelivered.append(self._stream_state())
                self._prefetch_thread = threading.get_ident()
                prefetcher.append(self)
            if self.replacement:
                for stream in self._streams:
                    while stream.unread < T:
                        episode, slots = self._tracker.draw(self.generator)
                        stream.push(_Segment(slots, episode, 0, self._log.clock))
            elif all(stream.unread == 0 for stream in self._streams):
                self._deal_epoch()
            rows = [stream.take(min(T, stream.unread)) for stream in self._streams]
            return self._chunk(rows)

    def _check_prefetcher(self) -> None:
        """Refuses a draw by a closed prefetcher's worker still inside its source call, and
        a draw by a second prefetcher while another holds undelivered chunks: either would
        take chunks out of the streams behind the back of whoever samples next."""
        if _prefetching.stop.is_set():
            raise RuntimeError(
                "the ChunkPrefetcher drawing from this StreamChunkSampler was closed; its "
                "worker draws nothing more (its chunks were taken back at close)."
            )
        if self._undelivered and self._prefetch_thread != threading.get_ident():
            raise ValueError(
                "a second ChunkPrefetcher draws from this StreamChunkSampler while another "
                "holds chunks it has not delivered; the two would share the streams out of "
                "order. Use one prefetcher per sampler (close the first before starting "
                "another), or one buffer and sampler per consumer."
            )

    def _delivered(self) -> None:
        """A :class:`~torchrl_seqchunk.ChunkPrefetcher` handed over the oldest chunk it drew."""
        self._undelivered.popleft()

    def _rewind(self) -> None:
        """Takes back the chunks a closed prefetcher drew but never delivered: the streams
        and generator go back to where they stood before the first of them, so the next
        sample emits it again (minus steps overwritten since). Writes are kept."""
        with self._lock:
            if self._undelivered:
                self._load_stream_state(self._undelivered[0])
                self._undelivered.clear()

    def _end_rule(self, storage: Storage) -> str:
        """How episodes end here, said as the condition that never held."""
        if self.traj_key is None or (
            len(storage) and storage[:].get(self.end_key, default=None) is not None
        ):
            return f"{self.end_key!r} is never True at the end of a whole episode"
        return (
            f"{self.traj_key!r} never changes after a whole episode (no {self.end_key!r} is "
            "stored, so an episode ends where the trajectory id changes)"
        )

    def _sync(self, storage: Storage) -> None:
        """Reads the steps written since the last call; cuts queued steps overwritten since."""
        if storage.ndim != 1:
            raise ValueError(
                f"StreamChunkSampler needs a one-dimensional storage, got ndim={storage.ndim}; "
                "build the storage with ndim=1 and extend it with steps in time order."
            )
        check_writes_seen(self, storage)
        newest = newest_unrecorded(self, storage)  # not None: a ring wrapped before we saw it
        slots, stamps = self._log.take_pending(len(storage), newest)
        if not slots.numel():
            return
        try:
            self._read_writes(storage, slots, stamps, after_loss=newest is not None)
        except Exception:  # the writes stay pending: a retry raises the same error
            self._log.put_back(slots, stamps)
            raise
        for stream in self._streams:
            stream.drop_stale(self._log.stamps)

    def _read_writes(
        self, storage: Storage, slots: torch.Tensor, stamps: torch.Tensor, *, after_loss: bool
    ) -> None:
        """Reads the steps at ``slots`` (write order); ``after_loss``: the step written just
        before the first of them was overwritten unread."""
        data = storage[:]
        if not isinstance(data, TensorDictBase):
            fix = (
                "extend the buffer with TensorDicts of steps, e.g. "
                "rb.extend(TensorDict({'observation': obs, ('next', 'done'): done}, [N]))"
                if isinstance(storage, TensorStorage)
                else f"a {type(storage).__name__} keeps every written item apart; build the "
                "buffer with LazyTensorStorage(capacity) or LazyMemmapStorage(capacity), "
                "which stack the steps"
            )
            raise TypeError(
                f"StreamChunkSampler reads its storage as one TensorDict of steps [N], but "
                f"{type(storage).__name__}[:] gives a {type(data).__name__}: {fix}."
            )
        if data.batch_dims != 1:
            raise ValueError(
                f"StreamChunkSampler needs one step per storage slot, got entries of batch "
                f"shape {list(data.shape[1:])}; write collector batches [num_envs, T] flat, "
                "rb.extend(batch.reshape(-1)), with traj_key=('collector', 'traj_ids') so that "
                "the envs' episodes stay apart."
            )
        alive = self._log.stamps[slots] == stamps
        self._tracker.update(data, slots, stamps, alive, after_loss)

    def _deal_epoch(self) -> None:
        """Deals every episode once: longest first to the least-filled stream (Graham's LPT
        rule, ties in random order), then each stream's episodes in random order."""
        episodes = self._tracker.all()
        shuffled = [episodes[e] for e in torch.randperm(len(episodes), generator=self.generator)]
        dealt = [[] for _ in self._streams]
        loads = [(0, b) for b in range(self.num_streams)]
        for episode in sorted(shuffled, key=lambda e: -e[1].numel()):
            load, b = heapq.heappop(loads)
            dealt[b].append(episode)
            heapq.heappush(loads, (load + episode[1].numel(), b))
        for stream, own in zip(self._streams, dealt):
            for e in torch.randperm(len(own), generator=self.generator).tolist():
                stream.push(_Segment(own[e][1], own[e][0], 0, self._log.clock))
        longest = max(stream.unread for stream in self._streams)
        self._remaining_batches = -(-longest // self.seq_len)
        self._ran_out = False

    def _chunk(self, rows: list[list[_Segment]]) -> tuple[torch.Tensor, dict]:
        B, T = self.num_streams, self.seq_len
        pad_slot = int(next(piece.slots[0] for row in rows for piece in row))
        slots, steps, episodes = [], [], []  # steps: step-in-episode, -1 on padding
        for row in rows:
            for piece in row:
                slots.append(piece.slots)
                steps += range(piece.offset, piece.offset + piece.slots.numel())
                episodes += [piece.episode] * piece.slots.numel()
            missing = T - sum(piece.slots.numel() for piece in row)
            if missing:  # replacement=False only: the stream's epoch is over
                slots.append(torch.full((missing,), pad_slot))
                steps += [-1] * missing
                episodes += [-1] * missing
        index = torch.cat(slots).view(B, T)
        step = torch.tensor(steps).view(B, T)
        info = {self.is_first_key: (step <= 0).unsqueeze(-1)}
        if self.episode_key is not None:
            info[self.episode_key] = torch.tensor(episodes).view(B, T)
        if self.step_key is not None:
            info[self.step_key] = step
        if not self.replacement:
            info[self.mask_key] = step >= 0
            self._remaining_batches -= 1
            self._ran_out = all(stream.unread == 0 for stream in self._streams)
        return index, info

    # ------------------------------------------------------------------------------- state
    def _stream_state(self) -> dict[str, Any]:
        """The stream queues and generator: what a sample changes besides reading writes."""
        segments = [(b, seg) for b, s in enumerate(self._streams) for seg in s.segments]
        return {
            "generator": self.generator.get_state(),
            "segment_stream": _as_long([b for b, _ in segments]),
            "segment_length": _as_long([seg.slots.numel() for _, seg in segments]),
            "segment_episode": _as_long([seg.episode for _, seg in segments]),
            "segment_offset": _as_long([seg.offset for _, seg in segments]),
            "segment_queued_at": _as_long([seg.queued_at for _, seg in segments]),
            "segment_slots": torch.cat([seg.slots for _, seg in segments] or [_as_long([])]),
            "ran_out": self._ran_out,
            "remaining_batches": self._remaining_batches,
        }

    def _load_stream_state(self, state: dict[str, Any]) -> None:
        self._streams = [_Stream() for _ in range(self.num_streams)]
        self.generator.set_state(state["generator"])
        slots = state["segment_slots"].split(state["segment_length"].tolist())
        fields = zip(
            state["segment_stream"].tolist(),
            slots,
            state["segment_episode"].tolist(),
            state["segment_offset"].tolist(),
            state["segment_queued_at"].tolist(),
        )
        for b, seg_slots, episode, offset, queued_at in fields:
            self._streams[b].push(_Segment(seg_slots.clone(), episode, offset, queued_at))
        self._ran_out = state["ran_out"]
        self._remaining_batches = state["remaining_batches"]

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state. While a :class:`~torchrl_seqchunk.ChunkPrefetcher` runs, the
        streams are saved as they stood after the last chunk it delivered, so a resumed run
        emits next the chunks it had drawn but not delivered."""
        with self._lock:
            streams = self._undelivered[0] if self._undelivered else self._stream_state()
            return {
                "num_streams": self.num_streams,
                "seq_len": self.seq_len,
                "log": self._log.state(),
                "episodes": self._tracker.state(),
                **streams,
            }

    def _check_sizes(self, state_dict: dict[str, Any]) -> None:
        """Raises if ``state_dict`` is of a sampler of other sizes (before anything loads)."""
        sizes = (state_dict["num_streams"], state_dict["seq_len"])
        if sizes != (self.num_streams, self.seq_len):
            raise ValueError(
                f"state_dict is for (num_streams, seq_len) = {sizes}, this sampler has "
                f"{(self.num_streams, self.seq_len)}; build the sampler with the saved sizes."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_sizes(state_dict)
        with self._lock:
            self._empty()
            self._log.load(state_dict["log"])
            self._tracker.load(state_dict["episodes"])
            self._load_stream_state(state_dict)

    def dumps(self, path) -> None:
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "stream_chunk_sampler.pt")

    @staticmethod
    def _read(path) -> dict[str, Any]:
        """The state :meth:`dumps` wrote into the folder ``path``."""
        return torch.load(Path(path).absolute() / "stream_chunk_sampler.pt")

    def loads(self, path) -> None:
        self.load_state_dict(self._read(path))

    _SETTINGS = (
        "num_streams", "seq_len", "end_key", "traj_key", "is_first_key", "replacement",
        "only_complete", "episode_key", "step_key", "mask_key",
    )

    def __getstate__(self) -> dict[str, Any]:
        """The settings and :meth:`state_dict`, every tensor as a NumPy array.

        A pickled sampler (``pickle``, ``copy.deepcopy``, a process started with spawn) is
        an independent copy: its own stream queues, write stamps and clock (kept together)
        and generator state. Arrays are pickled by value, so torch.multiprocessing never
        moves the owner's stamps to shared memory (``rb.share()`` and a spawned process
        leave them local). The copy does not see the owner's writes, nor the owner the
        copy's: a buffer written in another process raises at the owner's next sample.
        """
        with self._lock:
            state = {name: getattr(self, name) for name in self._SETTINGS}
            state["generator_device"] = str(self.generator.device)
            state["state_dict"] = _tensors_as(self.state_dict(), lambda t: t.numpy())
            return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        saved = _tensors_as(state.pop("state_dict"), torch.from_numpy)
        self._generator = torch.Generator(state.pop("generator_device"))
        self.__dict__.update(state)
        self._rng = None
        self._lock = threading.RLock()
        self.load_state_dict(saved)  # the writes base is taken again at the next sync

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_streams={self.num_streams}, seq_len={self.seq_len}, "
            f"replacement={self.replacement}, end_key={self.end_key!r}, traj_key={self.traj_key!r})"
        )
