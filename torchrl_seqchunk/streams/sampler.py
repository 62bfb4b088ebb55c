"""The stream sampler: episodes concatenated into ``B`` persistent streams, cut into ``[B, T]`` chunks."""
from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import NestedKey
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from .._checks import check_int
from .episodes import _EpisodeTracker
from .queues import _Streams
from .writes import _WriteLog

__all__ = ["StreamChunkSampler"]

_STATE_KEYS = ("num_streams", "seq_len", "log", "episodes", "streams")


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

    Each stream is a queue of episodes. On every :meth:`sample`, a stream holding fewer
    than ``seq_len`` unread steps appends whole episodes until it holds at least
    ``seq_len``; then its first ``seq_len`` unread steps form row ``b`` of the chunk. With
    ``replacement=True`` an episode is drawn with probability ``len(e) / (steps of all
    eligible episodes)``; with ``replacement=False`` every episode is dealt once per epoch
    (streams balanced in length) and :attr:`ran_out` turns True with an epoch's last chunk.
    DreamerV3's replay layout (Hafner et al., 2023); the how-to page "Stream chunks" tells
    the whole story (ring buffers, collectors, epochs, state, pickling).

    Use it in a :class:`~torchrl.data.TensorDictReplayBuffer` with ``batch_size =
    num_streams * seq_len`` over a one-dimensional storage filled through ``rb.extend`` /
    ``rb.add`` (TorchRL layout). ``rb.sample()`` returns a TensorDict of batch size
    ``[B, T]`` with the stored keys plus ``is_first_key`` (bool ``[B, T, 1]``, True exactly
    where an episode starts) and the same flags under ``init_key`` (TorchRL's ``is_init``,
    which its ``LSTMModule`` / ``GRUModule`` read; a stored ``is_init`` is replaced in the
    chunk, not in the storage), ``"index"`` (long ``[B, T]``), ``episode_key`` /
    ``step_key`` (long ``[B, T]``) when given, and ``mask_key`` (bool ``[B, T]``, False on
    padding) with ``replacement=False``.

    .. note:: Steps whose slots were rewritten since their episode was queued are never
        emitted: the stream drops the rest of that episode, and its next step is an
        episode start. Write at most the capacity between two samples (a step overwritten
        before it was read is named in a warning and its episode dropped).

    .. note:: The sampler is stateful (chunk ``k + 1`` continues chunk ``k``): it refuses a
        buffer's ``prefetch > 1``, which may reorder samples (a deliberate difference from
        TorchRL's samplers); use :class:`~torchrl_seqchunk.ChunkPrefetcher`.

    Args:
        num_streams (int): number of streams ``B`` (>= 1), the first batch dim.
        seq_len (int): chunk length ``T`` (>= 1), the time (last) batch dim.

    Keyword Args:
        end_key (NestedKey): bool flag marking the last step of an episode. Defaults to
            ``("next", "done")``.
        traj_key (NestedKey, optional): trajectory id per step (e.g.
            ``("collector", "traj_ids")``), needed when writes interleave several envs.
            Defaults to ``None`` (use ``end_key`` only).
        init_key (NestedKey, optional): bool flag, where stored, marking a step that starts
            an episode (TorchRL's ``InitTracker``; every collector writes it). On a
            trajectory's first step in a write (``extend``), it says that an episode still
            open under the same trajectory id (or, without ``traj_key``, the open one) never
            ended: a collector restarted with its ids from 0, as after a checkpoint. That
            episode is cut, never joined to the new one: never drawn with
            ``only_complete=True``, drawn as it is otherwise. Flags elsewhere in a write are
            not read (a storage keeps a flag a write lacks). Chunks carry the episode-start
            flags under this key too. Defaults to ``"is_init"``; ``None`` ignores it.
        is_first_key (NestedKey): key written with the episode-start flags. Defaults to
            ``"is_first"``; ``"is_init"`` matches TorchRL's ``InitTracker``.
        replacement (bool): ``True`` draws episodes in proportion to their length;
            ``False`` deals every episode once per epoch. Defaults to ``True``.
        only_complete (bool): draw only episodes whose last step is stored; ``False``
            also draws those being written, as they are (continuing tasks; a ring wrap
            leaves their newest steps drawable). Defaults to ``True``.
        generator (torch.Generator, optional): source of randomness. Defaults to the
            replay buffer's generator when it has one, else a CPU generator seeded from
            torch's global RNG.
        seed (int, optional): as ``generator=torch.Generator().manual_seed(seed)``, in
            ``[0, 2**64)``. Exclusive with ``generator``. Defaults to ``None``.
        episode_key (NestedKey, optional): where to write episode ids. Defaults to ``None``.
        step_key (NestedKey, optional): where to write steps-in-episode. Defaults to ``None``.
        mask_key (NestedKey): padding mask key (``replacement=False`` only). Defaults to
            ``("collector", "mask")``, as TorchRL's slice samplers.

    Raises:
        TypeError: a size, ``seed`` or ``generator`` of the wrong type; non-bool
            ``end_key`` or ``init_key`` flags; a storage that does not read as one TensorDict of steps.
        ValueError: sizes < 1; ``seed`` out of range or with ``generator``; a batch size
            other than ``B * T``; a buffer with ``prefetch > 1``; a storage that is not
            one-dimensional, lacks ``end_key`` / ``traj_key`` or holds no eligible
            episode; a state of other sizes; steps written without ``rb.extend``/``rb.add``.

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
        >>> chunk.batch_size, chunk["is_first"].shape, chunk["is_first"].dtype
        (torch.Size([1, 4]), torch.Size([1, 4, 1]), torch.bool)
        >>> chunk["obs"][0, 0].item() in (0, 3)  # every chunk row starts where an episode starts
        True
    """

    def __init__(
        self,
        num_streams: int,
        seq_len: int,
        *,
        end_key: NestedKey = ("next", "done"),
        traj_key: NestedKey | None = None,
        init_key: NestedKey | None = "is_init",
        is_first_key: NestedKey = "is_first",
        replacement: bool = True,
        only_complete: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        episode_key: NestedKey | None = None,
        step_key: NestedKey | None = None,
        mask_key: NestedKey = ("collector", "mask"),
    ):
        self.num_streams = check_int("num_streams", num_streams, low=1)
        self.seq_len = check_int("seq_len", seq_len, low=1)
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
            generator = torch.Generator().manual_seed(check_int("seed", seed, low=0, high=2**64 - 1))
        self.end_key, self.traj_key, self.init_key, self.is_first_key = end_key, traj_key, init_key, is_first_key
        self.replacement, self.only_complete = bool(replacement), bool(only_complete)
        self.episode_key, self.step_key, self.mask_key = episode_key, step_key, mask_key
        self._generator = generator
        self._lock = threading.RLock()  # a ChunkPrefetcher samples in its own thread
        self._empty()
        self._log.base["own"] = 0  # built with its buffer: it sees that writer's writes

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
            self._log.record(torch.as_tensor(index))
            if not self.replacement:  # the epoch ends if the write leaves nothing to read
                self._streams.drop_stale(self._log)

    def _empty(self) -> None:
        old = getattr(self, "_log", None)  # rb.empty(): the clock goes on (see _WriteLog)
        self._log = _WriteLog(0 if old is None else old.clock)
        self._tracker = _EpisodeTracker(self.end_key, self.traj_key, self.only_complete, self.init_key)
        self._streams = _Streams(self.num_streams, self.replacement)

    @property
    def ran_out(self) -> bool:
        return self._streams.ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._streams.ran_out = value

    @property
    def remaining_batches(self) -> int:
        """Chunks left in the epoch after the last one drawn (``replacement=False``)."""
        return self._streams.remaining_batches

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
        self._check_buffers(storage)
        with self._lock:
            self._sync(storage)
            if not len(self._tracker):
                raise ValueError(
                    f"StreamChunkSampler found no {'complete ' if self.only_complete else ''}"
                    f"episode in the storage: it holds {len(storage)} step(s) of capacity "
                    f"{storage.max_size} and no whole episode ends in it "
                    f"({self._tracker.end_rule(storage)}). Write whole episodes before sampling, or "
                    "pass only_complete=False to draw the episode still being written; an "
                    "episode longer than the storage capacity can never be stored whole, so "
                    "raise the capacity."
                )
            if self.replacement:
                self._streams.fill(T, lambda n: self._tracker.draw(self.generator, n), self._log.clock)
            elif self._streams.empty():
                self._streams.deal(self._tracker.all(), T, self.generator, self._log.clock)
            return self._chunk(self._streams.take(T))

    def _check_buffers(self, storage: Storage) -> None:
        """Refuses a buffer with ``prefetch > 1`` and warns when a buffer that drops the
        sampler's info samples through it (TorchRL storages list their buffers)."""
        for buffer in getattr(storage, "_attached_entities", ()):
            if getattr(buffer, "_sampler", None) is not self:
                continue
            prefetch = getattr(buffer, "_prefetch_cap", 0)
            if prefetch > 1:
                raise ValueError(
                    f"StreamChunkSampler is sampled by a buffer with prefetch={prefetch}, whose "
                    f"{prefetch} worker threads may run two samples out of order and break the "
                    "streams (chunk k + 1 must continue chunk k). Build the buffer with "
                    "prefetch=None or 1, and prefetch with ChunkPrefetcher(rb.sample), which "
                    "keeps the order."
                )
            if not isinstance(buffer, TensorDictReplayBuffer):
                warnings.warn(
                    f"StreamChunkSampler is sampled by a {type(buffer).__name__}, which returns "
                    "the data without the sampler's info: the chunks carry no "
                    f"{self.is_first_key!r} flags. Use TensorDictReplayBuffer, or read them "
                    "from rb.sample(return_info=True)[1].",
                    stacklevel=3,
                )

    def _sync(self, storage: Storage) -> None:
        """Reads the steps written since the last call; cuts queued steps overwritten since."""
        if storage.ndim != 1:
            raise ValueError(
                f"StreamChunkSampler needs a one-dimensional storage, got ndim={storage.ndim}; "
                "build the storage with ndim=1 and extend it with steps in time order."
            )
        self._log.check_seen(storage, self)
        newest = self._log.newest_unrecorded(storage)  # not None: wrapped before we saw it
        slots, stamps, writes = self._log.take_pending(len(storage), newest)
        if not slots.numel():
            return
        try:
            self._read_writes(storage, slots, stamps, writes, after_loss=newest is not None)
        except Exception:  # the writes stay pending: a retry raises the same error
            self._log.put_back(slots, stamps, writes)
            raise
        self._streams.drop_stale(self._log)

    def _read_writes(
        self, storage: Storage, slots: torch.Tensor, stamps: torch.Tensor, writes: torch.Tensor, *,
        after_loss: bool
    ) -> None:
        """Reads the steps at ``slots`` (write order, ``writes`` the write of each); ``after_loss``:
        the step written just before the first of them was overwritten unread."""
        data = _EpisodeTracker.steps_of(storage)
        alive = self._log.stamps[slots] == stamps
        self._tracker.update(data, slots, stamps, writes, alive, after_loss)

    def _chunk(self, rows: list[list[tuple[torch.Tensor, int, int]]]) -> tuple[torch.Tensor, dict]:
        index, step, episode = _Streams.layout(rows, self.seq_len)
        info = {self.is_first_key: (step <= 0).unsqueeze(-1)}
        if self.init_key is not None:  # TorchRL's recurrent modules read their own key
            info[self.init_key] = info[self.is_first_key]
        if self.episode_key is not None:
            info[self.episode_key] = episode
        if self.step_key is not None:
            info[self.step_key] = step
        if not self.replacement:
            info[self.mask_key] = step >= 0
        return index, info

    # ------------------------------------------------------------------------------- state
    def stream_state(self) -> dict[str, Any]:
        """What a :meth:`sample` changes besides reading writes: the stream queues, the
        epoch and the generator. :meth:`state_dict` holds it as ``"streams"``; a
        :class:`~torchrl_seqchunk.ChunkPrefetcher` queues it with each chunk."""
        with self._lock:
            return {"generator": self.generator.get_state(), **self._streams.state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Puts the streams back as :meth:`stream_state` gave them, minus every step whose
        slot was written since (the stream then starts a new episode there); writes and
        episodes stay as they are now.

        Raises:
            ValueError: ``state`` is not a stream state of this sampler's ``num_streams``.
        """
        self._check_stream_state(state)
        with self._lock:
            self._load_streams(state)

    def _load_streams(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._streams.load(state)
        self._streams.drop_stale(self._log)

    def _check_stream_state(self, state: dict[str, Any]) -> None:
        if "generator" not in state:
            raise ValueError("not a StreamChunkSampler stream state: it lacks ['generator']; "
                             "pass what stream_state() (or state_dict()['streams']) returned.")
        self._streams.check_state(state)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state: sizes, ``"log"`` (write stamps), ``"episodes"`` (the
        episode index) and ``"streams"`` (:meth:`stream_state`)."""
        with self._lock:
            return {
                "num_streams": self.num_streams,
                "seq_len": self.seq_len,
                "settings": {name: getattr(self, name) for name in self._READ_AS},
                "log": self._log.state(),
                "episodes": self._tracker.state(),
                "streams": self.stream_state(),
            }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raises if :meth:`load_state_dict` would refuse ``state_dict``; changes nothing.

        Raises:
            ValueError: a state of other ``(num_streams, seq_len)``, of other
                ``replacement``, ``only_complete``, ``end_key``, ``traj_key`` or ``init_key``
                (the settings its episodes and streams were read with), or not a state of
                this class.
        """
        missing = [key for key in _STATE_KEYS if key not in state_dict]
        if missing:
            raise ValueError(
                f"not a StreamChunkSampler state_dict: it lacks {missing}; pass what "
                "state_dict() returned."
            )
        sizes = (state_dict["num_streams"], state_dict["seq_len"])
        if sizes != (self.num_streams, self.seq_len):
            raise ValueError(
                f"state_dict is for (num_streams, seq_len) = {sizes}, this sampler has "
                f"{(self.num_streams, self.seq_len)}; build the sampler with the saved sizes."
            )
        saved = state_dict.get("settings", {})  # a state saved before settings were kept: not compared
        differ = {name: (value, getattr(self, name)) for name, value in saved.items()
                  if name in self._READ_AS and value != getattr(self, name)}
        if differ:
            raise ValueError(
                "state_dict was saved by a sampler of other settings (saved, here): "
                + ", ".join(f"{name} {pair[0]!r}, {pair[1]!r}" for name, pair in differ.items())
                + "; its episodes and streams were read with the saved ones: build the sampler with them."
            )
        self._check_stream_state(state_dict["streams"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads :meth:`state_dict` (checked first); queued steps whose slots were written
        after the streams' state was taken are dropped."""
        self.check_state_dict(state_dict)
        with self._lock:
            self._empty()
            self._log.load(state_dict["log"])
            self._tracker.load(state_dict["episodes"])
            self._load_streams(state_dict["streams"])

    def dumps(self, path) -> None:
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "stream_chunk_sampler.pt")

    def loads(self, path) -> None:
        self.load_state_dict(torch.load(Path(path).absolute() / "stream_chunk_sampler.pt"))

    #: the settings that shape the saved episodes and streams, compared at load
    _READ_AS = ("end_key", "traj_key", "init_key", "replacement", "only_complete")
    _SETTINGS = (
        "num_streams", "seq_len", "end_key", "traj_key", "init_key", "is_first_key", "replacement",
        "only_complete", "episode_key", "step_key", "mask_key",
    )

    def __getstate__(self) -> dict[str, Any]:
        """The settings and :meth:`state_dict`, every tensor as a NumPy array: a pickled
        sampler is an independent copy, and its write stamps never move to shared memory."""
        with self._lock:
            state = {name: getattr(self, name) for name in self._SETTINGS}
            state["generator_device"] = str(self.generator.device)
            state["state_dict"] = _tensors_as(self.state_dict(), lambda t: t.numpy())
            return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = {"init_key": "is_init", **state}  # pickled before init_key: the default
        saved = _tensors_as(state.pop("state_dict"), torch.from_numpy)
        self._generator = torch.Generator(state.pop("generator_device"))
        self.__dict__.update(state)
        self._rng = None
        self._lock = threading.RLock()
        self._empty()
        self.load_state_dict(saved)  # the writes base is taken again at the next check

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_streams={self.num_streams}, seq_len={self.seq_len}, "
            f"replacement={self.replacement}, end_key={self.end_key!r}, traj_key={self.traj_key!r})"
        )
