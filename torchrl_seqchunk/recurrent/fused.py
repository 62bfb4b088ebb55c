"""The ``fused`` backend: ``nn.GRU`` / ``nn.LSTM`` with resets, backward through time written out.

On CPU, PyTorch differentiates ``nn.GRU`` op by op, several times the forward's cost, and an
unroll with resets inside a chunk cannot use one native call anyway. Here each layer is one
autograd node: the forward steps the native cell kernel (``torch.gru_cell`` /
``torch.lstm_cell``) and keeps the state before every step; the backward recomputes every
gate over the whole chunk in a few batched ops, runs the time recursion on the state
gradients alone (one small matrix product per step) and forms each weight gradient in one
product. A reset costs one select at a step that has one, in each direction; no gradient
flows from a reset step into the state before it, and the gradient there goes to the reset
value (the stored memory). The LSTM layer keeps its gates from the forward instead of
recomputing them and computes ``tanh(a)`` as ``2 sigmoid(2a) - 1`` (several times cheaper on
CPU; an absolute error of about 1e-7 in float32, which is relatively larger on very small
activations).

Limits: the backward is not itself differentiable (``create_graph=True`` raises a
RuntimeError naming ``backend='loop'``), and the layers are classic autograd Functions, not
usable under ``torch.func`` transforms (use ``backend='loop'`` there).

Equations: PyTorch's ``nn.GRU`` and ``nn.LSTM`` (gates r, z, n and i, f, g, o); gradients:
backpropagation through time (Werbos, "Backpropagation through time: what it does and how
to do it", Proc. IEEE, 1990).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def _refuse_double_backward() -> None:
    """The backward below is not differentiable: refuse ``create_graph=True`` (a gradient
    penalty would otherwise see a constant gradient and add nothing, silently)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "the fused backend's backward is not differentiable (create_graph=True, a "
            "double backward or a gradient penalty): pass backend='loop'."
        )


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
    def backward(ctx, dy, dh_last):
        _refuse_double_backward()
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

    Time-major inside. The input's product for every step is one matrix product before the
    loop, each step writes its gates and states into buffers made before it (no list to stack
    after), and the backward recomputes nothing."""

    @staticmethod
    def forward(ctx, x, reset, h0, c0, h_value, c_value, w_ih, w_hh, b_ih, b_hh):
        size = h0.shape[-1]
        # tanh(a) = 2 sigmoid(2 a) - 1, and sigmoid is several times cheaper than tanh on CPU: the
        # g gate's rows are doubled, so one sigmoid over the four gates gives i, f, o and (g + 1) / 2
        double = torch.ones(4 * size, 1, dtype=w_hh.dtype, device=w_hh.device)
        double[2 * size: 3 * size] = 2.0
        time, batch = reset.t().shape
        x_flat = x.transpose(0, 1).reshape(time * batch, x.shape[-1])  # time-major: one 2-D product
        bias = None if b_ih is None else b_ih * double[:, 0]
        gates = F.linear(x_flat, w_ih * double, bias).view(time, batch, 4 * size)
        if b_hh is not None:
            gates += b_hh * double[:, 0]  # [T, B, 4H]: W_ih x + b now, + W_hh h in place at each step
        w_hh_t = (w_hh * double).t()
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        sig, tanh_c = torch.empty_like(gates), gates.new_empty(gates.shape[:-1] + (size,))
        c_after, y = torch.empty_like(tanh_c), torch.empty_like(tanh_c)
        i, f, half_g, o = sig.view(*sig.shape[:-1], 4, size).unbind(-2)
        h, c = h0, c0
        for t in range(time):
            if resets_at[t]:
                # masked_fill, not a product with a 0/1 mask: a NaN or inf must not survive a reset
                h = h.masked_fill(mask[t], 0.0) if h_value is None else torch.where(mask[t], h_value[:, t], h)
                c = c.masked_fill(mask[t], 0.0) if c_value is None else torch.where(mask[t], c_value[:, t], c)
            torch.sigmoid(gates[t].addmm_(h, w_hh_t), out=sig[t])
            # c = f c + i g, with g = 2 half_g - 1
            c = torch.mul(f[t], c, out=c_after[t]).addcmul_(i[t], half_g[t], value=2.0).sub_(i[t])
            half_tanh_c = torch.sigmoid(torch.mul(c, 2.0, out=tanh_c[t]), out=tanh_c[t])
            h = torch.mul(o[t], half_tanh_c, out=y[t]).mul_(2.0).sub_(o[t])  # o tanh(c)
        if any(ctx.needs_input_grad):  # what the backward reads, formed only when there is one
            tanh_c.mul_(2.0).sub_(1.0)
            g = half_g.mul(2.0).sub_(1.0)
            # the states before every step, after its reset: the previous step's, or the reset value
            hp, cp = torch.cat([h0.unsqueeze(0), y[:-1]]), torch.cat([c0.unsqueeze(0), c_after[:-1]])
            hp = hp.masked_fill(mask, 0.0) if h_value is None else torch.where(mask, h_value.transpose(0, 1), hp)
            cp = cp.masked_fill(mask, 0.0) if c_value is None else torch.where(mask, c_value.transpose(0, 1), cp)
            ctx.save_for_backward(x, reset, hp, cp, sig, g, tanh_c, w_ih, w_hh)
            ctx.has_value = h_value is not None
        return y.transpose(0, 1).contiguous(), h, c

    @staticmethod
    def backward(ctx, dy, dh_last, dc_last):
        _refuse_double_backward()
        x, reset, hp, cp, sig, g, tanh_c, w_ih, w_hh = ctx.saved_tensors
        time, batch, size = hp.shape
        i, f, _, o = sig.view(*sig.shape[:-1], 4, size).unbind(-2)
        slope = sig - sig * sig  # sigmoid'(a) = s (1 - s), for i, f and o
        k_h = (1 - tanh_c * tanh_c).mul_(o)  # dc_t += dh_t * k_h
        k_c = torch.empty_like(sig[..., : 3 * size]).view(time, batch, 3, size)  # d(i, f, g) = dc_t * k_c
        torch.mul(g, slope[..., :size], out=k_c[:, :, 0])
        torch.mul(cp, slope[..., size: 2 * size], out=k_c[:, :, 1])
        torch.mul(1 - g * g, i, out=k_c[:, :, 2])
        k_o = tanh_c * slope[..., 3 * size:]  # d o = dh_t * k_o
        d_gates = torch.empty_like(sig).view(time, batch, 4, size)  # [T, B, gates i f g o, H]
        dy = _zero_if_none(dy, hp.transpose(0, 1)).transpose(0, 1)  # [T, B, H]
        dh = _zero_if_none(dh_last, hp[0]) + dy[-1]
        dc = _zero_if_none(dc_last, cp[0])
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        values = [torch.empty_like(hp), torch.empty_like(cp)] if ctx.has_value else None  # zeroed off resets below
        zero = torch.zeros_like(dc)
        for t in range(time - 1, -1, -1):
            dc = torch.addcmul(dc, dh, k_h[t])
            for gate in range(3):  # three products: a broadcast one over [B, 3, H] is several times slower
                torch.mul(dc, k_c[t, :, gate], out=d_gates[t, :, gate])
            torch.mul(dh, k_o[t], out=d_gates[t, :, 3])
            flat = d_gates[t].view(batch, 4 * size)
            below = dy[t - 1] if t else zero  # the gradient on step t - 1's output
            if not resets_at[t]:
                dh, dc = torch.addmm(below, flat, w_hh), dc * f[t]
                continue
            # no gradient from a reset step into the state before it: it goes to the reset value
            dh, dc = flat @ w_hh, dc * f[t]
            if values is not None:
                values[0][t], values[1][t] = dh, dc
            dh, dc = dh.masked_fill_(mask[t], 0.0).add_(below), dc.masked_fill_(mask[t], 0.0)
        d_gates = d_gates.view(time, batch, 4 * size)
        need = ctx.needs_input_grad
        dx, dw_ih, dw_hh, db_ih, db_hh = _weight_grads(need[:1] + need[6:], x.transpose(0, 1), hp,
                                                       (d_gates, d_gates), w_ih)  # time-major
        value_grads = [None, None] if values is None else [v.masked_fill_(~mask, 0.0).transpose(0, 1) for v in values]
        return (None if dx is None else dx.transpose(0, 1), None, dh, dc, *value_grads,
                dw_ih, dw_hh, db_ih, db_hh)
