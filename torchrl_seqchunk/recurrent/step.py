"""Step mode's inputs: the episode-start flags and the previous state, checked and reset.

:class:`~torchrl_seqchunk.ResetRNN` acts one step of each env at a time; these read what
the env (its ``InitTracker`` and the module's primer) wrote, and name what is missing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import nn

from .backends import _check_inputs, _layer_steps, _layer_weights, _native_step
from .state import _Layout, _reset_mask


def step_flags(rows: TensorDictBase, init_key, is_first_key) -> torch.Tensor:
    """bool ``[N]``: where an episode starts, from ``init_key``, else ``is_first_key``."""
    flags = rows.get(init_key, None)
    if flags is None:
        flags = rows.get(is_first_key, None)
    if flags is None:
        raise ValueError(
            f"step mode needs the episode-start flags {init_key!r} (or {is_first_key!r}), absent "
            f"from the input (its keys: {sorted(map(str, rows.keys(True, True)))}). Add TorchRL's "
            "InitTracker() to the env, or let the collector add it "
            "(auto_register_policy_transforms=True)."
        )
    return _reset_mask(flags, (rows.shape[0],), "is_first")


def state_entries(state, keys: list, batch: int) -> list:
    """A plain-tensor step's ``state`` (None, or one ``[N, *S]`` tensor per entry of ``keys``)
    as a list of entries (None where absent); a ValueError for anything else."""
    if state is None:
        return [None] * len(keys)
    if (not isinstance(state, (tuple, list)) or len(state) != len(keys)
            or any(s is not None and s.shape[0] != batch for s in state)):
        got = type(state).__name__ + (f" of {len(state)}" if isinstance(state, (tuple, list)) else "")
        raise ValueError(f"state must be a tuple of {len(keys)} tensors [N={batch}, *S], one per entry of "
                         f"state_keys {keys}, or None; got {got}.")
    return list(state)


def step_state(stored: list, reset, initial, keys: list, shapes: list, dtype, batch_shape) -> tuple:
    """The state each row starts its step from: the stored one, the initial one where ``reset``.

    ``stored`` holds each state entry ``[N, *S]`` (or ``None`` where absent), named by ``keys``;
    ``initial`` is ``None`` (zeros) or a tuple of one row's learned initial entries ``[*S]``.
    Raises ``ValueError`` for an entry absent where a row does not reset or of the wrong
    shape, ``TypeError`` for an entry of another dtype than ``dtype``.
    """
    missing = [k for k, h in zip(keys, stored) if h is None]
    if missing and not bool(reset.all()):
        raise ValueError(
            f"state entry {missing[0]!r} is absent at a step that is not an episode start "
            f"({int((~reset).sum())} of {reset.numel()} row(s) do not reset): the memory would "
            "restart from the initial state at every step. Append "
            "module.make_tensordict_primer() to the env (TransformedEnv) so that the state "
            "travels from step to step, also through SerialEnv / ParallelEnv."
        )
    if missing:  # every row resets
        batch = reset.shape[0]
        if initial is None:
            return tuple(torch.zeros(batch, *s, dtype=dtype, device=reset.device) for s in shapes)
        return tuple(p.expand(batch, *p.shape) for p in initial)
    for key, h, s in zip(keys, stored, shapes):
        if h.shape[1:] != s:  # the reset below would broadcast it into the wrong rows
            raise ValueError(
                f"state entry {key!r} must have shape [*batch, *{list(s)}] = "
                f"{[*batch_shape, *s]}, got {[*batch_shape, *h.shape[1:]]}; it was written by "
                "another module (another num_layers or hidden size?): give each ResetRNN its "
                "own state_key and primer."
            )
        if h.dtype != dtype:  # the rnn's matmul would fail without naming the entry
            raise TypeError(
                f"state entry {key!r} has dtype {h.dtype}, the rnn's parameters {dtype}; the "
                "env's primer was made before the module was cast (or by another module): "
                f"append module.make_tensordict_primer() after casting, or cast the state with "
                f".to({dtype})."
            )
    masks = [reset.view(-1, *([1] * len(s))) for s in shapes]
    if initial is None:
        return tuple(h.masked_fill(m, 0.0) for h, m in zip(stored, masks))
    return tuple(torch.where(m, p, h) for h, m, p in zip(stored, masks, initial))


def step_once(rnn: nn.Module, layout: _Layout, x: torch.Tensor, state: tuple) -> tuple:
    """One step of ``rnn`` from ``state`` (a tuple of ``[N, *S]``) on ``x`` ``[N, F]``:
    ``(y, new state)``, the native cell kernel of each layer, as the loop backend runs a
    step (so step mode and sequence mode agree to the bit)."""
    if isinstance(rnn, (nn.RNNBase, nn.RNNCellBase)):  # two comparisons a step; named where they fail
        weight = rnn.weight_ih_l0 if isinstance(rnn, nn.RNNBase) else rnn.weight_ih
        if x.shape[-1] != rnn.input_size or x.dtype != weight.dtype:
            _check_inputs(rnn, x, state, None)  # raises, unless autocast takes the dtype
    if not isinstance(rnn, nn.RNNBase):  # a cell: its state is its output
        new = _layer_steps(rnn, layout)[0](x, state)
        return layout.structure(new[: layout.outputs]) if layout.kind == "tensordict" else new[0], new
    layers = []
    for layer, weights in enumerate(_layer_weights(rnn)):
        if layer and rnn.dropout > 0 and rnn.training:
            x = F.dropout(x, rnn.dropout, True)
        layers.append(_native_step(rnn, x, tuple(s[:, layer] for s in state), weights))
        x = layers[-1][0]
    return x, tuple(torch.stack(parts, 1) for parts in zip(*layers))
