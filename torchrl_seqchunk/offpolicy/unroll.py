"""One unroll of a recurrent value network over a chunk that also yields its next values.

A Q-learning target at step ``t`` needs the value of the observation reached by step
``t`` under the memory held after step ``t``. Inside an episode that is the network's
output at step ``t + 1`` of the same unroll. It is not where the episode ends: after a
truncated step the next observation is the final one, which the chunk holds only under
``("next", ...)`` (step ``t + 1`` already starts the next episode), and after the
chunk's last step it is ``("next", "observation")``, which the chunk does not hold at
the root either. Running the network a second time on ``step_mdp(chunk)`` (what
TorchRL's ``DQNLoss`` does) gets both wrong: that view skips every episode's first
observation and starts from the end-of-chunk state.

:func:`unroll_with_next` builds one sequence per row: the chunk's steps with each
final observation inserted right after its truncated step (followed by the next
episode's first step, which resets), left-padded to the longest row with reset steps
so that every row ends at its last step. The unroll starts each row from a given
state (the carry, a stored state or zeros) through the ``ResetRNN``'s
``reset_state_key``; its final state is the state after the chunk's last step.
One more step from that state evaluates ``("next", "observation")`` at the chunk's end.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.modules import set_recurrent_mode

from .._boundaries import check_flag, stops

__all__ = ["Unroll", "unroll_with_next"]


class Unroll(NamedTuple):
    """What :func:`unroll_with_next` returns.

    Attributes:
        values (Tensor or TensorDict): ``network``'s ``value_key`` at every step, ``[B, T, *V]``
            (a TensorDict ``[B, T]`` of the keys where ``value_key`` is a list).
        next_values (Tensor, TensorDict or None): its value at the observation each step reaches,
            under the memory after that step, ``[B, T, *V]`` (arbitrary after a terminated step);
            ``None`` from a pass with ``bootstrap=False``.
        final_state (tuple of Tensor): the state after step ``T - 1``, one ``[B, *S]``
            per entry of ``rnn.state_keys`` (what a stream carries to its next chunk).
        recurrent_steps (int): recurrent steps computed, summed over rows (padding included).
    """

    values: torch.Tensor | TensorDictBase
    next_values: torch.Tensor | TensorDictBase | None
    final_state: tuple
    recurrent_steps: int


def _dtype(rnn) -> torch.dtype:
    return next(rnn.parameters(), torch.empty(0)).dtype


def _final_state(rnn) -> tuple:
    carry = rnn.carried_state  # the state after the pass's last step, [B] entries
    if carry is None:
        raise ValueError(
            "the ResetRNN kept no final state: build it with carry=True (unroll_with_next "
            "reads the state after the chunk's last step from it)."
        )
    return tuple(carry.get(key) for key in rnn.state_keys)


def unroll_with_next(
    network: TensorDictModuleBase,
    rnn,
    tensordict: TensorDictBase,
    initial_state: tuple | None = None,
    *,
    value_key: NestedKey | list = "action_value",
    observation_keys: list | None = None,
    terminated_key: NestedKey = ("next", "terminated"),
    done_key: NestedKey = ("next", "done"),
    truncated_key: NestedKey = ("next", "truncated"),
    bootstrap: bool = True,
) -> Unroll:
    """Unrolls ``network`` over a ``[B, T]`` chunk, returning its values at every step and
    at every step's next observation, each under the memory it belongs to.

    Row ``b`` starts from ``initial_state[b]`` unless ``is_first[b, 0]``; the state resets
    to zeros at every ``is_first`` (and after every done step); the value of step ``t``'s
    next observation is the output at step ``t + 1`` inside an episode, at the final
    observation ``("next", obs)[t]`` after a truncation (or any done step that is not
    terminated), and at ``("next", obs)[T - 1]`` under the state after step ``T - 1``
    at the chunk's end. The network runs twice in sequence mode: over ``[B, T + k]``
    (``k``: the most truncations in a row) and over ``[B, 1]``; gradients flow as the
    caller allows (wrap a target network's call in ``torch.no_grad()``).

    Args:
        network (TensorDictModuleBase): reads ``observation_keys``, contains ``rnn`` and
            writes ``value_key`` (e.g. an encoder, ``rnn`` and a Q head in a
            ``TensorDictSequential``).
        rnn (ResetRNN): the recurrent module inside ``network``, built with
            ``carry=True`` and a ``reset_state_key`` (the reset state is set here). Its
            carry is left at ``final_state``.
        tensordict (TensorDictBase): batch ``[B, T]`` with ``observation_keys`` at the root
            and under ``"next"``, ``rnn.is_first_key`` and ``done_key`` (bool
            ``[B, T, 1]``); ``terminated_key`` where present, else ``done`` less
            ``truncated_key`` (``done`` when that is absent too), as in
            :func:`~torchrl_seqchunk.boundary_nstep_targets`.
        initial_state (tuple of Tensor, optional): the state before step 0, one ``[B, *S]``
            per ``rnn.state_keys`` entry; ``None``: zeros.

    Keyword Args:
        value_key (NestedKey or list of NestedKey): the network's output; a list (e.g. a
            policy's distribution parameters ``["loc", "scale"]``) gives TensorDicts ``[B, T]``
            of those keys. Default ``"action_value"``.
        observation_keys (list of NestedKey, optional): the step's inputs. Default: the
            network's ``in_keys`` other than the rnn's flag and state keys.
        terminated_key, done_key, truncated_key (NestedKey): TorchRL's ``"next"`` flags.
        bootstrap (bool): ``False``: the values and the final state only (a burn-in pass:
            no final observation inserted, no step at the chunk's end, ``next_values`` is
            ``None``, ``("next", ...)`` observations unread). Default ``True``.

    Returns:
        Unroll: ``values``, ``next_values``, ``final_state``, ``recurrent_steps``.

    Raises:
        ValueError: ``rnn`` has no ``reset_state_key`` or is not in ``network``, ``tensordict`` is not ``[B, T]``,
            a key is missing, a flag not one per step, ``observation_keys`` empty, or
            ``initial_state`` does not match the rnn's state.
        TypeError: a done, terminated or truncated flag that is not ``torch.bool``;
            ``initial_state`` not a tuple of tensors (a carried TensorDict).

    .. note:: ``ResetRNN(initial_state="learned")`` is reset to zeros here.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl_seqchunk import ResetRNN, unroll_with_next
        >>> rnn = ResetRNN(nn.GRU(3, 8, batch_first=True), in_key="observation",
        ...                state_key="q_state", reset_state_key="q_state")
        >>> net = Seq(rnn, Mod(nn.Linear(8, 2), ["features"], ["action_value"]))
        >>> done = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> done[0, 3] = True  # row 0: truncated at step 3, a new episode from step 4
        >>> is_first = torch.zeros_like(done)
        >>> is_first[0, 4] = True
        >>> chunk = TensorDict({
        ...     "observation": torch.randn(4, 10, 3), ("next", "observation"): torch.randn(4, 10, 3),
        ...     "is_first": is_first, ("next", "done"): done, ("next", "terminated"): done & False,
        ... }, [4, 10])
        >>> out = unroll_with_next(net, rnn, chunk)
        >>> out.values.shape, out.next_values.shape, out.final_state[0].shape
        (torch.Size([4, 10, 2]), torch.Size([4, 10, 2]), torch.Size([4, 1, 8]))
        >>> out.recurrent_steps  # 4 rows x (10 steps + 1 final observation + 1 chunk end)
        48
    """
    if getattr(rnn, "reset_state_keys", None) is None:
        raise ValueError(
            "rnn needs a reset_state_key: build it as ResetRNN(..., reset_state_key=...) "
            "(unroll_with_next starts every row from its state through it)."
        )
    if tensordict.batch_dims != 2 or 0 in tensordict.batch_size:
        raise ValueError(
            f"tensordict must have batch_size [B, T] with B, T >= 1, got {list(tensordict.shape)}."
        )
    if not any(module is rnn for module in network.modules()):
        raise ValueError(
            "network does not contain rnn (e.g. a target network deep-copied from the online one, "
            "given with the online rnn): pass the ResetRNN inside network, the final state is read from it."
        )
    own = {rnn.is_first_key, rnn.init_key, *rnn.state_keys, *rnn.reset_state_keys}
    if observation_keys is None:
        observation_keys = [k for k in network.in_keys if unravel_key(k) not in own]
    observation_keys = [unravel_key(k) for k in observation_keys]
    if not observation_keys:
        raise ValueError("observation_keys is empty: name the network's inputs (e.g. ['observation']).")
    if isinstance(value_key, list) and not value_key:
        raise ValueError("value_key is an empty list: name the network's outputs to read (e.g. ['loc', 'scale']).")
    if initial_state is not None and not (isinstance(initial_state, (tuple, list))
                                          and all(isinstance(h, torch.Tensor) for h in initial_state)):
        raise TypeError(
            f"initial_state must be None or a tuple of [B, *S] tensors, one per rnn.state_keys entry "
            f"{rnn.state_keys}, got {type(initial_state).__name__}; from a carried TensorDict td: "
            "tuple(td.get(key) for key in rnn.state_keys)."
        )
    batch, steps = tensordict.shape
    device = tensordict.device or tensordict.get(observation_keys[0]).device

    def get(key):
        value = tensordict.get(key, None)
        if value is None:
            raise ValueError(f"key {key!r} is not in the tensordict; add it or pass its key.")
        return value

    def per_step(arg, key, value):
        if value.numel() != batch * steps:
            raise ValueError(f"{arg} {key!r} has shape {list(value.shape)}; it must be [B, T, 1] or [B, T] "
                             f"= {[batch, steps]}, one flag per step of the chunk.")
        return value.reshape(batch, steps)

    def flag(arg, key, required=False):
        value = get(key) if required else tensordict.get(key, None)
        return None if value is None else per_step(arg, key, check_flag(arg, key, value))

    is_first = per_step("rnn.is_first_key", rnn.is_first_key, get(rnn.is_first_key)).bool()
    done = flag("done_key", done_key, required=True)
    terminated, _ = stops(done, flag("terminated_key", terminated_key), flag("truncated_key", truncated_key), None)
    starts = is_first.clone()
    starts[:, 1:] |= done[:, :-1]  # nothing crosses an episode's end, flagged or not
    insert = torch.zeros_like(starts)
    if bootstrap:
        insert[:, :-1] = starts[:, 1:] & ~terminated[:, :-1]  # a final observation to evaluate

    # positions in the unrolled row: left padding, steps, each insertion after its step
    inserted = insert.long()
    extra = inserted.sum(1)
    length = steps + int(extra.max())
    t = torch.arange(steps, device=device)
    pos = (length - steps - extra).unsqueeze(1) + t + inserted.cumsum(1) - inserted  # [B, T]
    source = torch.zeros(batch, length, dtype=torch.long, device=device)  # padding: step 0
    source.scatter_(1, pos, t.expand(batch, steps))
    rows, cols = insert.nonzero(as_tuple=True)
    source[rows, pos[rows, cols] + 1] = steps + cols  # ("next", obs) of step cols
    flags = torch.ones(batch, length, dtype=torch.bool, device=device)
    flags.scatter_(1, pos, starts)
    flags[rows, pos[rows, cols] + 1] = False
    flags.scatter_(1, pos[:, :1], torch.ones(batch, 1, dtype=torch.bool, device=device))

    if initial_state is not None and len(initial_state) != len(rnn.state_keys):
        raise ValueError(
            f"initial_state has {len(initial_state)} entries, the rnn's state "
            f"{len(rnn.state_keys)} ({rnn.state_keys})."
        )
    start_reset = torch.zeros(batch, length, dtype=torch.bool, device=device)
    start_reset.scatter_(1, pos[:, :1], ~is_first[:, :1])  # row starts from initial_state

    both = {}
    for key in observation_keys:
        # source indices T.. (final observations) appear only where insert is set
        both[key] = torch.cat([get(key), get(unravel_key(("next", key)))], 1) if bootstrap else get(key)
    gathered = TensorDict(
        {k: v.gather(1, source.view(batch, length, *[1] * (v.dim() - 2)).expand(
            batch, length, *v.shape[2:])) for k, v in both.items()},
        batch_size=[batch, length],
    )
    gathered.set(rnn.is_first_key, flags.unsqueeze(-1))
    for i, (key, shape) in enumerate(zip(rnn.reset_state_keys, rnn.state_shapes)):
        reset = torch.zeros(batch, length, *shape, dtype=_dtype(rnn), device=device)
        if initial_state is not None:
            h0 = initial_state[i]
            if tuple(h0.shape) != (batch, *shape):
                raise ValueError(
                    f"initial_state[{i}] has shape {list(h0.shape)}, expected "
                    f"{[batch, *shape]} (rows, then the state of {key!r})."
                )
            mask = start_reset.view(batch, length, *[1] * len(shape))
            reset = torch.where(mask, h0.to(reset).unsqueeze(1).expand_as(reset), reset)
        gathered.set(key, reset)

    with set_recurrent_mode(True):
        out = network(gathered)
        final, carried = _final_state(rnn), rnn.carried_state
        if not bootstrap:
            return Unroll(_gather_steps(_read(out, value_key), pos), None, final, batch * length)
        end = TensorDict(
            {k: get(unravel_key(("next", k)))[:, -1:] for k in observation_keys},
            batch_size=[batch, 1],
        )
        end.set(rnn.is_first_key, torch.ones(batch, 1, 1, dtype=torch.bool, device=device))
        for key, h in zip(rnn.reset_state_keys, final):
            end.set(key, h.unsqueeze(1))
        end_value = _read(network(end), value_key)  # [B, 1, *V]
        rnn.carried_state = carried  # the carry is the state after the chunk, not after this extra step
    value = _read(out, value_key)  # [B, length, *V]
    next_pos = torch.where(insert, pos + 1, pos.roll(-1, 1))[:, :-1]
    next_values = torch.cat([_gather_steps(value, next_pos), end_value], 1)
    return Unroll(_gather_steps(value, pos), next_values, final, batch * (length + 1))


def _read(out: TensorDictBase, value_key):
    """The tensor at ``value_key``, or the TensorDict of the keys of a list."""
    return out.select(*value_key) if isinstance(value_key, list) else out.get(value_key)


def _gather_steps(value, index: torch.Tensor):
    """``value[b, index[b, t]]``: ``value [B, L, *V]``, ``index [B, T]`` -> ``[B, T, *V]`` (each
    entry of a TensorDict ``[B, L]``)."""
    if isinstance(value, TensorDictBase):
        return value.apply(lambda v: _gather_steps(v, index), batch_size=index.shape)
    shape = (*index.shape, *value.shape[2:])
    return value.gather(1, index.view(*index.shape, *[1] * (value.dim() - 2)).expand(shape))
