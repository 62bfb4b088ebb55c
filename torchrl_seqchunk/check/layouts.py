"""How a pipeline trains: the batches it cuts from a rollout and the pass it runs over them.

A layout is what :func:`~torchrl_seqchunk.check.check_recurrence` re-runs a stored rollout
in. Three come with the library, one per way of training a recurrent policy:

* :class:`WindowLayout`: :func:`~torchrl_seqchunk.make_windows` windows, every window from
  the stored memory, as :class:`~torchrl_seqchunk.RecurrentPPOLoss` trains (any boundary mode);
* :class:`SliceLayout`: slices drawn by TorchRL's ``SliceSampler``, each from the memory stored
  at its first step, optionally after a burn-in (unrolled, not trained) or a replay transform
  such as TorchRL's ``BurnInTransform``;
* :class:`StreamLayout`: :class:`~torchrl_seqchunk.StreamChunkSampler` chunks, the network
  carrying its state from a chunk to the next (and a second pass over each chunk, as a loss's
  target or next-value pass, that must leave the carry alone).

A pipeline of one's own is a subclass of :class:`TrainingLayout`: ``batches`` yields the training
batches ``[N, L]`` in training order, built by indexing the rollout it is given (so that the
entries under ``"_check"``, each step's origin, travel with the steps), and ``train`` runs the
training pass over one of them.
"""
from __future__ import annotations

import copy
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from tensordict import TensorDictBase, unravel_key
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler
from torchrl.envs.utils import step_mdp

from .._checks import check_int
from ..ppo.slots import BOUNDARY_MODES, trained_slots
from ..ppo.windows import make_windows
from ..recurrent.module import ResetRNN
from ..streams.sampler import StreamChunkSampler
from .reference import ENV, EPISODE

__all__ = ["TrainingLayout", "WindowLayout", "SliceLayout", "StreamLayout", "TRAINED"]

TRAINED = ("_check", "trained")
"""bool ``[N, L]`` (or ``[N, L, 1]``), optional in a batch: the slots that train (the others are
unrolled and not checked: a burn-in, a dropped slot, padding)."""


@contextmanager
def _quiet():
    """TorchRL's storages log their first write at INFO: not in a check's output."""
    logger = logging.getLogger("torchrl")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


class TrainingLayout(ABC):
    """Base class: how a pipeline trains on a rollout (see the module docstring).

    Subclasses define :meth:`batches`; :meth:`train` defaults to one pass of the network in
    sequence mode; :attr:`carries` says that row ``b`` of a batch continues row ``b`` of the
    previous one (the checker then also compares the batches with one long unroll);
    :meth:`start` runs before every pass over all the batches (forget carried state there).

    Examples:
        >>> import torch
        >>> class EveryRow(TrainingLayout):  # each rollout row as one training sequence
        ...     def batches(self, rollout, memory_keys):
        ...         batch = rollout.clone(False)
        ...         batch["is_first"] = torch.zeros(*batch.shape, 1, dtype=torch.bool)
        ...         batch["is_first"][:, 0] = True  # each row from the memory stored at its first step
        ...         yield batch
        >>> EveryRow().describe()
        'EveryRow'
    """

    carries = False

    @abstractmethod
    def batches(self, rollout: TensorDictBase, memory_keys: list) -> Iterator[TensorDictBase]:
        """The training batches ``[N, L]`` (time last) cut from ``rollout`` ``[E, T]`` (which holds
        the stored memory under ``memory_keys``), in training order; each built by indexing
        ``rollout``, with :data:`TRAINED` where not every slot trains. Must give the same
        batches every call (seed any sampler)."""

    def train(self, run: Callable[..., TensorDictBase], batch: TensorDictBase) -> None:
        """The training pass over ``batch`` (a copy to write into): ``run(batch)`` runs the network
        in sequence mode and writes its outputs there; the outputs read are those in ``batch`` after
        (``run(other, main=False)``: a further pass over another TensorDict, a loss's second pass)."""
        run(batch)

    def start(self, network) -> None:
        """Called before every pass over all the batches."""

    def describe(self) -> str:
        """One line naming the layout (for the report)."""
        return type(self).__name__

    def save(self):
        """State the passes change besides the network's carried state, restored after the check."""
        return None

    def restore(self, saved) -> None:
        """Puts back what :meth:`save` returned."""


