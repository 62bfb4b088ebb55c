"""The ``fused`` backend: ``nn.GRU`` / ``nn.LSTM`` with resets, backward through time written out.

On CPU, PyTorch differentiates ``nn.GRU`` op by op, several times the forward's cost, and an
unroll with resets inside a chunk cannot use one native call anyway. Here each layer is one
autograd node, time-major inside: the forward forms the input's product for every step in
one matrix product, then steps the recurrence (one small matrix product and a few
element-wise ops per step, written into buffers made before the loop) and keeps every gate;
the backward runs the time recursion on the state gradients alone (one small matrix product
per step) and forms each weight gradient in one product. A reset costs one select at a step
that has one, in each direction; no gradient flows from a reset step into the state before
it, and the gradient there goes to the reset value (the stored memory).

A double backward (``create_graph=True``: a gradient penalty, second-order meta-learning) gets
gradients that are themselves differentiable: the backward then replays the layer step by step
with the native cell (``torch.gru_cell`` / ``torch.lstm_cell``, as the ``loop`` backend steps)
and differentiates that, at the ``loop`` backend's cost (an initial state, stored memory or bias
changed in place between the forward and such a backward is a RuntimeError; a first-order
backward does not read them). Limits: a backward vectorized by ``vmap``
(``is_grads_batched=True``) raises a RuntimeError naming ``backend='loop'``, and the layers are
classic autograd Functions, not usable under ``torch.func`` transforms (``auto`` picks ``loop``
there; ``fused`` raises). Under autocast they run
in the weights' dtype (inputs cast to it), not in the lower precision.

Equations: PyTorch's ``nn.GRU`` and ``nn.LSTM`` (gates r, z, n and i, f, g, o); gradients:
backpropagation through time (Werbos, "Backpropagation through time: what it does and how
to do it", Proc. IEEE, 1990).
"""
from __future__ import annotations

import contextlib

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
    # in the weights' dtype, autocast off: its lower-precision products would not match the
    # layers' buffers and states
    dtype = rnn.weight_hh_l0.dtype
    x, h0 = x.to(dtype), tuple(h.to(dtype) for h in h0)
    finals = []
    device = x.device.type
    with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else contextlib.nullcontext():
        for layer, weights in enumerate(rnn.all_weights):
            weights = weights + [None] * (4 - len(weights))  # without biases: None
            values = [None] * len(h0) if reset_value is None else [v[:, :, layer].to(dtype) for v in reset_value]
            x, *last = layer_fn.apply(x, reset, *[h[:, layer] for h in h0], *values, *weights)
            finals.append(last)
            if rnn.dropout > 0 and rnn.training and layer < rnn.num_layers - 1:
                x = F.dropout(x, rnn.dropout, True)
    return (x,), tuple(torch.stack(entry, 1) for entry in zip(*finals))


def _weight_grads(need, x, hp, d_gates, w_ih):
    """dx, dW_ih, dW_hh, db_ih, db_hh (each None where ``need`` says so) from the gradients on
    the pre-activations of ``W_ih x + b_ih`` and of ``W_hh h + b_hh``, ``[B, T, G]`` each."""
    d_gi, d_gh = d_gates
    flat_gi, flat_gh = d_gi.reshape(-1, d_gi.shape[-1]), d_gh.reshape(-1, d_gh.shape[-1])
    db_ih, db_hh = flat_gi.sum(0) if need[3] else None, None
    if need[4]:  # the LSTM's two biases get the same gradient: summed once, each its own tensor
        db_hh = db_ih.clone() if db_ih is not None and d_gh is d_gi else flat_gh.sum(0)
    return (d_gi @ w_ih if need[0] else None,
            flat_gi.T @ x.reshape(-1, x.shape[-1]) if need[1] else None,
            flat_gh.T @ hp.reshape(-1, hp.shape[-1]) if need[2] else None,
            db_ih, db_hh)


def _refuse_unsupported_backward(*grads) -> None:
    """Refuses a backward vectorized by ``vmap`` (``is_grads_batched=True``,
    ``jacobian(vectorize=True)``): the layers' backward has no batching rule."""
    functorch = torch._C._functorch
    if functorch.peek_interpreter_stack() is not None or any(
            g is not None and functorch.is_legacy_batchedtensor(g) for g in grads):
        raise RuntimeError(
            "the fused backend's backward cannot run under vmap (autograd.grad(..., "
            "is_grads_batched=True), jacobian(..., vectorize=True)): pass backend='loop'."
        )


