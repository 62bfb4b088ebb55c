"""The state :class:`~torchrl_seqchunk.ResetRNN` carries from chunk to chunk, and the views of a chunk.

A loss may run the network several times on one chunk: the online pass over the
chunk, a target-network pass, a pass over the next observations (``step_mdp(chunk)``).
Only the first pass over a chunk carries; it marks the chunk so that every later pass
over it, or over its ``"next"`` view, starts from the same state and resets where the
chunk's episodes start (see ``docs/howto/reset-rnn.md``).
"""
from __future__ import annotations

from tensordict import TensorDict, TensorDictBase, unravel_key


def start_key(state_key):
    """Where a carrying pass writes the state it started from: ``state_key`` + ``"_start"``."""
    key = unravel_key(state_key)
    if isinstance(key, str):
        return f"{key}_start"
    return (*key[:-1], f"{key[-1]}_start")


def view_start(rows: TensorDictBase, keys: list) -> tuple | None:
    """The start state ``[B, *S]`` per entry of a chunk view (``rows[keys]`` ``[B, T, *S]``), or ``None``."""
    found = [rows.get(key, None) for key in keys]
    if found[0] is None:
        return None
    return tuple(value[:, 0] for value in found)


def mark_chunk(tensordict: TensorDictBase, keys: list, h0: tuple, is_first_key) -> None:
    """Write the start state under ``keys`` (root and ``"next"``) and the next view's reset flags.

    The start entries are expanded views ``[*batch, *S]`` (no copy). The next view's flags
    ``("next", is_first_key)`` become ``root | ("next", is_first_key)``, TorchRL's rule in its
    value estimators: the next observation ``t`` starts a memory where step ``t`` does.
    """
    shape = tensordict.shape
    for key, h in zip(keys, h0):
        start = h.reshape(*shape[:-1], 1, *h.shape[1:]).expand(*shape, *h.shape[1:])
        tensordict.set(key, start)
        tensordict.set(unravel_key(("next", key)), start)
    flags = tensordict.get(is_first_key)
    next_key = unravel_key(("next", is_first_key))
    previous = tensordict.get(next_key, None)
    tensordict.set(next_key, flags.bool() if previous is None else previous.bool() | flags.bool())


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

