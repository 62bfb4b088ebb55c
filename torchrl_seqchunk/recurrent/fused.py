"""The ``fused`` backend: ``nn.GRU`` / ``nn.LSTM`` with resets, backward through time written out.

On CPU, PyTorch differentiates ``nn.GRU`` op by op, several times the forward's cost, and an
unroll with resets inside a chunk cannot use one native call anyway. Here each layer is one
autograd node: the forward steps the native cell kernel (``torch.gru_cell`` /
``torch.lstm_cell``) and keeps the state before every step; the backward recomputes every
gate over the whole chunk in a few batched ops, runs the time recursion on the state
gradients alone (one small matrix product per step) and forms each weight gradient in one
product. A reset costs one select at a step that has one, in each direction; no gradient
flows from a reset step into the state before it, and the gradient there goes to the reset
value (the stored memory).

Equations: PyTorch's ``nn.GRU`` and ``nn.LSTM`` (gates r, z, n and i, f, g, o); gradients:
backpropagation through time (Werbos, "Backpropagation through time: what it does and how
to do it", Proc. IEEE, 1990).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


def _fusable(rnn: nn.Module) -> bool:
    """Whether the fused backend runs ``rnn``: an ``nn.GRU``, or an ``nn.LSTM`` without ``proj_size``."""
    return isinstance(rnn, nn.GRU) or (isinstance(rnn, nn.LSTM) and not rnn.proj_size)


def _fused(rnn, x, reset, h0, reset_value):
    """``backend(rnn, x, reset, h0, reset_value) -> (y, h_last)`` of ``backends.py``, one
    autograd node per layer (dropout between layers as ``nn.GRU`` / ``nn.LSTM`` apply it)."""
    layer_fn = _GRULayer if isinstance(rnn, nn.GRU) else _LSTMLayer
    finals = []
    for layer in range(rnn.num_layers):
        weights = [getattr(rnn, f"{name}_l{layer}", None) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        values = [None] * len(h0) if reset_value is None else [v[:, :, layer] for v in reset_value]
        x, *last = layer_fn.apply(x, reset, *[h[:, layer] for h in h0], *values, *weights)
        finals.append(last)
        if rnn.dropout > 0 and rnn.training and layer < rnn.num_layers - 1:
            x = F.dropout(x, rnn.dropout, True)
    return (x,), tuple(torch.stack(entry, 1) for entry in zip(*finals))


def _steps(cell, x, reset, state, reset_value, weights):
    """Step ``cell`` over ``x [B, T, F]``: ``(outputs [B, T, H], the states before every step
    after its reset (one ``[B, T, *S]`` per entry), the state after the last step)``."""
    resets_at = reset.any(0).tolist()  # one host sync; steps where no row resets skip the select
    mask = reset.unsqueeze(-1)
    outputs, before = [], [[] for _ in state]
    for t, x_t in enumerate(x.unbind(1)):
        if resets_at[t]:
            state = tuple(s.masked_fill(mask[:, t], 0.0) if v is None else torch.where(mask[:, t], v[:, t], s)
                          for s, v in zip(state, reset_value))
        for kept, s in zip(before, state):
            kept.append(s)
        state = cell(x_t, state, weights)
        outputs.append(state[0])
    return torch.stack(outputs, 1), [torch.stack(k, 1) for k in before], state


def _gru_cell(x_t, state, weights):
    return (torch.gru_cell(x_t, state[0], *weights),)


def _backward_through_time(step, grads_last, dy, reset, count: int):
    """Run ``step(t, grads) -> grads before step t`` from ``T - 1`` down to 0.

    ``grads_last``: the gradients on the final state's entries; ``dy [B, T, H]`` adds to
    the first entry (the output) at every step. Returns the gradient on each entry after
    every step (``[B, T, *S]`` each), before every step (the same), and on the initial
    state (zero on rows reset at ``t = 0``)."""
    resets_at = reset.any(0).tolist()
    mask = reset.unsqueeze(-1)
    after, before = [[None] * count for _ in grads_last], [[None] * count for _ in grads_last]
    grads = list(grads_last)
    for t in range(count - 1, -1, -1):
        grads[0] = grads[0] + dy[:, t]
        for kept, g in zip(after, grads):
            kept[t] = g
        grads = step(t, grads)
        for kept, g in zip(before, grads):
            kept[t] = g
        if resets_at[t]:
            grads = [g.masked_fill(mask[:, t], 0.0) for g in grads]
    stack = lambda parts: [torch.stack(p, 1) for p in parts]  # noqa: E731
    return stack(after), stack(before), grads


def _reset_value_grad(before, reset, has_value):
    """The reset value's gradient: the gradient on the state before a step, at the rows reset there."""
    return before.masked_fill(~reset.unsqueeze(-1), 0.0) if has_value else None


