"""Backends that run a recurrence over ``[B, T]`` with per-row resets.

Each backend (``_loop``, ``_packed``, ``_scan``, and ``_fused`` in ``fused.py``) is one function
``backend(rnn, x, reset, h0, reset_value) -> (y, h_last)`` on the flat tuple layout
of :mod:`torchrl_seqchunk.recurrent.state`; :func:`_unroll` checks the entry shapes
and dispatches.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .fused import _fusable, _fused
from .state import _Layout

_BACKEND_NAMES = ("auto", "loop", "packed", "scan", "fused")



# ----------------------------------------------------------------------------
# Backends: backend(rnn, x, reset, h0, reset_value) -> (y, h_last)
#   (loop and scan also take the _Layout, which cells cannot tell them)
#   x [B, T, F]; reset bool [B, T]; h0 tuple of [B, *S];
#   reset_value None (zeros) or tuple of [B, T, *S] (expanded views);
#   y tuple of the output entries [B, T, *S] (layout.outputs of them, the first
#   being [B, T, H_out]); h_last tuple of [B, *S].
# ----------------------------------------------------------------------------


def _under_func_transform() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ...) is running: the fused layers
    (classic autograd Functions) cannot run there, nor ``vmap`` the native sequence and LSTM
    cell kernels."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _layer_steps(rnn: nn.Module, layout: _Layout):
    """One step function per layer: ``step(x_t, state_tuple) -> state_tuple``."""
    if isinstance(rnn, (nn.GRU, nn.LSTM)):
        return [lambda x, s, w=weights: _native_step(rnn, x, s, w) for weights in _layer_weights(rnn)]
    output = f"the output of {type(rnn).__name__}"
    return [lambda x, s: layout.flatten(rnn(x, layout.structure(s)), output)]


def _layer_weights(rnn: nn.RNNBase) -> list:
    """Each layer's ``[w_ih, w_hh, b_ih, b_hh, w_hr]`` of an ``nn.GRU`` / ``nn.LSTM`` (``None``
    where it has no bias or projection), read by name (parameters swapped in by TensorDict's
    ``to_module`` or ``torch.func`` are the ones read)."""
    layers = []
    for weights in rnn.all_weights:
        biases = weights[2:4] if rnn.bias else [None, None]
        layers.append([*weights[:2], *biases, weights[-1] if rnn.proj_size else None])
    return layers


def _native_step(rnn: nn.RNNBase, x, state: tuple, weights: list) -> tuple:
    """One layer's step, ``state`` its entries ``(h,)`` or ``(h, c)``, with the native cell kernel."""
    if isinstance(rnn, nn.GRU):
        return (torch.gru_cell(x, state[0], *weights[:4]),)
    return _lstm_step(x, state, weights[:4], weights[4])


def _lstm_step(x, state, weights, proj):
    if proj is None and not _under_func_transform():
        return torch.lstm_cell(x, state, *weights)
    # the native cell cannot project h (proj_size) nor run under vmap: same equations, written out
    w_ih, w_hh, b_ih, b_hh = weights
    gates = F.linear(x, w_ih, b_ih) + F.linear(state[0], w_hh, b_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if proj is None else F.linear(h, proj)), c


def _reset(state, masks, values):
    """Replace the rows of ``state`` selected by ``masks`` by ``values`` (zeros if None)."""
    if values is None:
        return tuple(s.masked_fill(m, 0.0) for s, m in zip(state, masks))
    return tuple(torch.where(m, v, s) for s, m, v in zip(state, masks, values))


def _loop(rnn, x, reset, h0, reset_value, *, layout):
    """Loop over time with the native kernels.

    An ``nn.GRU`` / ``nn.LSTM`` chunk whose resets fall on few time steps (at
    most one reset-free segment per 4 steps) runs one native call per
    segment (not under a ``torch.func`` transform: ``vmap`` has no rule for
    them); otherwise every step runs the native cell kernel.
    """
    if isinstance(rnn, (nn.GRU, nn.LSTM)) and not _under_func_transform():
        bounds = _segment_bounds(reset)
        if _few_segments(bounds, reset):
            return _loop_segments(rnn, x, reset, h0, reset_value, bounds)
    return _loop_steps(rnn, x, reset, h0, reset_value, layout=layout)


