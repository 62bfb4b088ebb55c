"""Background preparation of chunks, strictly in order."""
from __future__ import annotations

import inspect
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable

import torch

from .sampler import _prefetching

__all__ = ["ChunkPrefetcher"]

_DONE = object()  # the source is exhausted


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def _work(next_chunk, out: queue.Queue, stop: threading.Event, pin_memory, device, drawn) -> None:
    """The worker loop. It holds no reference to its :class:`ChunkPrefetcher`, so a
    prefetcher dropped without :meth:`~ChunkPrefetcher.close` is collected and stops it.
    Each chunk travels with the list of the samplers that drew it; ``drawn`` collects
    them all, to take back what was never delivered when the prefetcher is closed or
    dropped."""

    def put(item) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    _prefetching.stop = stop  # a sampler refuses draws once the prefetcher is closed
    try:
        while not stop.is_set():
            samplers = _prefetching.samplers = []
            try:
                chunk = next_chunk()
            except StopIteration:
                put(_DONE)
                return
            finally:
                _prefetching.samplers = None
                drawn.update((id(sampler), sampler) for sampler in samplers)
            if pin_memory:
                chunk = chunk.pin_memory()
            if device is not None:
                chunk = chunk.to(device, non_blocking=True)
            put((chunk, samplers))
    except BaseException as error:  # handed to the consumer
        put(_Failure(error))
    finally:
        if stop.is_set():  # closed or dropped: nothing queued will be delivered
            _take_back(drawn)


def _take_back(drawn: dict) -> None:
    for sampler in drawn.values():
        sampler._rewind()