def _weight_grads(need, x, hp, d_gates, w_ih):
    """dx, dW_ih, dW_hh, db_ih, db_hh (each None where ``need`` says so) from the gradients on
    the pre-activations of ``W_ih x + b_ih`` and of ``W_hh h + b_hh``, ``[B, T, G]`` each."""
    d_gi, d_gh = d_gates
    flat_gi, flat_gh = d_gi.reshape(-1, d_gi.shape[-1]), d_gh.reshape(-1, d_gh.shape[-1])
    return (d_gi @ w_ih if need[0] else None,
            flat_gi.T @ x.reshape(-1, x.shape[-1]) if need[1] else None,
            flat_gh.T @ hp.reshape(-1, hp.shape[-1]) if need[2] else None,
            flat_gi.sum(0) if need[3] else None,
            flat_gh.sum(0) if need[4] else None)


def _zero_if_none(grad, like):
    return torch.zeros_like(like) if grad is None else grad


class _GRULayer(torch.autograd.Function):
    """One GRU layer: ``x [B, T, F]``, ``reset`` bool ``[B, T]``, ``h0 [B, H]``,
    ``reset_value [B, T, H]`` or None (zeros), weights -> ``(y [B, T, H], h_last [B, H])``."""

    @staticmethod
    def forward(ctx, x, reset, h0, reset_value, w_ih, w_hh, b_ih, b_hh):
        y, (hp,), (h_last,) = _steps(_gru_cell, x, reset, (h0,), (reset_value,), (w_ih, w_hh, b_ih, b_hh))
        ctx.save_for_backward(x, reset, hp, w_ih, w_hh, b_ih, b_hh)
        ctx.has_value = reset_value is not None
        return y, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        x, reset, hp, w_ih, w_hh, b_ih, b_hh = ctx.saved_tensors
        size = hp.shape[-1]
        gi, gh = F.linear(x, w_ih, b_ih), F.linear(hp, w_hh, b_hh)  # every gate of the chunk at once
        rz = torch.sigmoid(gi[..., : 2 * size] + gh[..., : 2 * size])
        r, z = rz[..., :size], rz[..., size:]
        gh_n = gh[..., 2 * size:]
        n = torch.tanh(gi[..., 2 * size:] + r * gh_n)
        # dh_t times these is the gradient on each pre-activation of W_hh h (r, z, n)
        k_n = (1 - z) * (1 - n * n)
        k_gh = torch.stack([k_n * gh_n * r * (1 - r), (hp - n) * z * (1 - z), k_n * r], -2)  # [B, T, 3, H]

        def step(t, grads):
            dh = grads[0]
            return [torch.addmm(dh * z[:, t], (dh.unsqueeze(1) * k_gh[:, t]).view(dh.shape[0], -1), w_hh)]

        (after,), (before,), (dh0,) = _backward_through_time(
            step, [_zero_if_none(dh_last, hp[:, 0])], _zero_if_none(dy, hp), reset, hp.shape[1])
        d_gh = (after.unsqueeze(-2) * k_gh).flatten(-2)
        d_gi = torch.cat([d_gh[..., : 2 * size], after * k_n], -1)
        need = ctx.needs_input_grad
        dx, dw_ih, dw_hh, db_ih, db_hh = _weight_grads(need[:1] + need[4:], x, hp, (d_gi, d_gh), w_ih)
        return dx, None, dh0, _reset_value_grad(before, reset, ctx.has_value), dw_ih, dw_hh, db_ih, db_hh


