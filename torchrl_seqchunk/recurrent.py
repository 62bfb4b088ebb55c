"""Recurrent state with vectorized resets, carried across chunks.

Row ``b`` of a ``[B, T]`` chunk replaces its recurrent state at every step where
``is_first[b, t]`` is set (zeros, a learned initial state, or a stored per-step
value) and carries it otherwise. :func:`rnn_with_resets` is the functional core;
:class:`ResetRNN` wraps it as a TensorDict module that also keeps the state
between chunks (truncated BPTT) and acts step by step in a collector.

State layout: the state of one row is a tuple of tensors, one per entry, whose
shapes do not include the batch: ``[num_layers, H]`` for :class:`torch.nn.GRU`,
``([num_layers, H_out], [num_layers, H])`` for :class:`torch.nn.LSTM` (h and c,
``H_out = proj_size or H``), ``[H]`` for :class:`torch.nn.GRUCell` and
:class:`MinGRUCell`, ``([H], [H])`` for :class:`torch.nn.LSTMCell`. A batch of
states puts the batch first: ``[B, *shape]``. A custom cell may take and return
its state as a tensor, a tuple of tensors, or a TensorDict (e.g. an RSSM's
``{"deter": [B, D], "stoch": [B, S]}``); :class:`_Layout` turns any of them into
that flat tuple and back, so everything below works on flat tuples only.

Each backend (``_loop``, ``_packed``, ``_scan``) is one function
``backend(rnn, x, reset, h0, reset_value) -> (y, h_last)`` on that tuple layout.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase, unravel_key
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

__all__ = ["MinGRUCell", "ResetRNN", "rnn_with_resets"]

_BACKEND_NAMES = ("auto", "loop", "packed", "scan")


class MinGRUCell(nn.Module):
    """The minGRU cell, a GRU whose gates read only the input (linear in ``h``).

    ``z_t = sigmoid(W_z x_t + b_z)``, ``h~_t = W_h x_t + b_h`` and
    ``h_t = (1 - z_t) * h_{t-1} + z_t * h~_t``, from Feng et al., "Were RNNs All
    We Needed?" (2024), section 3.1. Because ``h_t = a_t * h_{t-1} + b_t`` with
    ``a_t, b_t`` computed from ``x_t`` alone, a whole sequence runs as a parallel
    prefix scan (``backend="scan"`` of :func:`rnn_with_resets`).

    Args:
        input_size (int): features of ``x_t``.
        hidden_size (int): features of ``h``.

    Keyword Args:
        bias (bool): whether the two projections have a bias. Default ``True``.

    Shapes: ``forward(x [*, input_size], h [*, hidden_size]) -> h [*, hidden_size]``,
    float tensors on one device.

    Examples:
        >>> import torch
        >>> cell = MinGRUCell(3, 5)
        >>> cell(torch.randn(4, 3), torch.zeros(4, 5)).shape
        torch.Size([4, 5])
    """

    def __init__(self, input_size: int, hidden_size: int, *, bias: bool = True):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.linear = nn.Linear(input_size, 2 * hidden_size, bias=bias)

    def linear_coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(a, b)`` with ``h_t = a * h_{t-1} + b``; both ``[*, hidden_size]``."""
        gate, candidate = self.linear(x).chunk(2, dim=-1)
        z = torch.sigmoid(gate)
        return 1 - z, z * candidate

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        a, b = self.linear_coefficients(x)
        return torch.addcmul(b, a, h)


# ----------------------------------------------------------------------------
# What a module's state looks like
# ----------------------------------------------------------------------------


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


def _layout_from_shape(state_shape, name: str) -> _Layout:
    def as_shape(value):
        if isinstance(value, Sequence) and all(isinstance(d, int) for d in value):
            return torch.Size(value)
        return None

    if isinstance(state_shape, Mapping) and state_shape:
        shapes = [as_shape(v) for v in state_shape.values()]
        if None not in shapes:
            return _Layout(shapes, "tensordict", [unravel_key(k) for k in state_shape])
    elif isinstance(state_shape, Sequence) and state_shape:
        if all(isinstance(d, int) for d in state_shape):
            return _Layout([torch.Size(state_shape)], "tensor", None)
        shapes = [as_shape(s) for s in state_shape]
        if None not in shapes:
            return _Layout(shapes, "tuple", [str(i) for i in range(len(shapes))])
    raise ValueError(
        f"{name} must be a shape like (H,), a tuple of shapes like ((H,), (Z,)) or a dict "
        f"of shapes like {{'deter': (D,), 'stoch': (S,)}}, got {state_shape!r:.120}."
    )