class WindowLayout(TrainingLayout):
    """Windows of :func:`~torchrl_seqchunk.make_windows`, as :class:`~torchrl_seqchunk.RecurrentPPOLoss` trains.

    Every window starts from the memory stored at its first step; a slot whose previous step
    ended an episode is a reset slot (flag ``is_first_key``). The network's recurrent module must
    take the stored memory there (``ResetRNN(reset_state_key=state_key)``; TorchRL's
    ``LSTMModule`` / ``GRUModule`` do at every ``is_init``, so pass ``is_first_key="is_init"``).

    Args:
        window (int): window length ``W`` (>= 1, at most the rollout's ``T``).
        stride (int): steps between window starts (>= 1). Default ``1``.

    Keyword Args:
        boundary_mode (str): which slots train: ``"mask"`` drops the slots after a window's
            first boundary, the other modes train every slot. Default ``"reset_continue"``.
        is_first_key (NestedKey): where the reset flags go. Default ``"is_first"``.
        windows_per_batch (int): windows per training pass (a memory bound). Default ``4096``.

    Raises:
        TypeError / ValueError: a size that is not an int >= 1, an unknown ``boundary_mode``;
            those of :func:`~torchrl_seqchunk.make_windows` when the batches are cut.

    Examples:
        >>> WindowLayout(8, boundary_mode="mask").describe()
        'windows of 8, stride 1, mask'
    """

    def __init__(self, window: int, stride: int = 1, *, boundary_mode: str = "reset_continue",
                 is_first_key="is_first", windows_per_batch: int = 4096):
        self.window = check_int("window", window, low=1)
        self.stride = check_int("stride", stride, low=1)
        if boundary_mode not in BOUNDARY_MODES:
            raise ValueError(f"boundary_mode must be one of {BOUNDARY_MODES}, got {boundary_mode!r}.")
        self.boundary_mode, self.is_first_key = boundary_mode, unravel_key(is_first_key)
        self.windows_per_batch = check_int("windows_per_batch", windows_per_batch, low=1)

    def batches(self, rollout, memory_keys):
        windows = make_windows(rollout, self.window, self.stride, memory_key=list(memory_keys),
                               is_first_key=self.is_first_key)
        flags = windows.get(self.is_first_key).reshape(windows.shape)
        windows.set(TRAINED, trained_slots(flags, self.boundary_mode))
        yield from windows.split(self.windows_per_batch, 0)

    def describe(self) -> str:
        return f"windows of {self.window}, stride {self.stride}, {self.boundary_mode}"