class _LSTMLayer(torch.autograd.Function):
    """One LSTM layer: ``x [B, T, F]``, ``reset`` bool ``[B, T]``, ``h0, c0 [B, H]``, reset
    values ``[B, T, H]`` or None, weights -> ``(y [B, T, H], h_last, c_last [B, H])``.

    The input's product for every step is one matrix product before the loop; the forward
    keeps the gate activations (time-major), so the backward recomputes nothing."""

    @staticmethod
    def forward(ctx, x, reset, h0, c0, h_value, c_value, w_ih, w_hh, b_ih, b_hh):
        size = h0.shape[-1]
        gi = F.linear(x.transpose(0, 1), w_ih, b_ih)  # [T, B, 4H]
        if b_hh is not None:
            gi += b_hh
        w_hh_t = w_hh.t()
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        h, c = h0, c0
        kept = {name: [] for name in ("hp", "cp", "sig", "g", "tanh_c")}
        for t in range(gi.shape[0]):
            if resets_at[t]:
                h = h.masked_fill(mask[t], 0.0) if h_value is None else torch.where(mask[t], h_value[:, t], h)
                c = c.masked_fill(mask[t], 0.0) if c_value is None else torch.where(mask[t], c_value[:, t], c)
            gates = torch.addmm(gi[t], h, w_hh_t)
            sig, g = torch.sigmoid(gates), torch.tanh(gates[:, 2 * size: 3 * size])
            kept["hp"].append(h), kept["cp"].append(c), kept["sig"].append(sig), kept["g"].append(g)
            c = torch.addcmul(sig[:, size: 2 * size] * c, sig[:, :size], g)
            tanh_c = torch.tanh(c)
            h = sig[:, 3 * size:] * tanh_c
            kept["tanh_c"].append(tanh_c)
        hp, cp, sig, g, tanh_c = (torch.stack(kept[name]) for name in kept)  # [T, B, *]
        y = (sig[..., 3 * size:] * tanh_c).transpose(0, 1).contiguous()
        ctx.save_for_backward(x, reset, hp, cp, sig, g, tanh_c, w_ih, w_hh)
        ctx.has_value = h_value is not None
        return y, h, c

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last, dc_last):
        x, reset, hp, cp, sig, g, tanh_c, w_ih, w_hh = ctx.saved_tensors
        size = hp.shape[-1]
        i, f, o = sig[..., :size], sig[..., size: 2 * size], sig[..., 3 * size:]
        k_h = o * (1 - tanh_c * tanh_c)  # dc_t += dh_t * k_h
        k_c = torch.stack([g * i * (1 - i), cp * f * (1 - f), i * (1 - g * g)], -2)  # d(i, f, g) = dc_t * k_c
        k_o = tanh_c * o * (1 - o)  # d o = dh_t * k_o
        d_gates = hp.new_empty(hp.shape[0], hp.shape[1], 4, size)  # [T, B, gates i f g o, H], filled by step

        def step(t, grads):
            dh, dc = grads
            dc = torch.addcmul(dc, dh, k_h[t])
            torch.mul(dc.unsqueeze(1), k_c[t], out=d_gates[t, :, :3])
            torch.mul(dh, k_o[t], out=d_gates[t, :, 3])
            return [d_gates[t].view(-1, 4 * size) @ w_hh, dc * f[t]]

        _, (h_before, c_before), (dh0, dc0) = _backward_through_time(
            step, [_zero_if_none(dh_last, hp[0]), _zero_if_none(dc_last, cp[0])],
            _zero_if_none(dy, hp.transpose(0, 1)), reset, hp.shape[0])
        d_gates = d_gates.view(hp.shape[0], -1, 4 * size)
        need = ctx.needs_input_grad
        dx, dw_ih, dw_hh, db_ih, db_hh = _weight_grads(need[:1] + need[6:], x.transpose(0, 1), hp,
                                                       (d_gates, d_gates), w_ih)  # time-major
        return (None if dx is None else dx.transpose(0, 1), None, dh0, dc0,
                _reset_value_grad(h_before, reset, ctx.has_value), _reset_value_grad(c_before, reset, ctx.has_value),
                dw_ih, dw_hh, db_ih, db_hh)