def _reset_step(state, mask_t, value, t: int):
    """``state [B, H]`` with the rows of ``mask_t [B, 1]`` replaced by ``value[:, t]`` (zeros if
    ``value`` is None); ``masked_fill``, not a product with a 0/1 mask: a NaN or inf must not
    survive a reset."""
    return state.masked_fill(mask_t, 0.0) if value is None else torch.where(mask_t, value[:, t], state)


def _states_before(first, after, mask, value):
    """The state before every step, after its reset: ``first [B, H]`` at step 0, then the state
    after the step before (``after [T, B, H]``), replaced by ``value [B, T, H]`` (zeros if None)
    where ``mask [T, B, 1]`` resets. Time-major ``[T, B, H]``."""
    before = torch.cat([first.unsqueeze(0), after[:-1]])
    return before.masked_fill(mask, 0.0) if value is None else torch.where(mask, value.transpose(0, 1), before)


def _own(tensor):
    """A contiguous copy: a layer's outputs must not be views of its buffers (nor of each other),
    or autograd refuses in-place ops on them (``.contiguous()`` returns the buffer itself when
    ``B`` or ``T`` is 1)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def _sigmoid_grad(a, s, out=None):
    """``a * s * (1 - s)`` (``a`` times the sigmoid's slope at its output ``s``) in one pass."""
    if out is None:
        return torch.ops.aten.sigmoid_backward(a, s)
    return torch.ops.aten.sigmoid_backward.grad_input(a, s, grad_input=out)


def _tanh_grad(a, t, out=None):
    """``a * (1 - t * t)`` (``a`` times the tanh's slope at its output ``t``) in one pass."""
    if out is None:
        return torch.ops.aten.tanh_backward(a, t)
    return torch.ops.aten.tanh_backward.grad_input(a, t, grad_input=out)


def _zero_if_none(grad, like):
    return torch.zeros_like(like) if grad is None else grad


def _gru_replay(x, reset, h0, reset_value, w_ih, w_hh, b_ih, b_hh):
    """The GRU layer's outputs ``(y [B, T, H], h_last)`` stepped with ``torch.gru_cell``: differentiable twice."""
    h, ys = h0, []
    for t in range(x.shape[1]):
        h = torch.gru_cell(x[:, t], _reset_step(h, reset[:, t, None], reset_value, t), w_ih, w_hh, b_ih, b_hh)
        ys.append(h)
    return torch.stack(ys, 1), h


def _lstm_replay(x, reset, h0, c0, h_value, c_value, w_ih, w_hh, b_ih, b_hh):
    """The LSTM layer's outputs ``(y [B, T, H], h_last, c_last)`` stepped with ``torch.lstm_cell``."""
    h, c, ys = h0, c0, []
    for t in range(x.shape[1]):
        mask = reset[:, t, None]
        state = (_reset_step(h, mask, h_value, t), _reset_step(c, mask, c_value, t))
        h, c = torch.lstm_cell(x[:, t], state, w_ih, w_hh, b_ih, b_hh)
        ys.append(h)
    return torch.stack(ys, 1), h, c


def _keep_for_replay(*tensors) -> list:
    """Inputs that only a double backward reads (the layer's replay), kept with their versions:
    not saved for the backward, so that a first-order backward works whatever happens to them in
    place after the forward (as the loop backend's does with the stored memory)."""
    return [(t, None if t is None else t._version) for t in tensors]


def _kept_for_replay(kept: list) -> list:
    """:func:`_keep_for_replay`'s tensors; a RuntimeError if one was changed in place since the forward."""
    if any(t is not None and t._version != version for t, version in kept):
        raise RuntimeError(
            "an input of a fused recurrent layer (its initial state, stored memory or bias) was modified "
            "in place after the forward; a double backward (create_graph=True) replays the layer from it. "
            "Modify a copy (clone()), or run the double backward before the change.")
    return [t for t, _ in kept]


def _replayed_grads(replay, inputs, need, output_grads):
    """The gradients of a double backward (``create_graph=True``): ``replay(*inputs)`` differentiated
    with ``create_graph=True``, so that they are differentiable in the inputs and in ``output_grads``."""
    wanted = [i for i, (tensor, needed) in enumerate(zip(inputs, need)) if needed and tensor is not None]
    with torch.enable_grad():
        outputs = replay(*inputs)
        found = torch.autograd.grad(outputs, [inputs[i] for i in wanted],
                                    [_zero_if_none(g, out) for g, out in zip(output_grads, outputs)],
                                    create_graph=True, allow_unused=True)
    grads = [None] * len(inputs)
    for i, grad in zip(wanted, found):
        grads[i] = _zero_if_none(grad, inputs[i])
    return tuple(grads)


class _GRULayer(torch.autograd.Function):
    """One GRU layer: ``x [B, T, F]``, ``reset`` bool ``[B, T]``, ``h0 [B, H]``,
    ``reset_value [B, T, H]`` or None (zeros), weights -> ``(y [B, T, H], h_last [B, H])``.

    Time-major inside, as the LSTM layer: the input's product for every step is one matrix
    product before the loop, each step writes its gates into buffers made before it, and the
    backward recomputes no gate."""

    @staticmethod
    def forward(ctx, x, reset, h0, reset_value, w_ih, w_hh, b_ih, b_hh):
        size = h0.shape[-1]
        gi = F.linear(x.transpose(0, 1), w_ih, b_ih)  # [T, B, 3H]: W_ih x + b_ih of every step at once
        time, batch = gi.shape[:2]
        gh = torch.empty_like(gi)  # W_hh h + b_hh, written at each step
        rz, n, y = gi.new_empty(time, batch, 2 * size), gi.new_empty(time, batch, size), gi.new_empty(time, batch, size)
        gh_n = gh[..., 2 * size:]
        # every step's views at once (one call each, not one index per step and tensor)
        gi_rz, gi_n = gi[..., : 2 * size].unbind(0), gi[..., 2 * size:].unbind(0)
        gh_t, gh_rz, gh_n_t = gh.unbind(0), gh[..., : 2 * size].unbind(0), gh_n.unbind(0)
        rz_t, r, z, n_t, y_t = rz.unbind(0), rz[..., :size].unbind(0), rz[..., size:].unbind(0), n.unbind(0), y.unbind(0)
        w_hh_t = w_hh.t().contiguous()
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        h = h0
        for t in range(time):
            if resets_at[t]:
                h = _reset_step(h, mask[t], reset_value, t)
            if b_hh is None:
                torch.mm(h, w_hh_t, out=gh_t[t])
            else:
                torch.addmm(b_hh, h, w_hh_t, out=gh_t[t])
            torch.sigmoid(torch.add(gi_rz[t], gh_rz[t], out=rz_t[t]), out=rz_t[t])  # r, z
            torch.tanh(torch.addcmul(gi_n[t], r[t], gh_n_t[t], out=n_t[t]), out=n_t[t])  # n = tanh(gi_n + r gh_n)
            h = torch.lerp(n_t[t], h, z[t], out=y_t[t])  # (1 - z) n + z h
        if any(ctx.needs_input_grad):  # what the backward reads, formed only when there is one
            hp = _states_before(h0, y, mask, reset_value)
            ctx.save_for_backward(hp, rz, n, gh_n, x, reset, w_ih, w_hh)
            ctx.replay_only = _keep_for_replay(h0, reset_value, b_ih, b_hh)
            ctx.has_value = reset_value is not None
        return _own(y.transpose(0, 1)), _own(h)

    @staticmethod
    def backward(ctx, dy, dh_last):
        _refuse_unsupported_backward(dy, dh_last)
        hp, rz, n, gh_n, x, reset, w_ih, w_hh = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            h0, reset_value, b_ih, b_hh = _kept_for_replay(ctx.replay_only)
            return _replayed_grads(_gru_replay, (x, reset, h0, reset_value, w_ih, w_hh, b_ih, b_hh),
                                   ctx.needs_input_grad, (dy, dh_last))
        time, batch, size = hp.shape
        r, z = rz[..., :size], rz[..., size:]
        # dh_t times these is the gradient on each pre-activation of W_hh h (r, z, n) (at the main
        # job's sizes the LSTM layer's one-pass kernels gain nothing here, and would change its runs'
        # rounding)
        k_n = (1 - z) * (1 - n * n)
        k_gh = torch.stack([k_n * gh_n * r * (1 - r), (hp - n) * z * (1 - z), k_n * r], -2)  # [T, B, 3, H]
        d_gh = torch.empty_like(k_gh)
        dy = _zero_if_none(dy, hp.transpose(0, 1)).transpose(0, 1)  # [T, B, H]
        dh = _zero_if_none(dh_last, hp[0]) + dy[-1]
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        values = torch.empty_like(hp) if ctx.has_value else None  # zeroed off resets below
        zero = torch.zeros_like(dh)
        after = [None] * time  # the gradient on each step's output h_t, all of it
        k_gh_t, d_gh_t, flat_t = k_gh.unbind(0), d_gh.unbind(0), d_gh.view(time, batch, 3 * size).unbind(0)
        z_t, below_t = z.unbind(0), (zero, *dy[:-1].unbind(0))  # below: the gradient on step t - 1's output
        for t in range(time - 1, -1, -1):
            after[t] = dh
            torch.mul(dh.unsqueeze(1), k_gh_t[t], out=d_gh_t[t])
            if not resets_at[t]:
                dh = torch.addmm(torch.addcmul(below_t[t], dh, z_t[t]), flat_t[t], w_hh)
                continue
            # no gradient from a reset step into the state before it: it goes to the reset value
            dh = torch.addmm(dh * z_t[t], flat_t[t], w_hh)
            if values is not None:
                values[t] = dh
            dh = dh.masked_fill_(mask[t], 0.0).add_(below_t[t])
        d_gh = d_gh.view(time, batch, 3 * size)
        d_gi = torch.cat([d_gh[..., : 2 * size], torch.stack(after) * k_n], -1)
        need = ctx.needs_input_grad
        dx, dw_ih, dw_hh, db_ih, db_hh = _weight_grads(need[:1] + need[4:], x.transpose(0, 1), hp,
                                                       (d_gi, d_gh), w_ih)  # time-major
        value_grad = None if values is None else values.masked_fill_(~mask, 0.0).transpose(0, 1)
        return (None if dx is None else dx.transpose(0, 1), None, dh, value_grad, dw_ih, dw_hh, db_ih, db_hh)


class _LSTMLayer(torch.autograd.Function):
    """One LSTM layer: ``x [B, T, F]``, ``reset`` bool ``[B, T]``, ``h0, c0 [B, H]``, reset
    values ``[B, T, H]`` or None, weights -> ``(y [B, T, H], h_last, c_last [B, H])``.

    Time-major inside. The input's product for every step is one matrix product before the
    loop, each step writes its gates and states into buffers made before it (no list to stack
    after), and the backward recomputes nothing."""

    @staticmethod
    def forward(ctx, x, reset, h0, c0, h_value, c_value, w_ih, w_hh, b_ih, b_hh):
        size = h0.shape[-1]
        time, batch = reset.t().shape
        x_flat = x.transpose(0, 1).reshape(time * batch, x.shape[-1])  # time-major: one 2-D product
        gates = F.linear(x_flat, w_ih, b_ih).view(time, batch, 4 * size)
        if b_hh is not None:
            gates += b_hh  # [T, B, 4H]: W_ih x + b now, + W_hh h in place at each step
        w_hh_t = w_hh.t().contiguous()
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        # act: sigmoid of the i, f and o gates, tanh of g (one sigmoid over the four, g overwritten)
        act, tanh_c = torch.empty_like(gates), gates.new_empty(gates.shape[:-1] + (size,))
        c_after, y = torch.empty_like(tanh_c), torch.empty_like(tanh_c)
        i, f, g, o = act.view(*act.shape[:-1], 4, size).unbind(-2)
        # every step's views at once (one call each, not one index per step and tensor)
        gates_t, act_t, c_after_t, tanh_c_t, y_t = (v.unbind(0) for v in (gates, act, c_after, tanh_c, y))
        i_t, f_t, g_t, o_t = (v.unbind(0) for v in (i, f, g, o))
        g_in_t = gates.view(time, batch, 4, size)[:, :, 2].unbind(0)
        h, c = h0, c0
        for t in range(time):
            if resets_at[t]:
                h, c = _reset_step(h, mask[t], h_value, t), _reset_step(c, mask[t], c_value, t)
            torch.sigmoid(gates_t[t].addmm_(h, w_hh_t), out=act_t[t])
            torch.tanh(g_in_t[t], out=g_t[t])
            c = torch.mul(f_t[t], c, out=c_after_t[t]).addcmul_(i_t[t], g_t[t])  # f c + i g
            h = torch.mul(o_t[t], torch.tanh(c, out=tanh_c_t[t]), out=y_t[t])  # o tanh(c)
        if any(ctx.needs_input_grad):  # what the backward reads, formed only when there is one
            hp, cp = _states_before(h0, y, mask, h_value), _states_before(c0, c_after, mask, c_value)
            ctx.save_for_backward(hp, cp, act, g, tanh_c, x, reset, w_ih, w_hh)
            ctx.replay_only = _keep_for_replay(h0, c0, h_value, c_value, b_ih, b_hh)
            ctx.has_value = h_value is not None
        return _own(y.transpose(0, 1)), _own(h), _own(c)

    @staticmethod
    def backward(ctx, dy, dh_last, dc_last):
        _refuse_unsupported_backward(dy, dh_last, dc_last)
        hp, cp, sig, g, tanh_c, x, reset, w_ih, w_hh = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            h0, c0, h_value, c_value, b_ih, b_hh = _kept_for_replay(ctx.replay_only)
            return _replayed_grads(_lstm_replay, (x, reset, h0, c0, h_value, c_value, w_ih, w_hh, b_ih, b_hh),
                                   ctx.needs_input_grad, (dy, dh_last, dc_last))
        time, batch, size = hp.shape
        i, f, _, o = sig.view(*sig.shape[:-1], 4, size).unbind(-2)
        # each factor in one pass by torch's fused derivative kernels: sigmoid_backward(a, s) =
        # a s (1 - s), tanh_backward(a, t) = a (1 - t^2)
        k_h = _tanh_grad(o, tanh_c)  # dc_t += dh_t * k_h
        k_c = hp.new_empty(time, batch, 3, size)  # d(i, f, g) = dc_t * k_c
        _sigmoid_grad(g, i, out=k_c[:, :, 0])
        _sigmoid_grad(cp, f, out=k_c[:, :, 1])
        _tanh_grad(i, g, out=k_c[:, :, 2])
        k_o = _sigmoid_grad(tanh_c, o)  # d o = dh_t * k_o
        d_gates = torch.empty_like(sig).view(time, batch, 4, size)  # [T, B, gates i f g o, H]
        dy = _zero_if_none(dy, hp.transpose(0, 1)).transpose(0, 1)  # [T, B, H]
        dh = _zero_if_none(dh_last, hp[0]) + dy[-1]
        dc = _zero_if_none(dc_last, cp[0])
        resets_at = reset.any(0).tolist()
        mask = reset.t().unsqueeze(-1)  # [T, B, 1]
        values = [torch.empty_like(hp), torch.empty_like(cp)] if ctx.has_value else None  # zeroed off resets below
        zero = torch.zeros_like(dc)
        # every step's views at once; below: the gradient on step t - 1's output
        k_h_t, k_o_t, f_t, below_t = k_h.unbind(0), k_o.unbind(0), f.unbind(0), (zero, *dy[:-1].unbind(0))
        k_c_t = [k_c[:, :, gate].unbind(0) for gate in range(3)]
        d_gates_t = [d_gates[:, :, gate].unbind(0) for gate in range(4)]
        flat_t = d_gates.view(time, batch, 4 * size).unbind(0)
        for t in range(time - 1, -1, -1):
            dc = torch.addcmul(dc, dh, k_h_t[t])
            for gate in range(3):  # three products: a broadcast one over [B, 3, H] is several times slower
                torch.mul(dc, k_c_t[gate][t], out=d_gates_t[gate][t])
            torch.mul(dh, k_o_t[t], out=d_gates_t[3][t])
            below = below_t[t]
            if not resets_at[t]:
                dh, dc = torch.addmm(below, flat_t[t], w_hh), dc * f_t[t]
                continue
            # no gradient from a reset step into the state before it: it goes to the reset value
            dh, dc = flat_t[t] @ w_hh, dc * f_t[t]
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