# ----------------------------------------------------------------------------
# Backends: backend(rnn, x, reset, h0, reset_value) -> (y, h_last)
#   (loop and scan also take the _Layout, which cells cannot tell them)
#   x [B, T, F]; reset bool [B, T]; h0 tuple of [B, *S];
#   reset_value None (zeros) or tuple of [B, T, *S] (expanded views);
#   y tuple of the output entries [B, T, *S] (layout.outputs of them, the first
#   being [B, T, H_out]); h_last tuple of [B, *S].
# ----------------------------------------------------------------------------


def _layer_steps(rnn: nn.Module, layout: _Layout):
    """One step function per layer: ``step(x_t, state_tuple) -> state_tuple``."""
    if isinstance(rnn, (nn.GRU, nn.LSTM)):
        steps = []
        for layer in range(rnn.num_layers):
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if rnn.bias else [])
            weights = [getattr(rnn, f"{name}_l{layer}") for name in names]
            if not rnn.bias:
                weights += [None, None]
            if isinstance(rnn, nn.GRU):
                steps.append(lambda x, s, w=weights: (torch.gru_cell(x, s[0], *w),))
            else:
                proj = getattr(rnn, f"weight_hr_l{layer}", None)
                steps.append(lambda x, s, w=weights, p=proj: _lstm_step(x, s, w, p))
        return steps
    output = f"the output of {type(rnn).__name__}"
    return [lambda x, s: layout.flatten(rnn(x, layout.structure(s)), output)]