class ChunkPrefetcher:
    """Prepares chunks in one background thread and hands them over in order.

    One worker thread pulls chunks from ``source`` (a zero-argument callable such as
    ``rb.sample``, or an iterable such as a replay buffer), optionally pins them and
    copies them to ``device``, and puts them in a queue of at most ``depth`` chunks. A
    single worker keeps the order: chunk ``k`` is always delivered before chunk ``k + 1``,
    whatever ``depth``, which a stateful sampler such as
    :class:`~torchrl_seqchunk.StreamChunkSampler` needs (a replay buffer's
    ``prefetch > 1`` runs samples in several threads and may reorder them).

    Iterating yields the chunks (TensorDicts, or whatever ``source`` returns; ``.to`` and
    ``.pin_memory`` are used when a device is given). The iteration ends when an iterable
    source is exhausted; a callable source never ends. An exception raised in the worker
    is re-raised, with the worker's traceback, by the next ``next()`` in the consumer.
    :meth:`close` (also on leaving a ``with`` block) stops and joins the thread and ends
    the iteration, also for a consumer waiting in another thread, within a bounded time
    (a source call that blocks is left behind with a warning); a prefetcher dropped
    without it stops its thread when garbage-collected.

    The worker runs up to ``depth + 1`` chunks ahead of the consumer. A
    :class:`~torchrl_seqchunk.StreamChunkSampler` that drew chunks for it (through
    ``rb.sample``, ``rb`` or any callable calling them in the worker thread) keeps its
    stream state from before each chunk not yet delivered: :meth:`close` puts the sampler
    back where it stood after the last delivered chunk, so the next consumer (another
    prefetcher or a plain ``rb.sample()``) gets the undelivered chunks first and every
    stream continues the last chunk consumed (steps overwritten meanwhile are dropped as
    usual); its ``state_dict`` saved while the prefetcher runs is that state too. Chunks of
    other sources that were prepared but not delivered are dropped on close.

    Args:
        source (callable or iterable): where chunks come from.

    Keyword Args:
        depth (int): most chunks prepared ahead (>= 1). Defaults to ``2``.
        device (torch.device or str, optional): device the chunks are moved to, with
            ``non_blocking=True``. Defaults to ``None`` (left where they are).
        pin_memory (bool, optional): pin chunks in page-locked memory before the copy.
            Defaults to ``None``: pin when ``device`` is a CUDA device.

    Raises:
        TypeError: ``source`` is neither callable nor iterable, or is a generator
            function (pass the generator it returns); ``depth`` not an int.
        ValueError: ``depth`` < 1; a CUDA ``device`` without CUDA; ``pin_memory=True``
            without an accelerator.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_seqchunk import ChunkPrefetcher, StreamChunkSampler
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100), sampler=StreamChunkSampler(2, 3), batch_size=6
        ... )
        >>> done = (torch.arange(20) % 5 == 4).unsqueeze(-1)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(20), ("next", "done"): done}, [20]))
        >>> with ChunkPrefetcher(rb.sample, depth=2) as chunks:
        ...     for _, chunk in zip(range(3), chunks):
        ...         print(chunk.batch_size)
        torch.Size([2, 3])
        torch.Size([2, 3])
        torch.Size([2, 3])
    """

    def __init__(
        self,
        source: Callable | Iterable,
        *,
        depth: int = 2,
        device: torch.device | str | None = None,
        pin_memory: bool | None = None,
    ):
        if inspect.isgeneratorfunction(source):
            raise TypeError(
                f"source is a generator function ({source.__name__}), whose calls return "
                f"generators, not chunks; pass the generator itself, e.g. "
                f"source={source.__name__}()."
            )
        if callable(source):
            next_chunk = source
        elif isinstance(source, Iterable):
            next_chunk = iter(source).__next__
        else:
            raise TypeError(
                f"source must be a callable (e.g. rb.sample) or an iterable, got "
                f"{type(source).__name__}."
            )
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int >= 1, got {depth!r}.")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}; pass depth=2 for double buffering.")
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} but CUDA is not available here; pass device=None or 'cpu' "
                "(or run where a CUDA device is)."
            )
        on_cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = on_cuda if pin_memory is None else bool(pin_memory)
        if self.pin_memory and not torch.accelerator.is_available():
            raise ValueError(
                f"pin_memory=True (given {pin_memory!r}, device {device!r}) needs an "
                "accelerator to pin memory for, and none is available; pass a CPU device or "
                "none, and pin_memory=False or None."
            )
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._drawn = {}  # id -> every StreamChunkSampler that drew a chunk for the worker
        self._thread = threading.Thread(
            target=_work,
            args=(next_chunk, self._queue, self._stop, self.pin_memory, self.device, self._drawn),
            name="ChunkPrefetcher",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _DONE or isinstance(item, _Failure):
            self._finished = True
            self.close()
            if isinstance(item, _Failure):
                raise item.error
            raise StopIteration
        chunk, samplers = item
        for sampler in samplers:
            sampler._delivered()
        return chunk

    def close(self, timeout: float = 5.0) -> None:
        """Stops the worker and joins it; the samplers that drew chunks still queued take
        them back (see the class docstring), other sources' are dropped.

        Args:
            timeout (float): seconds to wait for a worker stuck in a source call (one
                that blocks, e.g. on a queue no longer fed). Past it, ``close`` returns
                with a warning and leaves the daemon thread to end when that call
                returns (its sampler's chunks are then taken back). Defaults to ``5.0``.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:  # unblocks a worker waiting to queue a chunk
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        if self._thread.is_alive():
            warnings.warn(
                f"ChunkPrefetcher.close: the worker is still inside a source call after "
                f"{timeout} s (the source blocks); it is left running as a daemon thread and "
                "ends when that call returns, dropping its chunk (a StreamChunkSampler took "
                "its chunks back now and refuses that worker's further draws). Unblock the "
                "source, or pass a longer timeout.",
                stacklevel=2,
            )
        _take_back(self._drawn)  # also when the worker ended first (source exhausted, error)
        self._drawn.clear()  # a worker ending later has nothing left to take back
        self._finished = True
        with self._queue.mutex:  # one step, so a put still in flight cannot land in between
            self._queue.queue.clear()  # nothing prepared is delivered any more
            self._queue.queue.append(_DONE)  # wakes a consumer waiting in another thread
            self._queue.not_empty.notify()

    def __enter__(self) -> ChunkPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_thread", None) is not None:
            self._stop.set()
