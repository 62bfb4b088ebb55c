"""Windows sampled from TorchRL's replay (Sequence, SliceSampler): their steps outside the real records made harmless."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase


def mark_outside(batch: TensorDictBase, valid: torch.Tensor, learn: torch.Tensor, learn_key: str) -> TensorDictBase:
    """Flags a batch of windows ``[B, L]`` so that its steps outside the real records change nothing.

    Steps before a row's first real record (``Sequence``'s repeats of the oldest one) become
    ended one-step episodes; steps after its last real one (padding, repeats of the newest)
    become one episode of their own, so that the last real step bootstraps from its own next
    observation. Writes ``"is_first"`` (from the env's ``"is_init"``), the ``("next", ...)``
    done flags and ``learn_key`` = ``learn``; returns ``batch``.

    Args:
        batch (TensorDictBase): ``[B, L]`` with ``"is_init"`` and ``("next", "done" / "terminated" /
            "truncated")``, bool ``[B, L, 1]``.
        valid (Tensor): bool ``[B, L]``, the steps that are real records.
        learn (Tensor): bool ``[B, L]``, the steps that count in the loss.
        learn_key (str): where ``learn`` is written.
    """
    seen = valid.long().cummax(1).values.bool()
    lead, past = (~seen).unsqueeze(-1), (~valid & seen).unsqueeze(-1)
    first_past = past & ~torch.cat([torch.zeros_like(past[:, :1]), past[:, :-1]], 1)
    batch["is_first"] = (batch["is_init"] & ~past) | first_past | lead
    for key in ("done", "terminated", "truncated"):
        batch["next", key] = (batch["next", key] & ~past) | (lead if key != "truncated" else False)
    batch[learn_key] = learn
    return batch