class SliceLayout(TrainingLayout):
    """Slices drawn by TorchRL's ``SliceSampler``, each from the memory stored at its first step.

    The rollout goes into a ``TensorDictReplayBuffer`` (one flat storage); each batch is
    ``slices_per_batch`` slices of ``burn_in + slice_len`` steps, reshaped ``[B, burn_in +
    slice_len]``. The default sampler cuts slices inside episodes (``cross_episodes=True``: inside
    env rows, across episodes) and flags each slice's first step in ``"is_init"`` (ORed with the
    stored flags), TorchRL's rule, so that ``LSTMModule`` / ``GRUModule`` start from the stored
    memory there. Then, in order: ``transform(batch)`` where given (TorchRL's ``BurnInTransform``,
    which unrolls the first ``burn_in`` steps and drops them), else the first ``burn_in`` steps are
    unrolled with the rest and not checked (R2D2's burn-in).

    Args:
        slice_len (int): steps per slice that train (>= 1).

    Keyword Args:
        burn_in (int): steps before them (>= 0). Default ``0``.
        slices_per_batch (int): slices per batch (>= 1). Default ``32``.
        num_batches (int, optional): batches drawn; default about twice the rollout's steps.
        cross_episodes (bool): the default sampler's slices cross episode boundaries inside an
            env's row (windows of a rollout row). Default ``False``.
        sampler (Sampler, optional): a TorchRL sampler drawing ``slices_per_batch`` slices per
            sample (copied for every pass); default ``SliceSampler(slice_len=burn_in + slice_len,
            traj_key=...)``.
        transform (callable, optional): applied to each batch ``[B, burn_in + slice_len]``,
            returning the batch that trains (e.g. ``BurnInTransform(modules, burn_in)``).
        is_first_key (NestedKey): where the network reads the reset flags; the sampler's
            ``"is_init"`` are copied there (``"is_first"`` for a ``ResetRNN`` built with its
            default key and ``reset_state_key``). Default ``"is_init"``.
        seed (int): seeds the buffer's generator. Default ``0``.

    Raises:
        TypeError / ValueError: sizes that are not ints in range; at check time, a rollout
            without an episode of ``burn_in + slice_len`` steps (ValueError).

    Examples:
        >>> SliceLayout(8, burn_in=4).describe()
        'slices of 8 after a burn-in of 4, inside episodes'
    """

    def __init__(self, slice_len: int, *, burn_in: int = 0, slices_per_batch: int = 32,
                 num_batches: int | None = None, cross_episodes: bool = False, sampler=None,
                 transform: Callable | None = None, is_first_key="is_init", seed: int = 0):
        self.is_first_key = unravel_key(is_first_key)
        self.slice_len = check_int("slice_len", slice_len, low=1)
        self.burn_in = check_int("burn_in", burn_in, low=0)
        self.slices_per_batch = check_int("slices_per_batch", slices_per_batch, low=1)
        self.num_batches = None if num_batches is None else check_int("num_batches", num_batches, low=1)
        self.cross_episodes, self.sampler, self.transform = bool(cross_episodes), sampler, transform
        self.seed = check_int("seed", seed, low=0)

    def batches(self, rollout, memory_keys):
        length = self.burn_in + self.slice_len
        sampler = copy.deepcopy(self.sampler) if self.sampler is not None else SliceSampler(
            slice_len=length, traj_key=ENV if self.cross_episodes else EPISODE, strict_length=True)
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(rollout.numel()), sampler=sampler,
                                        batch_size=self.slices_per_batch * length,
                                        generator=torch.Generator().manual_seed(self.seed))
        with _quiet():
            buffer.extend(rollout.reshape(-1))
        count = self.num_batches or math.ceil(2 * rollout.numel() / (self.slices_per_batch * self.slice_len))
        for _ in range(count):
            try:
                batch = buffer.sample()
            except RuntimeError as error:
                raise ValueError(
                    f"SliceSampler could not draw slices of {length} steps (slice_len + burn_in) from the rollout "
                    f"({error}); lower slice_len or burn_in, or collect longer episodes.") from None
            batch = batch.reshape(-1, length)
            if self.is_first_key != "is_init" and batch.get("is_init", None) is not None:
                batch.set(self.is_first_key, batch.get("is_init").clone())
            if self.transform is not None:
                batch = self.transform(batch)
            elif self.burn_in:
                batch.set(TRAINED, (torch.arange(length) >= self.burn_in).expand(batch.shape).clone())
            yield batch

    def describe(self) -> str:
        where = "across episodes" if self.cross_episodes else "inside episodes"
        burn = f" after a burn-in of {self.burn_in}" if self.burn_in else ""
        if self.transform is not None:
            burn = f" through {type(self.transform).__name__}"
        return f"slices of {self.slice_len}{burn}, {where}"


