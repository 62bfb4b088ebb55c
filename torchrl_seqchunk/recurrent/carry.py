"""The state :class:`~torchrl_seqchunk.ResetRNN` carries from chunk to chunk, and the views of a chunk.

A loss may run the network several times on one chunk: the online pass over the
chunk, a target-network pass, a pass over the next observations (``step_mdp(chunk)``).
Only the first pass over a chunk carries; it marks the chunk so that every later pass
over it, or over its ``"next"`` view, starts from the same state and resets where the
chunk's episodes start (see ``docs/howto/reset-rnn.md``).
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key


def start_key(state_key, suffix: str = "_start"):
    """Where a carrying pass writes the state it started from: ``state_key`` + ``"_start"``
    (and the module that wrote it: ``state_key`` + ``"_start_by"``)."""
    key = unravel_key(state_key)
    if isinstance(key, str):
        return f"{key}{suffix}"
    return (*key[:-1], f"{key[-1]}{suffix}")


def view_start(rows: TensorDictBase, keys: list, token_key, step_key, token: int) -> tuple | None:
    """The start state ``[B, *S]`` per entry of a chunk this module marked, or ``None``.

    Raises ``ValueError`` for a chunk another module marked under the same keys, or for a view
    of a marked chunk that does not start at its first step (a time slice would start from the
    chunk's first state).
    """
    owner = rows.get(token_key, None)
    if owner is None:
        return None
    if owner.numel() and int(owner.reshape(-1)[0]) != token:
        raise ValueError(
            f"another carrying ResetRNN already ran on this chunk under the same state keys "
            f"({token_key!r} is its mark): two modules with one state_key (e.g. a target network "
            "deep-copied from the online one) would share their start state. Give each carrying "
            "ResetRNN its own state_key (e.g. state_key='target_state')."
        )
    steps = rows.get(step_key, None)
    if steps is not None and steps.numel() and bool((steps != torch.arange(steps.shape[1], device=steps.device)).any()):
        raise ValueError(
            f"this pass runs over a time slice of a chunk a carrying ResetRNN already ran on (its "
            f"steps {steps[0].tolist()[:8]} of the chunk, not 0, 1, 2, ...): it would start from the "
            "state the chunk started from and step as if its steps followed each other. Run later "
            "passes over the whole chunk (or its ('next', ...) view) and slice their outputs."
        )
    return tuple(rows.get(key)[:, 0] for key in keys)


def mark_chunk(tensordict: TensorDictBase, keys: list, h0: tuple, is_first_key, mark_keys: tuple, token: int) -> None:
    """Write the start state under ``keys``, ``token`` and each step's place in the chunk under
    ``mark_keys`` (root and ``"next"``), and the next view's reset flags.

    The start entries are expanded views ``[*batch, *S]`` (no copy). The next view's flags
    ``("next", is_first_key)`` become ``root | ("next", is_first_key)``, TorchRL's rule in its
    value estimators: the next observation ``t`` starts a memory where step ``t`` does.
    """
    shape = tensordict.shape
    token_key, step_key = mark_keys
    owner = torch.full((), token, dtype=torch.int64, device=h0[0].device).expand(shape)
    place = torch.arange(shape[-1], device=h0[0].device).expand(shape)
    entries = [(token_key, owner), (step_key, place)] + [
        (key, h.reshape(*shape[:-1], 1, *h.shape[1:]).expand(*shape, *h.shape[1:]))
        for key, h in zip(keys, h0)
    ]
    for key, value in entries:
        tensordict.set(key, value)
        tensordict.set(unravel_key(("next", key)), value)
    flags = tensordict.get(is_first_key).bool()
    next_key = unravel_key(("next", is_first_key))
    previous = tensordict.get(next_key, None)
    if previous is not None:  # [*batch] or [*batch, 1] each: the next view's shape is kept
        if previous.numel() != flags.numel():
            raise ValueError(
                f"{next_key!r} has shape {list(previous.shape)} and {is_first_key!r} "
                f"{list(flags.shape)}: each must be [*batch] or [*batch, 1] of the chunk's batch "
                f"{list(shape)}; store both flags as bool [*batch, 1].")
        flags = previous.bool() | flags.reshape(previous.shape)
    tensordict.set(next_key, flags)


def carry_as_tensordict(carry: tuple | None, keys: list) -> TensorDict | None:
    """``carry`` (tuple of ``[B, *S]``) as a TensorDict with batch ``[B]`` under the state keys."""
    if carry is None:
        return None
    return TensorDict(dict(zip(keys, carry)), batch_size=carry[0].shape[:1])


def carry_from_tensordict(value, keys: list, shapes: list) -> tuple | None:
    """The inverse of :func:`carry_as_tensordict`; checks keys and shapes."""
    if value is None:
        return None
    if not isinstance(value, TensorDictBase):
        raise TypeError(
            f"carry must be None or a TensorDict with batch [B] and entries {keys}, got "
            f"{type(value).__name__}; take it with module.carried_state."
        )
    entries = []
    for key, shape in zip(keys, shapes):
        entry = value.get(key, None)
        if entry is None or entry.dim() != len(shape) + 1 or entry.shape[1:] != shape:
            raise ValueError(
                f"carry entry {key!r} must be a [B, *{list(shape)}] tensor, got "
                f"{None if entry is None else list(entry.shape)}; take the carry with module.carried_state."
            )
        entries.append(entry.detach())
    if len({e.shape[0] for e in entries}) != 1:
        raise ValueError(f"carry entries {keys} hold different numbers of rows.")
    return tuple(entries)