def _lstm_step(x, state, weights, proj):
    if proj is None:
        return torch.lstm_cell(x, state, *weights)
    # the native cell cannot project h (proj_size): same equations, written out
    w_ih, w_hh, b_ih, b_hh = weights
    gates = F.linear(x, w_ih, b_ih) + F.linear(state[0], w_hh, b_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
    return F.linear(torch.sigmoid(o) * torch.tanh(c), proj), c


def _reset(state, masks, values):
    """Replace the rows of ``state`` selected by ``masks`` by ``values`` (zeros if None)."""
    if values is None:
        return tuple(s.masked_fill(m, 0.0) for s, m in zip(state, masks))
    return tuple(torch.where(m, v, s) for s, m, v in zip(state, masks, values))


def _loop(rnn, x, reset, h0, reset_value, *, layout):
    """Loop over time with the native kernels.

    An ``nn.GRU`` / ``nn.LSTM`` chunk whose resets fall on few time steps (at
    most one reset-free segment per 4 steps) runs one native call per
    segment; otherwise every step runs the native cell kernel.
    """
    if isinstance(rnn, (nn.GRU, nn.LSTM)):
        bounds = _segment_bounds(reset)
        if 4 * (len(bounds) - 1) <= reset.shape[1]:
            return _loop_segments(rnn, x, reset, h0, reset_value, bounds)
    return _loop_steps(rnn, x, reset, h0, reset_value, layout=layout)


def _segment_bounds(reset) -> list:
    """``[0, t_1, ..., T]``: the time steps where any row resets, which split the
    chunk into segments free of resets (one host sync)."""
    inner = reset[:, 1:].any(0).nonzero().squeeze(1) + 1
    return [0, *inner.tolist(), reset.shape[1]]


def _loop_segments(rnn, x, reset, h0, reset_value, bounds):
    """One native ``nn.GRU`` / ``nn.LSTM`` call per reset-free time segment.

    Rows that reset at a segment's first step take their reset value there;
    inside a segment nothing resets, so the native module is exact.
    """
    batch = x.shape[0]
    state, outputs = h0, []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        masks = [reset[:, start].view(batch, *([1] * (s.dim() - 1))) for s in state]
        values = None if reset_value is None else [v[:, start] for v in reset_value]
        state = _reset(state, masks, values)
        native = tuple(s.transpose(0, 1).contiguous() for s in state)  # [layers, B, H]
        segment = x[:, start:stop] if rnn.batch_first else x[:, start:stop].transpose(0, 1)
        y, new = rnn(segment, native[0] if len(native) == 1 else native)
        outputs.append(y if rnn.batch_first else y.transpose(0, 1))
        state = tuple(s.transpose(0, 1) for s in ((new,) if isinstance(new, torch.Tensor) else new))
    return (torch.cat(outputs, 1),), state


def _loop_steps(rnn, x, reset, h0, reset_value, *, layout):
    """Per-step recurrence, layer after layer, with the native cell kernels.

    Resets of a stacked module hit all layers at the same step, so layer ``l``
    can run over the whole chunk before layer ``l + 1`` (same result as stepping
    the stack, fewer tensor copies).
    """
    stacked = isinstance(rnn, nn.RNNBase)
    steps = _layer_steps(rnn, layout)
    batch, time = reset.shape
    inputs = x.unbind(1)
    finals = []
    for layer, step in enumerate(steps):
        state = tuple(s[:, layer] if stacked else s for s in h0)
        masks = [reset.view(batch, time, *([1] * (s.dim() - 1))).unbind(1) for s in state]
        masks = list(zip(*masks))
        values = None
        if reset_value is not None:
            values = list(zip(*[(v[:, :, layer] if stacked else v).unbind(1) for v in reset_value]))
        outputs = []
        for t, x_t in enumerate(inputs):
            state = _reset(state, masks[t], None if values is None else values[t])
            state = step(x_t, state)
            outputs.append(state[: layout.outputs])
        finals.append(state)
        inputs = [out[0] for out in outputs]
        if stacked and rnn.dropout > 0 and rnn.training and layer < len(steps) - 1:
            inputs = F.dropout(torch.stack(inputs, 1), rnn.dropout, True).unbind(1)
    h_last = tuple(torch.stack(parts, 1) for parts in zip(*finals)) if stacked else finals[0]
    return tuple(torch.stack(entry, 1) for entry in zip(*outputs)), h_last


def _packed(rnn, x, reset, h0, reset_value):
    """Split rows into reset-free segments and run them as one packed native call.

    Segment ``k`` starts at ``(b, t)`` where ``t = 0`` or ``reset[b, t]``; its
    initial state is the reset value there, or ``h0[b]`` for an unreset ``t = 0``.
    """
    if not isinstance(rnn, (nn.GRU, nn.LSTM)):
        raise TypeError(
            f"backend='packed' needs an nn.GRU or nn.LSTM, got {type(rnn).__name__}; "
            "use backend='loop' for cells."
        )
    batch, time = reset.shape
    starts = reset.clone()
    starts[:, 0] = True
    starts = starts.reshape(-1)
    segment = starts.cumsum(0) - 1  # [B*T] segment of each step, row-major
    first = starts.nonzero().squeeze(1)  # [S] flat index of each segment's first step
    lengths = torch.diff(first, append=first.new_tensor([batch * time]))
    position = torch.arange(batch * time, device=x.device) - first[segment]
    row, t0 = first // time, first % time

    init = []
    for i, h in enumerate(h0):
        value = h[row]
        if reset_value is not None:
            m = reset[row, t0].view(-1, *([1] * (h.dim() - 1)))
            value = torch.where(m, reset_value[i][row, t0], value)
        else:
            value = value.masked_fill(reset[row, t0].view(-1, *([1] * (h.dim() - 1))), 0.0)
        init.append(value.transpose(0, 1).contiguous())  # [layers, S, H]

    padded = x.new_zeros(len(first), int(lengths.max()), x.shape[-1])
    padded = padded.index_put((segment, position), x.reshape(batch * time, -1))
    packed = pack_padded_sequence(padded, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, h_n = rnn(packed, init[0] if len(init) == 1 else tuple(init))
    y = pad_packed_sequence(out, batch_first=True)[0][segment, position]
    last = segment.view(batch, time)[:, -1]
    h_n = (h_n,) if isinstance(h_n, torch.Tensor) else h_n
    return (y.view(batch, time, -1),), tuple(h[:, last].transpose(0, 1) for h in h_n)


def _scan(rnn, x, reset, h0, reset_value, *, layout):
    """Parallel inclusive prefix scan of ``h_t = a_t * h_{t-1} + b_t``, entry by entry.

    ``rnn.linear_coefficients(x)`` returns ``(a, b)``, each shaped like a state
    over ``[B, T]`` (a tensor, a tuple or a TensorDict, as the cell's state).
    Hillis and Steele doubling (Blelloch, "Prefix sums and their applications",
    1990): ``log2(T + 1)`` rounds of element-wise ops over the whole chunk. A reset
    at ``t`` becomes ``a_t -> 0``, ``b_t -> b_t + a_t * reset_value_t``.
    """
    if not hasattr(rnn, "linear_coefficients"):
        raise TypeError(
            f"backend='scan' needs a linear recurrence with a `linear_coefficients(x) -> "
            f"(a, b)` method (such as MinGRUCell), got {type(rnn).__name__}; use "
            "backend='loop'."
        )
    name = f"{type(rnn).__name__}.linear_coefficients(x)"
    a, b = (layout.flatten(c, name) for c in rnn.linear_coefficients(x))  # [B, T, *S]
    values = [None] * len(h0) if reset_value is None else reset_value
    states = [_scan_entry(*entry, reset) for entry in zip(a, b, h0, values)]
    return tuple(states[: layout.outputs]), tuple(h[:, -1] for h in states)


def _scan_entry(a, b, h0, reset_value, reset):
    """One entry of :func:`_scan`: ``a, b [B, T, *S]``, ``h0 [B, *S]`` -> ``h [B, T, *S]``."""
    mask = reset.view(*reset.shape, *([1] * (h0.dim() - 1)))
    if reset_value is not None:
        b = torch.where(mask, torch.addcmul(b, a, reset_value), b)
    a = a.masked_fill(mask, 0.0)
    # h0 becomes step -1 with a = 0, so the scan needs no special first step; a row
    # reset at t = 0 never reads h0 (0 * nan would still be nan).
    a = torch.cat([torch.zeros_like(h0).unsqueeze(1), a], 1)
    b = torch.cat([h0.masked_fill(mask[:, 0], 0.0).unsqueeze(1), b], 1)
    span = 1
    while span < b.shape[1]:
        b = torch.cat([b[:, :span], torch.addcmul(b[:, span:], a[:, span:], b[:, :-span])], 1)
        a = torch.cat([a[:, :span], a[:, span:] * a[:, :-span]], 1)
        span *= 2
    return b[:, 1:]


def _pick_backend(rnn: nn.Module, device: torch.device) -> str:
    if hasattr(rnn, "linear_coefficients"):
        return "scan"
    if isinstance(rnn, (nn.GRU, nn.LSTM)) and device.type == "cuda":
        return "packed"
    return "loop"


# ----------------------------------------------------------------------------
# Functional core
# ----------------------------------------------------------------------------


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


def rnn_with_resets(
    rnn: nn.Module,
    x: torch.Tensor,
    is_first: torch.Tensor,
    h0=None,
    reset_state=None,
    *,
    backend: str = "auto",
):
    """Run ``rnn`` over ``[B, T]`` sequences, resetting the state where ``is_first``.

    Reference semantics (every backend matches this per-step loop)::

        h = h0
        for t in range(T):
            h = where(is_first[:, t], reset_state[:, t], h)   # zeros by default
            h = step(x[:, t], h); y[:, t] = output(h)

    No gradient flows from a reset step into the state before it.

    Args:
        rnn (nn.Module): an ``nn.GRU`` or ``nn.LSTM`` (any ``num_layers``,
            ``batch_first`` either way, not bidirectional), an ``nn.GRUCell``,
            ``nn.LSTMCell``, :class:`MinGRUCell`, or any cell ``cell(x_t, h) -> h``
            where ``h`` is a tensor, a tuple of tensors (the output is ``h`` or
            ``h[0]``) or a TensorDict of tensors with batch size ``[B]``, such as
            a world-model RSSM's ``{"deter": [B, D], "stoch": [B, S]}`` (the
            output is the whole state; the cell may return the keys in any order).
        x (Tensor): float ``[B, T, F]``, batch first whatever ``rnn.batch_first``.
        is_first (Tensor): ``[B, T]`` or ``[B, T, 1]``, bool, int or float;
            any non-zero value resets (it is never read as an index).
        h0 (Tensor, tuple or TensorDict, optional): state before ``t = 0``,
            ``[B, *S]`` per entry (see the module docstring for ``S``); zeros if
            omitted (a custom cell without a ``hidden_size`` attribute needs it,
            and so does a TensorDict-state cell: its keys name the entries).
        reset_state (Tensor, tuple or TensorDict, optional): value taken at
            resets, structured like ``h0``, per entry broadcastable to
            ``[B, T, *S]`` (a per-step stored memory, or a learned ``[*S]``
            initial state); zeros if omitted.

    Keyword Args:
        backend (str): ``"loop"`` (native kernels step by step, or one native
            call per reset-free time segment when resets fall on few steps; the
            CPU path; any rnn), ``"packed"`` (reset-free row segments in one
            packed native call; the GPU path, ``nn.GRU``/``nn.LSTM`` only),
            ``"scan"`` (parallel prefix scan, only for cells with
            ``linear_coefficients(x) -> (a, b)``, ``a`` and ``b`` ``[B, T]``
            structured like the state, such as :class:`MinGRUCell`) or ``"auto"``
            (``scan`` if possible, else ``packed`` on CUDA for
            ``nn.GRU``/``nn.LSTM``, else ``loop``). Default ``"auto"``.

    Returns:
        ``(y, h_last)``: ``y`` is ``[B, T, H_out]`` (a TensorDict ``[B, T]`` of
        every state entry for a TensorDict state); ``h_last`` is the state after
        the last step, structured like ``h0`` (a TensorDict with batch ``[B]``).

    Raises:
        TypeError: unsupported ``rnn``, a backend that cannot run it (``packed``
            for a cell, ``scan`` for a cell without ``linear_coefficients``), or
            non-tensor inputs.
        ValueError: wrong shapes, TensorDict states whose keys differ, unknown
            ``backend``, a bidirectional ``rnn``.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> gru = nn.GRU(3, 8, num_layers=2, batch_first=True)
        >>> x = torch.randn(4, 10, 3)
        >>> is_first = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> is_first[1, 6] = True
        >>> y, h = rnn_with_resets(gru, x, is_first)
        >>> y.shape, h.shape
        (torch.Size([4, 10, 8]), torch.Size([4, 2, 8]))
        >>> y_reset, _ = rnn_with_resets(gru, x[1:2, 6:], torch.zeros(1, 4))
        >>> torch.allclose(y[1:2, 6:], y_reset, atol=1e-6)
        True

        A cell with a TensorDict state (deterministic and latent parts, as in an RSSM):

        >>> class RSSM(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.gru, self.latent = nn.GRUCell(3 + 2, 8), nn.Linear(8, 2)
        ...     def forward(self, x_t, h):
        ...         deter = self.gru(torch.cat([x_t, h["stoch"]], -1), h["deter"])
        ...         stoch = torch.tanh(self.latent(deter))
        ...         return TensorDict(deter=deter, stoch=stoch, batch_size=h.batch_size)
        >>> h0 = TensorDict(deter=torch.zeros(4, 8), stoch=torch.zeros(4, 2), batch_size=[4])
        >>> y, h = rnn_with_resets(RSSM(), x, is_first, h0)
        >>> y["stoch"].shape, h["deter"].shape
        (torch.Size([4, 10, 2]), torch.Size([4, 8]))
    """
    if backend not in _BACKEND_NAMES:
        raise ValueError(f"backend must be one of {_BACKEND_NAMES}, got {backend!r}.")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(
            f"x must be a [B, T, F] tensor, got {getattr(x, 'shape', type(x).__name__)}; "
            "add the missing batch or time dimension."
        )
    batch = x.shape[0]
    reset = _reset_mask(is_first, tuple(x.shape[:2])).to(x.device)
    # a custom cell's state layout is read from h0 when given
    layout = _state_layout(rnn, None if h0 is None else _shape_spec(h0), "h0's per-row shape")
    if layout is None:
        raise ValueError(
            f"h0 is required for a {type(rnn).__name__} without a `hidden_size` attribute; "
            "pass the initial state (a tensor, tuple or TensorDict of [B, *S] tensors)."
        )
    if h0 is None:
        h0 = tuple(x.new_zeros(batch, *shape) for shape in layout.shapes)
    h0 = layout.flatten(h0, "h0")
    if reset_state is not None:
        reset_state = layout.flatten(reset_state, "reset_state")
    y, h_last = _unroll(rnn, x, reset, h0, reset_state, layout, backend)
    return layout.output(y), layout.structure(h_last)


def _shape_spec(state):
    """What ``state_shape`` would say of a batch-first state as given (``h0``)."""
    if isinstance(state, TensorDictBase):
        return {key: value.shape[1:] for key, value in state.items(True, True)}
    if isinstance(state, (tuple, list)):
        return tuple(h.shape[1:] for h in state)
    return tuple(state.shape[1:])


def _unroll(rnn, x, reset, h0, reset_state, layout: _Layout, backend: str):
    """:func:`rnn_with_resets` on flat states: checks entry shapes, runs the backend.

    ``h0`` a tuple of ``[B, *S]``, ``reset_state`` ``None`` or a tuple of tensors
    broadcastable to ``[B, T, *S]``; returns ``(y entries, h_last tuple)``.
    """
    batch, time = reset.shape
    for h, shape in zip(h0, layout.shapes):
        if h.shape != (batch, *shape):
            raise ValueError(
                f"h0 entries must have shape {[batch, *shape]}, got {list(h.shape)}; "
                "states are batch first (see the module docstring)."
            )
    if reset_state is not None:
        try:
            reset_state = tuple(
                v.expand(batch, time, *shape) for v, shape in zip(reset_state, layout.shapes)
            )
        except RuntimeError as err:
            raise ValueError(
                f"reset_state entries must broadcast to [B, T, *S] = "
                f"{[[batch, time, *shape] for shape in layout.shapes]}, got "
                f"{[list(v.shape) for v in reset_state]}."
            ) from err
    if backend == "auto":
        backend = _pick_backend(rnn, x.device)
    if backend == "loop":
        return _loop(rnn, x, reset, h0, reset_state, layout=layout)
    if backend == "packed":
        return _packed(rnn, x, reset, h0, reset_state)
    return _scan(rnn, x, reset, h0, reset_state, layout=layout)


# ----------------------------------------------------------------------------
# TensorDict module
# ----------------------------------------------------------------------------


class ResetRNN(TensorDictModuleBase):
    """A recurrent TensorDict module that resets per row and carries state across chunks.

    The mode follows the input TensorDict:

    * **Sequence mode** (``batch_dims >= 2``, time the last batch dim, e.g. a
      ``[B, T]`` stream chunk or a ``[N, W]`` window batch; leading dims are
      flattened into rows): the state is reset where ``is_first[b, t]`` to
      zeros / the learned initial state, or, with ``reset_state_key``, to the
      stored per-step memory ``td[reset_state_key][b, t]`` (``[B, T, *S]``
      per state entry, under the same entry names as the state keys).
      With ``carry=True`` the final state of every row is kept, detached
      (truncated BPTT), and used at ``t = 0`` of the next call where
      ``is_first[:, 0]`` is False. Writes ``out_key`` ``[B, T, H_out]``
      (for a TensorDict state, every entry under ``(*out_key, name)``).
    * **Step mode** (``batch_dims <= 1``, acting in a collector): reads the
      previous state from the state keys (initial state where absent), resets
      rows where ``is_first``, writes the state it used into the root state keys
      (so a replay buffer stores the memory the agent had at each step), the new
      state into ``("next", *state_key)`` and the output into ``out_key``.

    State layout (see :attr:`state_keys`, :attr:`state_shapes`): a tensor state
    (``nn.GRU`` ``[num_layers, H]``, ``nn.GRUCell`` / :class:`MinGRUCell` ``[H]``)
    lives under ``state_key``; a tuple or TensorDict state lives under
    ``(*state_key, name)``, one entry each, with names ``"h"``, ``"c"`` for LSTMs,
    ``"0"``, ``"1"``, ... for custom cells with a tuple state, and the keys of
    ``state_shape`` for a TensorDict state (so an RSSM's state is the
    sub-TensorDict ``td[state_key]`` with ``"deter"`` and ``"stoch"``). Stored
    states are float tensors ``[*batch, *S]`` of the rnn's dtype.

    Args:
        rnn (nn.Module): ``nn.GRU`` / ``nn.LSTM`` (any ``num_layers``,
            ``batch_first`` either way), ``nn.GRUCell``, ``nn.LSTMCell``,
            :class:`MinGRUCell`, or any cell ``cell(x_t, h) -> h`` with ``h`` a
            tensor, a tuple of tensors or a TensorDict of tensors with batch
            ``[N]`` (then give ``state_shape``; see :func:`rnn_with_resets`).

    Keyword Args:
        in_key (NestedKey): input features ``[*batch, F]``. Default ``"embed"``.
        out_key (NestedKey): output features ``[*batch, H_out]``, or the new
            state's entries under ``(*out_key, name)`` for a TensorDict state.
            Default ``"features"``.
        is_first_key (NestedKey): reset flags ``[*batch]`` or ``[*batch, 1]``, any
            dtype, non-zero resets (``"is_init"`` for TorchRL's ``InitTracker``).
            Default ``"is_first"``.
        state_key (NestedKey): where the state is stored. Default ``"recurrent_state"``.
        reset_state_key (NestedKey, optional): sequence mode only: stored memory
            taken at reset steps instead of the initial state (reset-and-continue
            training on windows). Default ``None``.
        initial_state (str): ``"zeros"`` or ``"learned"`` (a parameter per state
            entry, initialised to zeros). Default ``"zeros"``.
        backend (str): see :func:`rnn_with_resets`. Default ``"auto"``.
        carry (bool): keep each row's final state between sequence-mode calls
            (part of ``state_dict``). Default ``True``.
        state_shape (shape, tuple of shapes or dict of shapes, optional): one
            row's state for a custom cell without a ``hidden_size`` attribute,
            e.g. ``(H,)``, ``((H,), (Z,))`` for a tuple state, or
            ``{"deter": (D,), "stoch": (S,)}`` (keys: entry names, any
            NestedKey) for a TensorDict state.

    Raises:
        TypeError / ValueError: unsupported ``rnn`` or bad option values (at
            construction); bad shapes, or a carried state whose batch differs from
            the input while some ``is_first[:, 0]`` is False (at call time).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> module = ResetRNN(nn.GRU(3, 8, batch_first=True))
        >>> is_first = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> chunk = TensorDict({"embed": torch.randn(4, 10, 3), "is_first": is_first}, [4, 10])
        >>> module(chunk)["features"].shape
        torch.Size([4, 10, 8])
        >>> module.state_keys, module.state_shapes
        (['recurrent_state'], [torch.Size([1, 8])])
        >>> is_first = torch.ones(2, 1, dtype=torch.bool)
        >>> step = module(TensorDict({"embed": torch.randn(2, 3), "is_first": is_first}, [2]))
        >>> step["recurrent_state"].abs().sum().item(), step["next", "recurrent_state"].shape
        (0.0, torch.Size([2, 1, 8]))

        A cell whose state is a TensorDict (here a toy RSSM: deterministic and latent parts):

        >>> class RSSM(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.gru, self.latent = nn.GRUCell(3 + 2, 8), nn.Linear(8, 2)
        ...     def forward(self, x_t, h):
        ...         deter = self.gru(torch.cat([x_t, h["stoch"]], -1), h["deter"])
        ...         stoch = torch.tanh(self.latent(deter))
        ...         return TensorDict(deter=deter, stoch=stoch, batch_size=h.batch_size)
        >>> rssm = ResetRNN(RSSM(), state_shape={"deter": (8,), "stoch": (2,)})
        >>> rssm.state_keys
        [('recurrent_state', 'deter'), ('recurrent_state', 'stoch')]
        >>> out = rssm(chunk.exclude("features"))
        >>> out["features", "stoch"].shape, out["features", "deter"].shape
        (torch.Size([4, 10, 2]), torch.Size([4, 10, 8]))
    """

    def __init__(
        self,
        rnn: nn.Module,
        *,
        in_key="embed",
        out_key="features",
        is_first_key="is_first",
        state_key="recurrent_state",
        reset_state_key=None,
        initial_state: str = "zeros",
        backend: str = "auto",
        carry: bool = True,
        state_shape=None,
    ):
        super().__init__()
        if not isinstance(rnn, nn.Module):
            raise TypeError(f"rnn must be an nn.Module, got {type(rnn).__name__}.")
        layout = _state_layout(rnn, state_shape)
        if layout is None:
            raise ValueError(
                f"state_shape is required for a {type(rnn).__name__} without a `hidden_size` "
                "attribute; pass e.g. state_shape=(H,), ((H,), (Z,)) for a tuple state or "
                "{'deter': (D,), 'stoch': (S,)} for a TensorDict state."
            )
        if initial_state not in ("zeros", "learned"):
            raise ValueError(f"initial_state must be 'zeros' or 'learned', got {initial_state!r}.")
        if backend not in _BACKEND_NAMES:
            raise ValueError(f"backend must be one of {_BACKEND_NAMES}, got {backend!r}.")
        self.rnn = rnn
        self._layout = layout
        self.state_shapes, names = layout.shapes, layout.names
        self.backend = backend
        self.carry = bool(carry)
        self.in_key, self.out_key = unravel_key(in_key), unravel_key(out_key)
        self.is_first_key = unravel_key(is_first_key)
        self.state_keys = self._entry_keys(state_key, names)
        self.reset_state_keys = (
            None if reset_state_key is None else self._entry_keys(reset_state_key, names)
        )
        self.in_keys = [self.in_key, self.is_first_key, *self.state_keys] + [
            k for k in self.reset_state_keys or [] if k not in self.state_keys
        ]
        next_keys = [unravel_key(("next", k)) for k in self.state_keys]
        output_names = names if layout.kind == "tensordict" else None
        self.out_keys = [*self._entry_keys(out_key, output_names), *self.state_keys, *next_keys]
        param = next(rnn.parameters(), torch.empty(0))
        self.initial = None
        if initial_state == "learned":
            self.initial = nn.ParameterList(
                nn.Parameter(param.new_zeros(s)) for s in self.state_shapes
            )
        self._carry = None

    @staticmethod
    def _entry_keys(key, names):
        key = unravel_key(key)
        if names is None:
            return [key]
        return [unravel_key((key, name)) for name in names]

    # -- state helpers -------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        """The rnn's current parameter dtype (it follows ``module.double()`` and such)."""
        return next(self.rnn.parameters(), torch.empty(0)).dtype

    def _get(self, tensordict: TensorDictBase, key, option: str) -> torch.Tensor:
        value = tensordict.get(key, None)
        if value is None:
            raise ValueError(
                f"key {key!r} not found in the input TensorDict (its keys: "
                f"{sorted(map(str, tensordict.keys(True, True)))}); pass {option}= naming the "
                "entry the data holds."
            )
        return value

    def _initial_state(self, batch: int, device) -> tuple:
        if self.initial is None:
            return tuple(
                torch.zeros(batch, *s, dtype=self._dtype, device=device) for s in self.state_shapes
            )
        return tuple(p.expand(batch, *p.shape) for p in self.initial)

    def reset_carry(self, mask=None) -> None:
        """Forget the carried state: of every row (``mask=None``) or of rows where ``mask``.

        Args:
            mask (Tensor, optional): ``[B]`` (or ``[B, 1]``), any dtype, non-zero
                resets that row's carried state to the initial state.
        """
        if mask is None or self._carry is None:
            self._carry = None
            return
        batch = self._carry[0].shape[0]
        mask = _reset_mask(mask, (batch,), "mask").to(self._carry[0].device)
        initial = self._initial_state(batch, self._carry[0].device)
        self._carry = tuple(
            torch.where(mask.view(-1, *([1] * len(s))), i.detach(), c)
            for c, i, s in zip(self._carry, initial, self.state_shapes)
        )

    def get_extra_state(self):
        return {"carry": None if self._carry is None else list(self._carry)}

    def set_extra_state(self, state) -> None:
        carry = state["carry"]
        self._carry = None if carry is None else tuple(carry)

    def make_tensordict_primer(self):
        """A TorchRL ``TensorDictPrimer`` declaring the state entries in the env specs.

        Append it to a ``TransformedEnv`` (single env, ``SerialEnv`` or
        ``ParallelEnv``; shapes are expanded to the env batch) together with an
        ``InitTracker(init_key=is_first_key)``, so that the state written to
        ``("next", *state_key)`` moves to the root at every step and is zeroed
        at resets.
        """
        from torchrl.data import Unbounded
        from torchrl.envs import TensorDictPrimer

        return TensorDictPrimer(
            {
                k: Unbounded(shape=s, dtype=self._dtype)
                for k, s in zip(self.state_keys, self.state_shapes)
            },
            expand_specs=True,
        )

    # -- forward -------------------------------------------------------------
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims >= 2:
            return self._sequence(tensordict)
        return self._step(tensordict)

    def _sequence(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = tensordict.shape
        rows = tensordict.reshape(-1, shape[-1])
        x = self._get(rows, self.in_key, "in_key")
        batch = x.shape[0]
        is_first = self._get(rows, self.is_first_key, "is_first_key")
        reset = _reset_mask(is_first, (batch, shape[-1]), "is_first")
        h0 = self._initial_state(batch, x.device)
        if self.carry and self._carry is not None:
            if self._carry[0].shape[0] == batch:
                h0 = tuple(c.to(x.device, self._dtype) for c in self._carry)
            elif not bool(reset[:, 0].all()):
                raise ValueError(
                    f"the carried state holds {self._carry[0].shape[0]} rows but the input has "
                    f"{batch} and not every row starts with is_first; call reset_carry() when "
                    "the number of streams changes."
                )
        if self.reset_state_keys is not None:
            keys = self.reset_state_keys
            reset_state = tuple(self._get(rows, k, "reset_state_key") for k in keys)
        else:
            reset_state = None if self.initial is None else tuple(self.initial)
        y, h_last = _unroll(self.rnn, x, reset, h0, reset_state, self._layout, self.backend)
        if self.carry:
            self._carry = tuple(h.detach() for h in h_last)
        y = self._layout.output(y)
        tensordict.set(self.out_key, y.reshape(*shape, *y.shape[2:]))
        return tensordict

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = tensordict.shape
        rows = tensordict.reshape(-1)
        x = self._get(rows, self.in_key, "in_key")
        batch = x.shape[0]
        initial = self._initial_state(batch, x.device)
        keys = rows.keys(include_nested=True)
        if all(k in keys for k in self.state_keys):
            state = tuple(rows.get(k) for k in self.state_keys)
        else:
            state = initial
        is_first = rows.get(self.is_first_key, None)
        if is_first is not None:
            reset = _reset_mask(is_first, (batch,), "is_first")
            state = tuple(
                torch.where(reset.view(-1, *([1] * len(s))), i, h)
                for h, i, s in zip(state, initial, self.state_shapes)
            )
        no_reset = torch.zeros(batch, 1, dtype=torch.bool, device=x.device)
        y, new = _unroll(self.rnn, x.unsqueeze(1), no_reset, state, None, self._layout, "loop")
        for key, used, nxt in zip(self.state_keys, state, new):
            tensordict.set(key, used.reshape(*shape, *used.shape[1:]))
            tensordict.set(unravel_key(("next", key)), nxt.reshape(*shape, *nxt.shape[1:]))
        y = self._layout.output(y)[:, 0]
        tensordict.set(self.out_key, y.reshape(*shape, *y.shape[1:]))
        return tensordict
