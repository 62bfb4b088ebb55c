"""Background preparation of chunks, strictly in order, each with the sampler's state after it."""
from __future__ import annotations

import inspect
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable

import torch
from torchrl.data import ReplayBuffer

from .._checks import check_int
from .sampler import StreamChunkSampler

__all__ = ["ChunkPrefetcher"]

_DONE = object()  # the source is exhausted

# sampler -> stop event of the prefetcher drawing from it: one prefetcher per sampler. The
# registry belongs to this module; the sampler knows nothing of it.
_drawing: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class _Delivered:
    """The sampler's stream state after the last chunk delivered, put back once on close."""

    def __init__(self, sampler: StreamChunkSampler | None):
        self.sampler, self.lock = sampler, threading.Lock()
        self.state = None if sampler is None else sampler.stream_state()

    def put_back(self) -> None:
        with self.lock:
            if self.sampler is not None:
                self.sampler.load_stream_state(self.state)
                self.sampler = None  # once: a worker ending later changes nothing


def _sampler_of(source) -> StreamChunkSampler | None:
    """The :class:`StreamChunkSampler` of a replay buffer ``source``: ``rb``, ``rb.sample``,
    or an object with a ``buffer`` (such as :class:`~torchrl_seqchunk.EvenEpochs`)."""
    for candidate in (source, getattr(source, "__self__", None), getattr(source, "buffer", None)):
        if isinstance(candidate, ReplayBuffer):
            sampler = getattr(candidate, "sampler", None)  # none here: a RayReplayBuffer's is remote
            return sampler if isinstance(sampler, StreamChunkSampler) else None
    return None


def _work(next_chunk, out: queue.Queue, stop: threading.Event, pin_memory, device,
          sampler, delivered: _Delivered) -> None:
    """The worker loop: queues ``(chunk, the sampler's stream state after it)``. It holds no
    reference to its :class:`ChunkPrefetcher`, so a prefetcher dropped without
    :meth:`~ChunkPrefetcher.close` is collected and stops it."""

    def put(item) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    try:
        while not stop.is_set():
            try:
                chunk = next_chunk()
            except StopIteration:
                put(_DONE)
                return
            state = None if sampler is None else sampler.stream_state()
            moves = ("pin_memory",) * bool(pin_memory) + ("to",) * (device is not None)
            if any(not callable(getattr(chunk, name, None)) for name in moves):
                raise TypeError(
                    f"the source returned a {type(chunk).__name__}, which has no {' or '.join(moves)}; with "
                    "device= or pin_memory a chunk must be a Tensor, a TensorDict or a tensorclass (wrap "
                    "the parts in one TensorDict)."
                )
            if pin_memory:
                chunk = chunk.pin_memory()
            if device is not None:
                chunk = chunk.to(device, non_blocking=True)
            put((chunk, state))
    except BaseException as error:  # handed to the consumer
        put(_Failure(error))
    finally:
        if stop.is_set():  # closed or dropped: nothing queued will be delivered
            delivered.put_back()


