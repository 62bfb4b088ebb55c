"""Ingest: a learner's buffer fed from any TorchRL collector by a thread of the learner process."""
from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterable

from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from .._checks import check_int, check_real

__all__ = ["IngestThread"]


_MASK = ("collector", "mask")  # False on the padding of a collector with split_trajs=True


def _seconds(name: str, value) -> float:
    """``value`` as seconds to wait: a finite number in ``[0, threading.TIMEOUT_MAX]``."""
    try:
        return check_real(name, value, low=0.0, high=threading.TIMEOUT_MAX)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error} Pass seconds to wait (None, where allowed: no limit).") from None


class IngestThread:
    """Iterates a collector in a background thread and writes each batch into a buffer.

    Each batch (a TensorDict, e.g. ``[num_envs, T]``) goes through ``transform`` when
    given, then ``buffer.extend``: steps flat, env after env, each env's in time order
    (give the sampler ``traj_key=("collector", "traj_ids")``). A batch holding
    ``("collector", "mask")`` (``split_trajs=True``) is written without its padding.
    Free (``on_demand=False``), the thread writes as fast as the collector yields
    (off-policy replay); on demand, it collects only the batches :meth:`request`
    allowed, so the learner decides when envs step (on-policy). :meth:`wait` blocks until
    a number of batches was written and re-raises, in the learner, any exception of the
    thread (also :meth:`check` and :meth:`close`).

    .. note:: A :class:`~torchrl_seqchunk.StreamChunkSampler` must see every write, so
        write through this thread in the process that owns the buffer, not with a
        collector given ``replay_buffer=``. Shut the collector down after :meth:`close`,
        never while the thread may still iterate it.

    Args:
        collector (iterable): yields TensorDict batches; a TorchRL collector, or any
            iterable of TensorDicts.
        buffer (ReplayBuffer): the buffer written, owned by this process.

    Keyword Args:
        transform (callable, optional): ``transform(batch) -> batch`` applied in the thread
            before the write. Defaults to ``None``.
        on_demand (bool): collect only the batches :meth:`request` allows. Defaults to
            ``False``.

    Attributes:
        batches (int): batches written so far.
        frames (int): steps written so far (padding left out).

    Raises:
        TypeError: ``collector`` is not iterable, ``buffer`` is not a TorchRL replay
            buffer, ``transform`` is not callable; a batch that is not a TensorDict, or a
            ``transform`` returning anything but a TensorDict (both re-raised by
            :meth:`wait`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_seqchunk import IngestThread, StreamChunkSampler
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100), sampler=StreamChunkSampler(1, 4), batch_size=4
        ... )
        >>> done = (torch.arange(8) % 4 == 3).view(2, 4, 1)  # [num_envs, T]
        >>> batches = [TensorDict({"obs": torch.zeros(2, 4), ("next", "done"): done}, [2, 4])] * 3
        >>> with IngestThread(batches, rb, on_demand=True) as ingest:
        ...     ingest.request(2)
        ...     ingest.wait(2)
        ...     print(ingest.batches, ingest.frames, len(rb))
        2 16 16
    """

    def __init__(
        self,
        collector: Iterable[TensorDictBase],
        buffer: ReplayBuffer,
        *,
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        on_demand: bool = False,
    ):
        if not isinstance(collector, Iterable):
            raise TypeError(
                f"collector must be iterable (a TorchRL collector, or an iterable of "
                f"TensorDicts), got {type(collector).__name__}."
            )
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(
                f"buffer must be a TorchRL ReplayBuffer (e.g. TensorDictReplayBuffer), got "
                f"{type(buffer).__name__}."
            )
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}.")
        self.collector, self.buffer, self.transform = collector, buffer, transform
        self.on_demand = bool(on_demand)
        self.batches = self.frames = 0
        self._allowed = 0  # batches request() allowed (on demand)
        self._error: BaseException | None = None
        self._raised = False  # the learner has seen self._error
        self._finished = False  # the collector is exhausted, or the thread failed or stopped
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="IngestThread", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            batches = iter(self.collector)
            while self._may_collect():
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                if self._stop.is_set():  # closed while collecting: the batch is not written
                    break
                if not isinstance(batch, TensorDictBase):
                    raise TypeError(
                        f"the collector yielded a {type(batch).__name__}, not a TensorDict; "
                        "IngestThread writes TensorDict batches."
                    )
                if self.transform is not None:
                    batch = self.transform(batch)
                    if not isinstance(batch, TensorDictBase):
                        raise TypeError(
                            "transform must return a TensorDict, got "
                            f"{'None' if batch is None else type(batch).__name__}; return the "
                            "batch, also from a transform that edits it in place."
                        )
                mask = batch.get(_MASK, default=None)
                written = 0  # an empty batch writes nothing (TensorDict's reshape(-1) fails on it)
                if batch.batch_size.numel():
                    steps = batch.reshape(-1) if mask is None else batch[mask.bool()]
                    self.buffer.extend(steps)
                    written = steps.batch_size.numel()  # TensorDict's numel() is 1 for no step
                with self._changed:
                    self.batches += 1
                    self.frames += written
                    self._changed.notify_all()
        except BaseException as error:  # handed to the learner
            self._error = error
        finally:
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def _may_collect(self) -> bool:
        """Waits for a request (on demand); False once stopped."""
        with self._changed:
            while self.on_demand and self._allowed <= self.batches and not self._stop.is_set():
                self._changed.wait()
        return not self._stop.is_set()

    def request(self, batches: int = 1) -> None:
        """Allows ``batches`` more batches to be collected (``on_demand=True`` only).

        Raises:
            TypeError: ``batches`` is not an int.
            ValueError: the thread runs free (``on_demand=False``), or ``batches`` < 1.
        """
        check_int("batches", batches)
        if not self.on_demand:
            raise ValueError(
                "request() paces an IngestThread built with on_demand=True; this one "
                "collects freely (on_demand=False)."
            )
        check_int("batches", batches, low=1)
        with self._changed:
            self._allowed += batches
            self._changed.notify_all()

    def check(self) -> None:
        """Raises if the thread failed: its exception the first time, then on every later call.

        Raises:
            Exception: the thread's exception, the first time it is raised here (or by
                :meth:`wait` / :meth:`close`).
            RuntimeError: on every later call, ``the ingest thread failed earlier: <error>``
                (the exception chained as its cause): the thread writes nothing more.
        """
        error = self._error
        if error is None:
            return
        if self._raised:
            raise RuntimeError(
                f"IngestThread: the ingest thread failed earlier: {type(error).__name__}: "
                f"{error}; it writes nothing more: build a new IngestThread to go on."
            ) from error
        self._raised = True
        raise error

    def wait(self, batches: int, timeout: float | None = None) -> None:
        """Blocks until ``batches`` batches in all have been written.

        Args:
            batches (int): total batches written since the start (:attr:`batches`).
            timeout (float, optional): seconds to wait at most. Defaults to ``None`` (no
                limit).

        Raises:
            Exception: the thread's exception, re-raised here (later calls raise
                :meth:`check`'s ``RuntimeError`` naming it).
            RuntimeError: the collector ended (or the thread was closed) before
                ``batches`` batches; the thread failed earlier.
            TimeoutError: ``timeout`` passed first.
            TypeError: ``batches`` not an int; ``timeout`` neither a number nor None.
            ValueError: ``timeout`` negative, NaN, infinite or past ``threading.TIMEOUT_MAX``
                (None waits without limit).
        """
        check_int("batches", batches)
        timeout = None if timeout is None else _seconds("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self.batches < batches and not self._finished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"IngestThread: {self.batches} of {batches} batches written after "
                        f"{timeout} s; the collector is slower than that, or was never asked "
                        "(on_demand=True needs request())."
                    )
                self._changed.wait(left)
        self.check()
        if self.batches < batches:
            raise RuntimeError(
                f"IngestThread: the collector ended after {self.batches} batches, before the "
                f"{batches} waited for (its total_frames, or the thread was closed)."
            )

    def close(self, timeout: float = 10.0) -> None:
        """Stops the thread after the batch it is collecting, joins it, and re-raises its
        exception if it failed and none of :meth:`wait` / :meth:`check` did.

        Args:
            timeout (float, optional): seconds to wait for the thread (a collector batch in
                flight), ``None`` without limit. Past it, ``close`` returns with a warning and
                leaves the daemon thread to end after that batch (unwritten). Defaults to ``10.0``.

        Raises:
            Exception: the thread's exception, if it failed and no earlier call raised it.
            TypeError, ValueError: ``timeout`` neither None nor a finite number of seconds
                in ``[0, threading.TIMEOUT_MAX]``.
        """
        timeout = None if timeout is None else _seconds("timeout", timeout)
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            warnings.warn(
                f"IngestThread.close: the thread is still inside the collector after {timeout} "
                "s; it is left running as a daemon thread and ends after that batch, which it "
                "does not write. Shut the collector down only once it ended, or pass a "
                "longer timeout.",
                stacklevel=2,
            )
        if not self._raised:
            self.check()

    def __enter__(self) -> IngestThread:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batches={self.batches}, frames={self.frames}, "
            f"on_demand={self.on_demand})"
        )