def _few_segments(bounds, reset) -> bool:
    """No reset inside the chunk, or at most one reset-free segment per 4 steps: native calls
    per segment beat stepping."""
    segments = len(bounds) - 1
    return segments == 1 or 4 * segments <= reset.shape[1]


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
    # one host sync; steps where no row resets skip the select (under a transform the flags may be
    # batched, with no values to read: every step selects)
    resets_at = [True] * time if _under_func_transform() else reset.any(0).tolist()
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
            if resets_at[t]:
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
    if not batch:  # no row to pack: one native call over the empty batch
        return _loop_segments(rnn, x, reset, h0, reset_value, [0, time])
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
    at ``t`` becomes ``a_t -> 0``, ``b_t -> b_t + a_t * reset_value_t``. Where a coefficient,
    the initial state or a reset value is not finite, the scan keeps it on its side of every
    reset (``0 * inf`` would carry a NaN across), as the per-step loop does, at about 1.4 times
    the scan's time; finite inputs take the cheaper rounds.
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
    inputs = [*a, *b, *h0, *(reset_value or ())]
    if _under_func_transform() or torch.compiler.is_compiling():
        contain = True  # no data-dependent branch there: the containing rounds, always right
    else:  # a NaN or inf makes its sum non-finite (a float overflow of the sum only costs the dearer rounds)
        contain = not bool(torch.isfinite(torch.stack([t.sum() for t in inputs])).all())  # one sync
    states = [_scan_entry(*entry, reset, contain) for entry in zip(a, b, h0, values)]
    return tuple(states[: layout.outputs]), tuple(h[:, -1] for h in states)


def _scan_entry(a, b, h0, reset_value, reset, contain: bool = False):
    """One entry of :func:`_scan`: ``a, b [B, T, *S]``, ``h0 [B, *S]`` -> ``h [B, T, *S]``;
    ``contain``: a non-finite value stays on its side of a reset (two more ops a round; a
    coefficient that underflows to 0 inside an episode still reads, as without)."""
    mask = reset.view(*reset.shape, *([1] * (h0.dim() - 1)))
    if reset_value is not None:
        b = torch.where(mask, torch.addcmul(b, a, reset_value), b)
    a = a.masked_fill(mask, 0.0)
    # h0 becomes step -1 with a = 0, so the scan needs no special first step; a row
    # reset at t = 0 never reads h0 (0 * nan would still be nan).
    a = torch.cat([torch.zeros_like(h0).unsqueeze(1), a], 1)
    b = torch.cat([h0.masked_fill(mask[:, 0], 0.0).unsqueeze(1), b], 1)
    crossed = torch.cat([torch.zeros_like(mask[:, :1]), mask], 1) if contain else None  # a reset in a's span
    span = 1
    while span < b.shape[1]:
        reads = torch.addcmul(b[:, span:], a[:, span:], b[:, :-span])
        if contain:  # across a reset nothing before is read: its 0 times an inf would be nan
            reads = torch.where(crossed[:, span:], b[:, span:], reads)
            crossed = torch.cat([crossed[:, :span], crossed[:, span:] | crossed[:, :-span]], 1)
        b = torch.cat([b[:, :span], reads], 1)
        a = torch.cat([a[:, :span], a[:, span:] * a[:, :-span]], 1)
        span *= 2
    return b[:, 1:]


# fused beats loop for an nn.GRU on CPU with up to this many rows, at any hidden size measured, and at
# up to _FUSED_GRU_MAX_WIDTH rows times hidden units (measured, one thread, forward + backward over T=64,
# a reset every 20 / 200 steps per row, fused over loop: B=4 H=2048 0.20x to 0.23x, B=8 H=64 to 512 0.45x
# to 0.65x, B=16 H=1024 0.39x to 0.62x, B=32 H=64 to 1024 0.56x to 0.93x, B=64 H=64 0.77x to 0.90x; past
# both, B=64 H=128 to 512 0.97x to 1.23x, B=128 H=128 1.23x to 1.28x)
_FUSED_GRU_MAX_ROWS = 32
_FUSED_GRU_MAX_WIDTH = 4096


def _pick_backend(rnn: nn.Module, device: torch.device, reset: torch.Tensor) -> str:
    if not isinstance(rnn, (nn.GRU, nn.LSTM)) and hasattr(rnn, "linear_coefficients"):
        return "scan"
    if _under_func_transform():
        return "loop"
    if isinstance(rnn, (nn.GRU, nn.LSTM)) and device.type == "cuda":
        return "packed"
    if device.type != "cpu":  # the picks below were measured on CPU; elsewhere the native cells
        return "loop"
    # small CPU batches: PyTorch's own GRU backward runs op by op, the fused one batches it
    rows = reset.shape[0]
    if isinstance(rnn, nn.GRU) and (rows <= _FUSED_GRU_MAX_ROWS or rows * rnn.hidden_size <= _FUSED_GRU_MAX_WIDTH):
        return "fused"
    # an LSTM with resets on most steps: the fused backward beats stepping the cell (measured, one
    # thread, forward + backward over nn.LSTM without resets: B=32 T=64 H=256 1.6x to 1.7x against
    # 2.0x, B=8 T=32 H=64 4.0x against 5.6x); with few reset steps the loop's native segments win
    if isinstance(rnn, nn.LSTM) and _fusable(rnn) and not _few_segments(_segment_bounds(reset), reset):
        return "fused"
    return "loop"