class ChunkPrefetcher:
    """Prepares chunks in one background thread and hands them over in order.

    One worker thread pulls chunks from ``source`` (a zero-argument callable such as
    ``rb.sample``, or an iterable such as a replay buffer), optionally pins them and copies
    them to ``device``, and queues at most ``depth`` of them, each with the
    :class:`~torchrl_seqchunk.StreamChunkSampler`'s :meth:`~StreamChunkSampler.stream_state`
    after it (as DreamerV3's prefetching stream does). One worker keeps the order, which a
    stateful sampler needs (a buffer's ``prefetch > 1`` may reorder samples).

    :meth:`close` (also on leaving a ``with`` block, or when a dropped prefetcher is
    collected) stops the worker and puts the sampler back at the state of the last
    delivered chunk (through :meth:`~StreamChunkSampler.load_stream_state`, which drops
    the steps overwritten since): the next consumer gets the undelivered chunks first.
    :meth:`state_dict` is the sampler's state as of that chunk, for checkpoints taken
    while prefetching. An exception raised in the worker is re-raised by the next
    ``next()``; an iterable source ends the iteration when exhausted.

    .. note:: One prefetcher per sampler: the sampler of a second one is refused until
        the first is closed (the registry lives in this module; the sampler knows nothing
        of prefetchers).

    .. note:: A source call that blocks past :meth:`close`'s ``timeout`` is left behind
        with a warning; a chunk it still draws from the sampler afterwards is lost to the
        streams.

    Args:
        source (callable or iterable): where chunks come from.

    Keyword Args:
        depth (int): most chunks prepared ahead (>= 1). Defaults to ``2``.
        device (torch.device or str, optional): device the chunks are moved to, with
            ``non_blocking=True``. Defaults to ``None`` (left where they are).
        pin_memory (bool, optional): pin chunks in page-locked memory before the copy.
            Defaults to ``None``: pin when ``device`` is a CUDA device.
        sampler (StreamChunkSampler, optional): the sampler whose state travels with the
            chunks. Defaults to the sampler of a replay buffer ``source`` (``rb``,
            ``rb.sample``, or an object with a ``buffer`` such as
            :class:`~torchrl_seqchunk.EvenEpochs`); pass it for other callables drawing
            from one. Without one, undelivered chunks are dropped on close.

    Raises:
        TypeError: ``source`` neither callable nor iterable, or a generator function
            (pass the generator it returns); ``depth`` not an int; ``sampler`` not a
            :class:`~torchrl_seqchunk.StreamChunkSampler`.
        ValueError: ``depth`` < 1; a ``device`` this process cannot use (CUDA or MPS absent); ``pin_memory=True``
            without an accelerator; a sampler another open prefetcher draws from.

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
        sampler: StreamChunkSampler | None = None,
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
        depth = check_int("depth", depth, low=1)
        if sampler is not None and not isinstance(sampler, StreamChunkSampler):
            raise TypeError(
                f"sampler must be a StreamChunkSampler or None, got {type(sampler).__name__}."
            )
        sampler = _sampler_of(source) if sampler is None else sampler
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type != "cpu":
            try:  # here, not at the first chunk: a device this process cannot use (mps, cuda:7)
                torch.empty(0, device=self.device)
            except (RuntimeError, AssertionError) as error:
                raise ValueError(
                    f"device={device!r} but {self.device.type.upper()} is not available here "
                    f"({type(error).__name__}: {str(error)[:200]}); pass device=None or 'cpu' (or run where "
                    "that device is)."
                ) from None
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
        self.sampler = sampler
        if sampler is not None:
            other = _drawing.get(sampler)
            if other is not None and not other.is_set():
                raise ValueError(
                    "a second ChunkPrefetcher draws from this StreamChunkSampler while another "
                    "is open; the two would share the streams out of order. Use one "
                    "prefetcher per sampler (close the first before starting another), or one "
                    "buffer and sampler per consumer."
                )
            _drawing[sampler] = self._stop
        self._delivered = _Delivered(sampler)
        self._thread = threading.Thread(
            target=_work,
            args=(next_chunk, self._queue, self._stop, self.pin_memory, self.device, sampler,
                  self._delivered),
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
        chunk, self._delivered.state = item
        return chunk

    def state_dict(self) -> dict:
        """The sampler's :meth:`~StreamChunkSampler.state_dict` as of the last delivered
        chunk (its ``"streams"`` from then, writes and episodes as now): a run loading it
        continues after the last chunk consumed.

        Raises:
            ValueError: no :class:`~torchrl_seqchunk.StreamChunkSampler` travels with
                the chunks (pass ``sampler=``).
        """
        if self.sampler is None:
            raise ValueError(
                "this ChunkPrefetcher carries no StreamChunkSampler state; build it with "
                "sampler=rb.sampler (or source=rb.sample) to checkpoint while prefetching."
            )
        state = self.sampler.state_dict()
        state["streams"] = self._delivered.state
        return state

    def close(self, timeout: float = 5.0) -> None:
        """Stops the worker, joins it and puts the sampler back at the state of the last
        delivered chunk (see the class docstring); other sources' queued chunks are dropped.

        Args:
            timeout (float): seconds to wait for a worker stuck in a source call (one
                that blocks, e.g. on a queue no longer fed). Past it, ``close`` returns
                with a warning and leaves the daemon thread to end when that call
                returns. Defaults to ``5.0``.
        """
        self._stop.set()
        if threading.current_thread() is self._thread:  # collected in its own worker (a reference
            return  # cycle): the worker puts the sampler back as it ends, having seen the stop
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
                "ends when that call returns, dropping its chunk (the sampler was put back at "
                "the last delivered chunk now; a chunk that call still draws from it is lost "
                "to the streams). Unblock the source, or pass a longer timeout.",
                stacklevel=2,
            )
        self._delivered.put_back()  # also when the worker ended first (exhausted, error)
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
        # a dropped prefetcher closes as close() does: its worker ends the source call it is in
        # before the sampler is put back (and is free for the next consumer), also when the
        # worker had ended first
        if getattr(self, "_thread", None) is not None:
            self.close()