class StreamLayout(TrainingLayout):
    """:class:`~torchrl_seqchunk.StreamChunkSampler` chunks ``[B, T]``, the network carrying its state.

    The rollout's episodes are dealt once each (``replacement=False``) into ``num_streams``
    streams; chunk ``k + 1`` of a stream continues chunk ``k``, so the network's recurrent
    modules must carry their state from one to the next (``ResetRNN(carry=True)``, reset where
    ``is_first``, from the stored memory with ``reset_state_key``: a stream's first piece of an
    episode that began before the rollout). After each chunk's pass, ``second_pass`` runs over it
    (what a loss does besides: a target pass, a next-value pass), and must leave the carry alone.
    Padding (the sampler's mask) is not checked.

    Args:
        num_streams (int): streams ``B`` (>= 1).
        seq_len (int): chunk length ``T`` (>= 1).

    Keyword Args:
        second_pass (str or callable or None): ``"repeat"`` (the network over the chunk again),
            ``"next"`` (over its ``step_mdp`` view, the next observations), a callable taking the
            chunk (a loss, e.g. TorchRL's ``ClipPPOLoss`` or ``DQNLoss``), or ``None``.
            Default ``"repeat"``.
        is_first_key (NestedKey): where the sampler writes episode starts. Default ``"is_first"``.
        reset_carry (callable, optional): forgets a custom module's carried state (the
            ``ResetRNN`` modules of the network are reset by :meth:`start` themselves).
        seed (int): the sampler's seed. Default ``0``.

    Raises:
        TypeError / ValueError: sizes that are not ints >= 1, an unknown ``second_pass``.

    Examples:
        >>> StreamLayout(4, 16).describe()
        'stream chunks 4 x 16 with carry, second pass: repeat'
    """

    carries = True

    def __init__(self, num_streams: int, seq_len: int, *, second_pass="repeat", is_first_key="is_first",
                 reset_carry: Callable | None = None, seed: int = 0):
        self.num_streams = check_int("num_streams", num_streams, low=1)
        self.seq_len = check_int("seq_len", seq_len, low=1)
        if not (second_pass is None or callable(second_pass) or second_pass in ("repeat", "next")):
            raise ValueError(f"second_pass must be 'repeat', 'next', a callable taking the chunk or None, "
                             f"got {second_pass!r}.")
        self.second_pass, self.is_first_key = second_pass, unravel_key(is_first_key)
        self.reset_carry, self.seed = reset_carry, check_int("seed", seed, low=0)

    def batches(self, rollout, memory_keys):
        sampler = StreamChunkSampler(self.num_streams, self.seq_len, replacement=False, traj_key=EPISODE,
                                     only_complete=False, is_first_key=self.is_first_key, seed=self.seed)
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(rollout.numel()), sampler=sampler,
                                        batch_size=self.num_streams * self.seq_len)
        with _quiet():
            buffer.extend(rollout.reshape(-1))
        while True:
            chunk = buffer.sample()
            chunk.set(TRAINED, chunk.get(("collector", "mask")).reshape(chunk.shape))
            yield chunk
            if sampler.ran_out:
                return

    def start(self, network) -> None:
        for module in network.modules():
            if isinstance(module, ResetRNN):
                module.reset_carry()
        if self.reset_carry is not None:
            self.reset_carry()

    def train(self, run, batch) -> None:
        run(batch)
        if self.second_pass == "repeat":
            run(batch.clone(False), main=False)
        elif self.second_pass == "next":
            run(step_mdp(batch, keep_other=True), main=False)
        elif self.second_pass is not None:
            self.second_pass(batch.clone(False))

    def describe(self) -> str:
        name = self.second_pass if isinstance(self.second_pass, str) or self.second_pass is None else \
            type(self.second_pass).__name__
        return f"stream chunks {self.num_streams} x {self.seq_len} with carry, second pass: {name}"
