"""What one row's recurrent state looks like, and the reset flags that replace it.

State layout: the state of one row is a tuple of tensors, one per entry, whose
shapes do not include the batch: ``[num_layers, H]`` for :class:`torch.nn.GRU`,
``([num_layers, H_out], [num_layers, H])`` for :class:`torch.nn.LSTM` (h and c,
``H_out = proj_size or H``), ``[H]`` for :class:`torch.nn.GRUCell` and
:class:`MinGRUCell`, ``([H], [H])`` for :class:`torch.nn.LSTMCell`. A batch of
states puts the batch first: ``[B, *shape]``. A custom cell may take and return
its state as a tensor, a tuple of tensors, or a TensorDict (e.g. an RSSM's
``{"deter": [B, D], "stoch": [B, S]}``); :class:`_Layout` turns any of them into
that flat tuple and back, so everything below works on flat tuples only.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key
from torch import nn


class _Layout(NamedTuple):
    """One row's state: entry shapes (no batch), how callers pass it, entry names.

    ``kind`` is ``"tensor"``, ``"tuple"`` or ``"tensordict"``. ``names`` are the
    entries' names under ``state_key`` (``None`` for a tensor; the TensorDict's
    leaf keys for a TensorDict). The output ``y`` of a step is the first entry,
    or, for a TensorDict, every entry.
    """

    shapes: list
    kind: str
    names: list | None

    @property
    def outputs(self) -> int:
        """How many leading entries form the output."""
        return len(self.shapes) if self.kind == "tensordict" else 1

    def flatten(self, state, name: str) -> tuple:
        """``state`` as passed by callers (or returned by a cell) -> tuple of entries."""
        if self.kind == "tensordict":
            if not isinstance(state, TensorDictBase):
                raise TypeError(
                    f"{name} must be a TensorDict with entries {self.names}, got "
                    f"{type(state).__name__}."
                )
            keys = list(state.keys(True, True))
            if set(keys) != set(self.names):
                raise ValueError(
                    f"{name} must hold exactly the entries {self.names}, got {keys}; "
                    "every state (h0, reset_state, the cell's output) has the same keys."
                )
            state = [state.get(key) for key in self.names]
        return _as_tuple(state, len(self.shapes), name)

    def structure(self, entries, batch_dims: int = 1):
        """Inverse of :meth:`flatten`; a TensorDict gets the leading ``batch_dims`` as batch."""
        if self.kind == "tensordict":
            return TensorDict(
                dict(zip(self.names, entries)), batch_size=entries[0].shape[:batch_dims]
            )
        return tuple(entries) if self.kind == "tuple" else entries[0]

    def output(self, entries):
        """``y`` from the output entries ``[B, T, ...]``: a tensor, or a ``[B, T]`` TensorDict."""
        return self.structure(entries, 2) if self.kind == "tensordict" else entries[0]


def _state_layout(rnn: nn.Module, state_shape=None, name: str = "state_shape"):
    """Return the :class:`_Layout` of one row's state, or ``None`` if unknown.

    ``state_shape`` (a shape, a tuple of shapes, or a dict of shapes for a
    TensorDict state) describes a custom cell; built-in modules and cells with a
    ``hidden_size`` know their own. ``name`` is what errors call it.
    """
    if isinstance(rnn, nn.RNNBase):
        if not isinstance(rnn, (nn.GRU, nn.LSTM)):
            raise TypeError(
                f"rnn must be nn.GRU, nn.LSTM or a cell, got {type(rnn).__name__}; "
                "wrap other recurrences as a cell `cell(x_t, h) -> h`."
            )
        if rnn.bidirectional:
            raise ValueError(
                "rnn.bidirectional=True cannot carry a state across resets or chunks; "
                "build the rnn with bidirectional=False."
            )
        layers = rnn.num_layers
        if isinstance(rnn, nn.GRU):
            return _Layout([torch.Size([layers, rnn.hidden_size])], "tensor", None)
        out = rnn.proj_size or rnn.hidden_size
        shapes = [torch.Size([layers, out]), torch.Size([layers, rnn.hidden_size])]
        return _Layout(shapes, "tuple", ["h", "c"])
    if isinstance(rnn, nn.LSTMCell):
        return _Layout([torch.Size([rnn.hidden_size])] * 2, "tuple", ["h", "c"])
    if state_shape is not None:
        return _layout_from_shape(state_shape, name)
    hidden_size = getattr(rnn, "hidden_size", None)
    if isinstance(hidden_size, int):
        return _Layout([torch.Size([hidden_size])], "tensor", None)
    return None


def _dims(value) -> bool:
    """Whether ``value`` is a shape: a sequence of non-negative ints (not bools)."""
    return isinstance(value, Sequence) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)


def _layout_from_shape(state_shape, name: str) -> _Layout:
    def as_shape(value):
        return torch.Size(value) if _dims(value) else None

    if isinstance(state_shape, Mapping) and state_shape:
        shapes = [as_shape(v) for v in state_shape.values()]
        if None not in shapes:
            return _Layout(shapes, "tensordict", [unravel_key(k) for k in state_shape])
    elif isinstance(state_shape, Sequence) and state_shape:
        if all(isinstance(d, int) for d in state_shape):
            if _dims(state_shape):
                return _Layout([torch.Size(state_shape)], "tensor", None)
        else:
            shapes = [as_shape(s) for s in state_shape]
            if None not in shapes:
                return _Layout(shapes, "tuple", [str(i) for i in range(len(shapes))])
    raise ValueError(
        f"{name} must be a shape like (H,) (non-negative ints), a tuple of shapes like ((H,), (Z,)) "
        f"or a dict of shapes like {{'deter': (D,), 'stoch': (S,)}}, got {state_shape!r:.120}."
    )



def _reset_mask(is_first, batch_shape: tuple, name: str = "is_first") -> torch.Tensor:
    """bool ``batch_shape`` mask from a flag of shape ``batch_shape`` or ``(*batch_shape, 1)``."""
    if not isinstance(is_first, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(is_first).__name__}.")
    if is_first.shape == (*batch_shape, 1):
        is_first = is_first.squeeze(-1)
    if is_first.shape != batch_shape:
        raise ValueError(
            f"{name} must have shape {list(batch_shape)} or {list(batch_shape) + [1]}, got "
            f"{list(is_first.shape)}; pass one flag per row and step."
        )
    return is_first if is_first.dtype == torch.bool else is_first != 0


def _as_tuple(state, count: int, name: str) -> tuple:
    state = tuple(state) if isinstance(state, (tuple, list)) else (state,)
    if len(state) != count or not all(isinstance(s, torch.Tensor) for s in state):
        raise TypeError(
            f"{name} must be {'a tuple of ' if count > 1 else ''}{count} tensor(s), "
            f"got {state!r:.80}."
        )
    return state



def _shape_spec(state):
    """What ``state_shape`` would say of a batch-first state as given (``h0``)."""
    if isinstance(state, TensorDictBase):
        return {key: value.shape[1:] for key, value in state.items(True, True)}
    if isinstance(state, (tuple, list)):
        return tuple(h.shape[1:] for h in state)
    return tuple(state.shape[1:])
