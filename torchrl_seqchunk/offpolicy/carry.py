"""The states an off-policy loss carries per stream, and where each of its passes starts.

A recurrent off-policy loss unrolls several networks over every ``[B, T]`` batch (online and
target Q-networks for DQN; actor, critic and target critic for SAC). Each network's pass starts
every row from the state that same network reached at the end of the row's previous batch
(``"carry"``), the memory stored at the row's first step (``"stored"``) or zeros; with
``burn_in=K`` it first unrolls the row's first ``K`` steps without gradient. :class:`Carries`
holds those states, one entry per network name, so that what a stream carries is the state of
that network's own pass over it, whatever other passes the loss runs. With a ``stream_key`` the
states live in a table indexed by stream id, so that a batch may hold any subset of streams::

    batch k:   row b  [x x x x x x]  --> carry["actor"][b], carry["critic"][b], ...
    batch k+1: row b  [x x x x x x]  <-- starts there (zeros where is_first[b, 0])
    overlap:   row b  [p p|x x x x]      p: the previous batch's last K steps, burnt in again
                          ^ the carry is taken before them
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.utils import NestedKey

from .._boundaries import read_entry
from ..recurrent.torchrl_modules import TORCHRL_RNNS
from .unroll import Unroll, unroll_with_next

__all__ = ["Carries", "check_rnn", "kept_mean", "INITIAL_STATES"]

INITIAL_STATES = ("carry", "stored", "zero")
MAX_STREAMS = 2**20  # stream ids index a dense table of carries


def _is_key(key) -> bool:
    """A TensorDict key: a str, or a non-empty tuple of keys."""
    return isinstance(key, str) or (isinstance(key, tuple) and bool(key) and all(map(_is_key, key)))


def kept_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``x`` over the steps where ``mask`` (of ``x``'s shape and dtype) is 1 (0 where
    it keeps none); over every step where ``mask`` is ``None``."""
    return x.mean() if mask is None else (x * mask).sum() / mask.sum().clamp_min(1.0)


def check_rnn(rnn, arg: str, network: str) -> None:
    """Refuses an ``rnn`` (argument ``arg``, inside ``network``) that a loss cannot start per row:
    an unwrapped TorchRL module (TypeError), a ResetRNN without carry or reset state key, or with
    a learned initial state (ValueError)."""
    if isinstance(rnn, TORCHRL_RNNS):
        raise TypeError(
            f"{arg} is a TorchRL {type(rnn).__name__}, which restarts every chunk from the stored "
            f"state (no carry); wrap it, {arg} = ResetRNN(module, reset_state_key=module.in_keys[1:-1]) "
            f"(its weights, keys and backend kept), and put it in {network} in its place."
        )
    if getattr(rnn, "reset_state_keys", None) is None or not getattr(rnn, "carry", False):
        raise ValueError(
            f"{arg} must be a ResetRNN with carry=True and a reset_state_key, e.g. "
            "ResetRNN(gru, state_key='q_state', reset_state_key='q_state')."
        )
    if rnn.initial is not None:
        raise ValueError(
            f"{arg} has initial_state='learned', but the loss resets every episode start to zeros (or "
            "the stored memory), so the learned state would never be trained and the network "
            "would act from another memory than it learns from; build it with initial_state='zeros'."
        )