def _check_inputs(rnn: nn.Module, x, h0: tuple, reset_state) -> None:
    """A ValueError where ``x``'s features are not a torch RNN's ``input_size`` (the kernels'
    "mat1 and mat2" error named nothing), a TypeError where ``x``, ``h0`` or ``reset_state`` is
    not in the dtype of its parameters (or, under autocast, its lower precision): the backends
    differ there (``fused`` casts, the native kernels refuse), so the same call would cast or
    fail depending on the batch's size."""
    if not isinstance(rnn, (nn.RNNBase, nn.RNNCellBase)):
        return
    if x.shape[-1] != rnn.input_size:
        raise ValueError(
            f"x has {x.shape[-1]} features (its last dim), the {type(rnn).__name__}'s input_size is "
            f"{rnn.input_size} (with ResetRNN: x is its in_key input); feed {rnn.input_size} features "
            "or build the rnn with this input_size."
        )
    dtype = next(rnn.parameters()).dtype
    device = x.device.type
    # under autocast, float32 too: autocast casts it (a lower-precision module fed float32)
    allowed = {dtype, torch.get_autocast_dtype(device), torch.float32} if torch.is_autocast_enabled(device) else {dtype}
    for name, tensors in (("x", (x,)), ("h0", h0), ("reset_state", reset_state or ())):
        for tensor in tensors:
            if tensor.dtype not in allowed:
                raise TypeError(
                    f"{name} is {tensor.dtype}, the {type(rnn).__name__}'s parameters {dtype} (with ResetRNN: "
                    f"x is its in_key input, h0 the state it starts from, reset_state the stored memory): "
                    f"cast the tensor (.to({dtype})) or the rnn (.to({tensor.dtype}))."
                )


def _expanded_reset_state(reset_state, layout: _Layout, batch: int, time: int):
    """``reset_state`` (``None`` or entries ``[*S]`` / ``[B or 1, T or 1, *S]``) expanded to
    ``[B, T, *S]`` per entry; a ValueError naming the shapes for anything else."""
    if reset_state is None:
        return None
    # [*S] or [B or 1, T or 1, *S]: a [B, *S] entry would broadcast along T where B == T
    given = [list(v.shape) for v in reset_state]
    fits = all(v.dim() in (len(shape), len(shape) + 2) for v, shape in zip(reset_state, layout.shapes))
    try:
        reset_state = tuple(v if v.shape == (batch, time, *shape) else v.expand(batch, time, *shape)
                            for v, shape in zip(reset_state, layout.shapes))
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"reset_state entries must be [*S] or broadcast from [B or 1, T or 1, *S] to [B, T, *S] = "
            f"{[[batch, time, *shape] for shape in layout.shapes]}, got {given}; give a per-row state as "
            "state.unsqueeze(1) ([B, 1, *S])."
        )
    return reset_state


def _unroll(rnn, x, reset, h0, reset_state, layout: _Layout, backend: str):
    """:func:`rnn_with_resets` on flat states: checks entry shapes, runs the backend.

    ``h0`` a tuple of ``[B, *S]``, ``reset_state`` ``None`` or a tuple of tensors
    broadcastable to ``[B, T, *S]``; returns ``(y entries, h_last tuple)``.
    """
    batch, time = reset.shape
    if not time:
        raise ValueError(
            f"x has no time step (shape {list(x.shape)}, T = 0): an unroll needs T >= 1; "
            "skip empty chunks before calling."
        )
    for h, shape in zip(h0, layout.shapes):
        if h.shape != (batch, *shape):
            raise ValueError(
                f"h0 entries must have shape {[batch, *shape]}, got {list(h.shape)}; "
                "states are batch first (see the module docstring)."
            )
    reset_state = _expanded_reset_state(reset_state, layout, batch, time)
    _check_inputs(rnn, x, h0, reset_state)
    if backend == "auto":
        backend = _pick_backend(rnn, x.device, reset)
    if backend == "loop":
        return _loop(rnn, x, reset, h0, reset_state, layout=layout)
    if backend in ("packed", "fused") and _under_func_transform():
        raise RuntimeError(
            f"backend={backend!r} cannot run under a torch.func transform (vmap, grad, an ensemble "
            "through functional_call): " + ("its layers are classic autograd Functions" if backend == "fused"
                                            else "vmap has no rule for packed sequences")
            + ". Use backend='loop', or 'auto', which picks it there."
        )
    if backend == "packed":
        return _packed(rnn, x, reset, h0, reset_state)
    if backend == "fused":
        if not _fusable(rnn):
            raise TypeError(
                f"backend='fused' needs an nn.GRU or an nn.LSTM without proj_size, got "
                f"{type(rnn).__name__}; use backend='loop'."
            )
        return _fused(rnn, x, reset, h0, reset_state)
    return _scan(rnn, x, reset, h0, reset_state, layout=layout)
