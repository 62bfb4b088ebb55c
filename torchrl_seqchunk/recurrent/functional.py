"""Functional core: :func:`rnn_with_resets` for users outside TensorDict.

Row ``b`` of a ``[B, T]`` batch replaces its recurrent state at every step where
``is_first[b, t]`` is set (zeros, a learned initial state, or a stored per-step
value) and carries it otherwise.
"""
from __future__ import annotations

import torch
from torch import nn

from .backends import _BACKEND_NAMES, _unroll
from .state import _reset_mask, _shape_spec, _state_layout

__all__ = ["rnn_with_resets"]



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
            resets, structured like ``h0``, per entry ``[*S]`` (a learned initial
            state) or ``[B, T, *S]`` (a per-step stored memory; ``B`` or ``T`` may be
            1 to broadcast, e.g. ``[B, 1, *S]`` per row); zeros if omitted.

    Keyword Args:
        backend (str): ``"loop"`` (native kernels step by step, or one native
            call per reset-free time segment when resets fall on few steps; any
            rnn), ``"fused"`` (``nn.GRU`` / ``nn.LSTM`` without ``proj_size``: one
            autograd node per layer whose backward through time is written out;
            the CPU path for ``nn.GRU`` batches of ``B <= 32`` or ``B * H <= 4096``, where
            PyTorch's own CPU backward runs op by op, and for ``nn.LSTM`` with
            resets on most steps; a double backward replays the layer with
            the native cells, at ``loop``'s cost; no ``torch.func``: a
            RuntimeError names the fix),
            ``"packed"`` (reset-free row segments in one packed native call; the
            GPU path, ``nn.GRU``/``nn.LSTM`` only), ``"scan"`` (parallel prefix
            scan, only for cells with ``linear_coefficients(x) -> (a, b)``, ``a``
            and ``b`` ``[B, T]`` structured like the state, such as
            :class:`MinGRUCell`) or ``"auto"`` (``scan`` if possible, else ``loop``
            under a ``torch.func`` transform, else
            ``packed`` on CUDA for ``nn.GRU``/``nn.LSTM``, else on CPU ``fused`` for
            ``nn.GRU`` with ``B <= 32`` or ``B * H <= 4096`` and for an ``nn.LSTM`` without
            ``proj_size`` whose resets split the chunk into more than one
            segment per 4 steps, else ``loop``). Default ``"auto"``.

    Returns:
        ``(y, h_last)``: ``y`` is ``[B, T, H_out]`` (a TensorDict ``[B, T]`` of
        every state entry for a TensorDict state); ``h_last`` is the state after
        the last step, structured like ``h0`` (a TensorDict with batch ``[B]``).

    Raises:
        TypeError: unsupported ``rnn``, a backend that cannot run it (``packed``
            or ``fused`` for a cell, ``fused`` for an LSTM with ``proj_size``,
            ``scan`` for a cell without ``linear_coefficients``), non-tensor
            inputs, or for an ``nn.GRU`` / ``nn.LSTM`` / torch cell an ``x``, ``h0``
            or ``reset_state`` not in its parameters' dtype (under autocast, nor in
            autocast's dtype or float32).
        ValueError: wrong shapes (also ``T = 0``; ``B = 0`` is fine), TensorDict
            states whose keys differ, unknown ``backend``, a bidirectional ``rnn``.
        RuntimeError: ``backend="fused"`` under a ``torch.func`` transform.

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