class Carries:
    """The carried states of a loss's networks, by name; how each pass over a batch starts.

    Args:
        names (list of str): the networks, e.g. ``["online", "target"]``.

    Keyword Args:
        initial_state (str): ``"carry"``, ``"stored"`` or ``"zero"`` (see the losses).
        burn_in (int): steps unrolled without gradient at every row's start, ``>= 0``.
        overlap (bool): the carry is taken ``burn_in`` steps before each row's end.
        stream_key (NestedKey, optional): integer ``[B, T]`` stream ids (a table of carries).
        done_key, terminated_key, truncated_key (NestedKey): TorchRL's flags.

    Raises:
        ValueError / TypeError: an ``initial_state`` not listed, ``stream_key`` without a carry
            or not a key, ``overlap`` not a bool or without a carry and a burn-in.
    """

    def __init__(self, names, *, initial_state: str, burn_in: int, overlap: bool, stream_key: NestedKey | None,
                 done_key: NestedKey, terminated_key: NestedKey, truncated_key: NestedKey):
        if initial_state not in INITIAL_STATES:
            raise ValueError(f"initial_state must be one of {INITIAL_STATES}, got {initial_state!r}.")
        if stream_key is not None:
            if initial_state != "carry":
                raise ValueError(f"stream_key applies to initial_state='carry' only, got initial_state={initial_state!r}.")
            if not _is_key(stream_key):
                raise TypeError(f"stream_key must be a key (a str or a tuple of str), got {stream_key!r}.")
            stream_key = unravel_key(stream_key)
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be a bool, got {overlap!r}.")
        if overlap and (initial_state != "carry" or not burn_in):
            raise ValueError(f"overlap=True needs initial_state='carry' and burn_in >= 1 (the steps the batches of a "
                             f"stream share), got initial_state={initial_state!r}, burn_in={burn_in}.")
        self.initial_state, self.burn_in, self.overlap, self.stream_key = initial_state, burn_in, overlap, stream_key
        self.keys = dict(done=done_key, terminated=terminated_key, truncated=truncated_key)
        self.states: dict[str, tuple | None] = {name: None for name in names}

    # -- the states ------------------------------------------------------------
    def reset(self, mask: torch.Tensor | None = None) -> None:
        """Forgets every network's state: all rows, or rows where ``mask`` (bool ``[B]``; with
        ``stream_key``, bool ``[S]`` over the stream ids ``0..S-1``, any ``S``: a stream past it
        keeps its carry, one not yet seen has none to forget).

        Raises:
            ValueError: without ``stream_key``, a mask of other than ``B`` entries."""
        for name, carry in self.states.items():
            if carry is None or mask is None:
                self.states[name] = None
                continue
            keep, rows = ~mask.reshape(-1).bool(), carry[0].shape[0]
            if self.stream_key is not None:  # the table holds the ids seen so far; past them, nothing to forget
                keep = torch.cat([keep[:rows], keep.new_ones(max(rows - keep.numel(), 0))])
            elif keep.numel() != rows:
                raise ValueError(f"mask has {keep.numel()} entries, the carry {rows} rows (one per batch row).")
            self.states[name] = tuple(h * keep.view(-1, *[1] * (h.dim() - 1)).to(h) for h in carry)

    def state(self) -> dict:
        """What ``get_extra_state`` saves: ``{"carries": {name: list of tensors or None}}``."""
        return {"carries": {k: None if v is None else list(v) for k, v in self.states.items()}}

    def load(self, state: dict) -> None:
        """Restores :meth:`state`'s output."""
        self.states = {k: None if v is None else tuple(v) for k, v in state["carries"].items()}

    # -- a batch ---------------------------------------------------------------
    def streams(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """The stream id of every row, long ``[B]``; ``None`` without ``stream_key``."""
        if self.stream_key is None:
            return None
        ids = tensordict.get(self.stream_key, None)
        if ids is None:
            raise ValueError(f"stream_key={self.stream_key!r} is not in the batch: write each row's stream id "
                             "there (e.g. torch.arange(P) for the rows of a [P, T] chunk), or pass stream_key=None.")
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"the stream ids at {self.stream_key!r} must be integers, got {ids.dtype}.")
        rows = ids.reshape(tensordict.shape[0], -1).long()
        streams = rows[:, 0]
        changes = bool((rows != streams.unsqueeze(1)).any())
        outside = bool((streams < 0).any()) or bool((streams >= MAX_STREAMS).any())
        if changes or outside or streams.unique().numel() != streams.numel():
            raise ValueError(f"the stream ids at {self.stream_key!r} must be in [0, 2**20) (they index a table of "
                             "carries: number the streams 0..P-1), the same along each row and differ between "
                             f"rows (one carry per stream), got {streams.tolist()}.")
        return streams

    def ends(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """bool ``[B]``: the rows whose carry point (the last step; with ``overlap``, ``burn_in``
        steps before it) ends an episode; ``None`` without a carry."""
        if self.initial_state != "carry":
            return None
        done = read_entry(tensordict, "done_key", self.keys["done"], flag=True, required=True)
        return done[:, -1 - (self.burn_in if self.overlap else 0)].reshape(-1)

    def split(self, tensordict: TensorDictBase, is_first_key: NestedKey):
        """``(burn-in steps or None, the rest)``; an episode ending at the burn-in's last step
        starts a new one at the rest's first. A ValueError where no step is left for the loss."""
        if not self.burn_in:
            return None, tensordict
        needed = (2 if self.overlap else 1) * self.burn_in
        if tensordict.shape[1] <= needed:
            raise ValueError(
                f"the batch has {tensordict.shape[1]} steps per row, burn_in={self.burn_in} leaves "
                + ("no step before the overlap with the next batch: sample longer chunks or lower burn_in."
                   if self.overlap and tensordict.shape[1] > self.burn_in else
                   "none for the loss: sample longer sequences or lower burn_in.")
            )
        warm, rest = tensordict[:, : self.burn_in], tensordict[:, self.burn_in:].clone(False)
        first = read_entry(rest, "is_first_key", is_first_key, flag=True, required=True).clone()  # [B, T - K, 1]
        first[:, 0] |= read_entry(warm, "done_key", self.keys["done"], flag=True, required=True)[:, -1]
        rest.set(is_first_key, first)
        return warm, rest

    def start(self, name: str, tensordict: TensorDictBase, rnn, streams: torch.Tensor | None):
        """The state network ``name`` (whose ResetRNN is ``rnn``) starts every row from: its carry,
        the memory stored at the row's first step, or ``None`` (zeros)."""
        if self.initial_state == "zero":
            return None
        if self.initial_state == "stored":
            missing = [k for k in rnn.state_keys if k not in tensordict.keys(True)]
            if missing:
                raise ValueError(
                    f"initial_state='stored' starts every row from the memory stored at its first step, "
                    f"but the batch has no {missing}: store the acting ResetRNN's state keys in the replay, "
                    "or use initial_state='zero'."
                )
            return tuple(tensordict.get(k)[:, 0] for k in rnn.state_keys)
        carry = self.states[name]
        if streams is not None:
            if carry is None:
                return None
            known = (streams < carry[0].shape[0]).view(-1, *[1] * (carry[0].dim() - 1))
            return tuple(torch.where(known, h[streams.clamp(max=h.shape[0] - 1)], 0.0) for h in carry)
        if carry is not None and carry[0].shape[0] != tensordict.shape[0]:
            raise ValueError(
                f"the carried state holds {carry[0].shape[0]} rows but the batch has "
                f"{tensordict.shape[0]}; call reset_carry() when the number of streams changes."
            )
        return carry

    def keep(self, name: str, final: tuple, streams: torch.Tensor | None, ended: torch.Tensor) -> None:
        """Stores the carry of ``name``: the rows' final states, detached, zeros where ``ended``
        (a row whose carry point ends an episode), in the table of streams with ids."""
        final = tuple(h.detach().masked_fill(ended.view(-1, *[1] * (h.dim() - 1)), 0.0) for h in final)
        if streams is None:
            self.states[name] = final
            return
        table = self.states[name]
        size = max(int(streams.max()) + 1, 0 if table is None else table[0].shape[0])
        grown = []
        for i, h in enumerate(final):
            new = h.new_zeros(size, *h.shape[1:])
            if table is not None:
                new[: table[i].shape[0]] = table[i]
            new[streams] = h
            grown.append(new)
        self.states[name] = tuple(grown)

    def unroll(self, name: str, network, rnn, tensordict: TensorDictBase, warm: TensorDictBase | None,
               streams: torch.Tensor | None, ended: torch.Tensor | None, *, value_key,
               bootstrap: bool = True) -> Unroll:
        """One pass of ``network`` (under the caller's parameters) over the batch: from its start,
        after the burn-in ``warm`` (without gradient), by :func:`unroll_with_next`; keeps the
        carry of ``name``. ``recurrent_steps`` counts the burn-in and the overlap's extra pass."""
        start = self.start(name, tensordict if warm is None else warm, rnn, streams)
        burnt, done_key = 0, self.keys["done"]
        if warm is not None:
            with torch.no_grad():
                warmed = unroll_with_next(network, rnn, warm, start, bootstrap=False, value_key=value_key,
                                          done_key=done_key)
            start, burnt = warmed.final_state, warmed.recurrent_steps
        out = unroll_with_next(network, rnn, tensordict, start, value_key=value_key, bootstrap=bootstrap,
                               terminated_key=self.keys["terminated"], done_key=done_key,
                               truncated_key=self.keys["truncated"])
        final = out.final_state
        if self.overlap:  # the state before the last K steps, which the next batch burns in again
            with torch.no_grad():
                before = unroll_with_next(network, rnn, tensordict[:, : -self.burn_in], start, bootstrap=False,
                                          value_key=value_key, done_key=done_key)
            final, burnt = before.final_state, burnt + before.recurrent_steps
        if self.initial_state == "carry":  # a row whose carry point ends an episode carries zeros
            self.keep(name, final, streams, ended)
        return out._replace(recurrent_steps=out.recurrent_steps + burnt)
