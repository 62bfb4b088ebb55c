"""Which slots of windows ``[N, W]`` train under each boundary mode, and the one reduction of
:class:`~torchrl_seqchunk.RecurrentPPOLoss`'s per-slot terms."""
from __future__ import annotations

import torch

BOUNDARY_MODES = ("reset_continue", "mask", "inverse_count")


def trained_slots(is_first: torch.Tensor, boundary_mode: str) -> torch.Tensor:
    """Bool ``[N, W]``: the slots that train; ``"mask"`` drops every slot from the first reset past slot 0 on."""
    if boundary_mode != "mask":
        return torch.ones_like(is_first)
    crossed = is_first.clone()
    crossed[:, 0] = False
    return crossed.cumsum(dim=1) == 0


def slot_weights(is_first: torch.Tensor, count_weight: torch.Tensor, boundary_mode: str) -> torch.Tensor:
    """The weight of every window slot in :class:`RecurrentPPOLoss` with ``reduction="mean"``.

    The loss is ``sum(weight * per_slot_loss)`` over the windows, so this says how much
    each step trains under each boundary mode: summing a step's weights over the windows
    holding it gives the step's share of the loss (the benchmark
    ``benchmarks/bench_boundary.py`` compares these shares by position in the episode).

    Args:
        is_first (torch.Tensor): bool ``[N, W]`` (or ``[N, W, 1]``), the windows' reset
            flags from :func:`~torchrl_seqchunk.make_windows`.
        count_weight (torch.Tensor): float ``[N, W]`` (or ``[N, W, 1]``), the windows'
            ``count_weight`` from :func:`~torchrl_seqchunk.make_windows`.
        boundary_mode (str): ``"reset_continue"``, ``"mask"`` or ``"inverse_count"``.

    Returns:
        torch.Tensor: float ``[N, W]`` (``count_weight``'s dtype), non-negative.
        ``"reset_continue"``: ``1 / (N * W)`` everywhere (sums to 1); ``"mask"``:
        ``1 / (N * W)`` on the slots that train, 0 on the dropped ones (sums to at most
        1); ``"inverse_count"``: ``count_weight / sum(count_weight)`` (sums to 1).

    Raises:
        ValueError: ``boundary_mode`` not one of :data:`BOUNDARY_MODES`; ``is_first`` and
            ``count_weight`` of different shapes, or not ``[N, W]``.
        TypeError: ``is_first`` or ``count_weight`` not a tensor.

    Examples:
        >>> import torch
        >>> is_first = torch.tensor([[True, False, True, False]])
        >>> count_weight = torch.full((1, 4), 1.0)
        >>> slot_weights(is_first, count_weight, "mask")
        tensor([[0.2500, 0.2500, 0.0000, 0.0000]])
    """
    if boundary_mode not in BOUNDARY_MODES:
        raise ValueError(f"boundary_mode must be one of {BOUNDARY_MODES}, got {boundary_mode!r}.")
    for name, value in (("is_first", is_first), ("count_weight", count_weight)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [N, W], got {type(value).__name__}; "
                            "convert with torch.as_tensor.")
    if is_first.dim() == 3 and is_first.shape[-1] == 1:
        is_first = is_first.squeeze(-1)
    if count_weight.dim() == 3 and count_weight.shape[-1] == 1:
        count_weight = count_weight.squeeze(-1)
    if is_first.dim() != 2 or is_first.shape != count_weight.shape:
        raise ValueError(
            f"is_first {tuple(is_first.shape)} and count_weight {tuple(count_weight.shape)} must "
            "both be [N, W] (or [N, W, 1]), as make_windows writes them."
        )
    if boundary_mode == "inverse_count":
        return count_weight / count_weight.sum()
    return trained_slots(is_first.bool(), boundary_mode).to(count_weight.dtype) / is_first.numel()


def reduce_windows(loss, kept, weight, input_mask, reduction: str) -> torch.Tensor:
    """The one reduction of a per-slot ``loss [N, W]`` (see :class:`RecurrentPPOLoss`).

    Slots outside ``kept`` (``None``: every slot is kept) count zero (selected, not multiplied: a
    NaN there leaves the loss finite, but still reaches the gradients through the terms computed
    from it, as in TorchRL's losses: keep padded slots' inputs finite); the
    terms are multiplied by ``weight`` (``inverse_count``); ``"mean"`` divides by the sum of
    ``weight`` (else by the slot count) over ``input_mask`` (TorchRL's loss masks; all
    slots if ``None``), so ``"mask"``'s dropped slots stay in the denominator.
    """
    terms = loss if kept is None else torch.where(kept, loss, torch.zeros_like(loss))
    if weight is not None:
        terms = terms * weight
    if reduction == "none":
        return terms
    if reduction == "sum":
        return terms.sum()
    if weight is not None:
        denominator = weight.sum() if input_mask is None else weight[input_mask].sum()
    else:
        denominator = loss.numel() if input_mask is None else input_mask.sum().clamp_min(1)
    return terms.sum() / denominator
