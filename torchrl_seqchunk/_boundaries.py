"""Episode boundaries of a ``[*B, T]`` layout of concatenated episodes, shared by GAE
(:func:`~torchrl_seqchunk.boundary_gae`) and n-step Q targets
(:func:`~torchrl_seqchunk.boundary_nstep_targets`): reading the per-step entries and
turning the flags into where a recursion stops and where the bootstrap is zero."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

INIT_KEY = "is_init"  # TorchRL's episode-start flag (InitTracker), read where is_first_key is absent


def read_entry(tensordict: TensorDictBase, arg: str, key: NestedKey, *, flag: bool, required: bool,
               missing: str | None = None) -> torch.Tensor | None:
    """``tensordict[key]``, shaped ``[*B, T, 1]`` (bool where ``flag``); ``None`` if absent and not
    ``required``. Raises ValueError (missing, wrong shape; ``missing`` replaces the default fix)
    or TypeError (a flag that is not ``torch.bool``), naming the argument ``arg``."""
    shape = (*tensordict.batch_size, 1)
    value = tensordict.get(key, None)
    if value is None:
        if required:
            raise ValueError(f"{arg}={key!r} is not in the tensordict; "
                             + (missing or f"add it or pass the key that holds it as {arg}."))
        return None
    if tuple(value.shape) != shape:
        raise ValueError(
            f"{arg}={key!r} has shape {tuple(value.shape)}, expected {shape} "
            "(the batch size plus a trailing singleton, as TorchRL stores it)."
        )
    return check_flag(arg, key, value) if flag else value


def check_floating(arg: str, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
    """``value``, or a TypeError naming ``arg`` if it is not floating: the rewards are cast to the
    values' dtype, which an integer dtype would truncate."""
    if not value.is_floating_point():
        raise TypeError(f"{arg}={key!r} has dtype {value.dtype}; values must be floating (the rewards are "
                        "cast to their dtype), convert with .float().")
    return value


def check_flag(arg: str, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
    """``value``, or a TypeError naming the argument ``arg`` if it is not ``torch.bool``."""
    if value.dtype != torch.bool:
        raise TypeError(f"{arg}={key!r} has dtype {value.dtype}; flags must be torch.bool, convert with .bool().")
    return value


def stops(done: torch.Tensor, terminated: torch.Tensor | None, truncated: torch.Tensor | None,
          is_first: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(terminated, stop)``, each ``[*B, T, 1]`` bool: ``terminated`` defaults to ``done`` less
    ``truncated``; ``stop`` is every step after which the episode does not go on in the row
    (done, terminated, truncated, or a successor that starts an episode, flagged done or not)."""
    if terminated is None:
        terminated = done if truncated is None else done & ~truncated
    stop = done | terminated
    if truncated is not None:
        stop = stop | truncated
    if is_first is not None:
        stop[..., :-1, :] |= is_first[..., 1:, :]
    return terminated, stop
