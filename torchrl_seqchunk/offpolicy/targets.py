"""n-step Q-learning targets that are right at every episode boundary of a ``[*B, T]`` layout.

Stream chunks and replay windows hold several episodes back to back along time. An
n-step target summed over such a row must stop where the episode ends: without a
bootstrap where it terminated, from the value of the final (pre-reset) observation
where it was truncated, and from the value of ``("next", "observation")`` at the row's
last step (a chunk end). The per-step next values come from the caller
(:func:`~torchrl_seqchunk.offpolicy.unroll.unroll_with_next` computes them under the
right memory); this file only sums.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from .._boundaries import INIT_KEY, check_floating, read_entry, stops
from .._checks import check_int, check_real

__all__ = ["boundary_nstep_targets"]


def boundary_nstep_targets(
    tensordict: TensorDictBase,
    *,
    gamma: float,
    n_steps: int = 1,
    next_value_key: NestedKey = ("next", "state_value"),
    reward_key: NestedKey = ("next", "reward"),
    done_key: NestedKey = ("next", "done"),
    terminated_key: NestedKey = ("next", "terminated"),
    truncated_key: NestedKey = ("next", "truncated"),
    is_first_key: NestedKey = "is_first",
    target_key: NestedKey = "value_target",
) -> TensorDictBase:
    """Writes n-step Q-learning targets on a ``[*B, T]`` layout of concatenated episodes.

    For step ``t`` the window runs over steps ``t, ..., t + m - 1`` and stops at the
    first step ``j`` that is done, terminated or truncated, whose successor starts an
    episode (``is_first[j + 1]``), or that is the row's last step, and after ``n_steps``
    steps otherwise::

        target_t = sum_{k < m} gamma^k r_{t+k} + gamma^m (1 - terminated_{t+m-1}) V'_{t+m-1}

    where ``V'_j = tensordict[next_value_key][j]`` is the value of the observation
    reached by step ``j`` under the memory held after it (for a truncated step the
    final observation, at the row's last step ``("next", "observation")`` under the
    carried state; e.g. ``max_a Q_target`` or the double-DQN value). A terminated step
    adds no bootstrap; nothing after an ``is_first`` reaches a step before it. With
    ``n_steps=1`` this is the one-step TD target of ``DQNLoss``. Computed without gradient.

    Algorithm: n-step Q-learning (Sutton & Barto, 2018, ch. 7), as in R2D2
    (Kapturowski et al., ICLR 2019), over episode boundaries as in DreamerV3's replay.

    Args:
        tensordict: batch ``[*B, T]`` (time last, ``T >= 1``) with ``next_value_key``,
            ``reward_key`` (floating ``[*B, T, 1]``) and ``done_key`` (bool
            ``[*B, T, 1]``); ``terminated_key``, ``truncated_key`` and ``is_first_key``
            (bool ``[*B, T, 1]``) are used where present.

    Keyword Args:
        gamma (float): discount in ``[0, 1]``.
        n_steps (int): the most rewards summed, ``>= 1``. Default ``1``.
        next_value_key (NestedKey): ``V'``, ``[*B, T, 1]``. Default ``("next", "state_value")``.
        reward_key, done_key, terminated_key, truncated_key (NestedKey): TorchRL's
            ``"next"`` entries. Without ``terminated_key`` it is ``done & ~truncated``
            (``done`` when ``truncated_key`` is absent too), as in
            :func:`~torchrl_seqchunk.boundary_gae`.
        is_first_key (NestedKey): episode-start flags; where absent, TorchRL's ``"is_init"``
            is read. Default ``"is_first"``.
        target_key (NestedKey): where the targets go, ``[*B, T, 1]`` in the values'
            dtype. Default ``"value_target"``.

    Returns:
        The same ``tensordict``, updated in place.

    Raises:
        TypeError: ``tensordict`` is not a TensorDict, a flag is not bool, the values are
            not floating, or ``gamma`` / ``n_steps`` has the wrong type.
        ValueError: no batch dim or ``T = 0``, ``gamma`` outside ``[0, 1]``,
            ``n_steps < 1``, a required key missing, or an entry not ``[*B, T, 1]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_seqchunk import boundary_nstep_targets
        >>> td = TensorDict({  # one row: a step, a terminated step, a new episode's first step
        ...     ("next", "reward"): torch.ones(1, 3, 1),
        ...     ("next", "done"): torch.tensor([[[False], [True], [False]]]),
        ...     ("next", "terminated"): torch.tensor([[[False], [True], [False]]]),
        ...     ("next", "state_value"): torch.full((1, 3, 1), 10.0),
        ...     "is_first": torch.tensor([[[True], [False], [True]]]),
        ... }, batch_size=[1, 3])
        >>> boundary_nstep_targets(td, gamma=0.5, n_steps=3)["value_target"].squeeze(-1)
        tensor([[1.5000, 1.0000, 6.0000]])
    """
    if not isinstance(tensordict, TensorDictBase):
        raise TypeError(
            f"tensordict must be a TensorDict, got {type(tensordict).__name__}; wrap the "
            "tensors in tensordict.TensorDict(..., batch_size=[*B, T])."
        )
    if tensordict.batch_dims < 1 or tensordict.batch_size[-1] == 0:
        raise ValueError(
            f"tensordict has batch_size={tuple(tensordict.batch_size)}; it needs a non-empty "
            "time dim as its last batch dim, e.g. batch_size=[B, T] with T >= 1."
        )
    gamma = check_real("gamma", gamma, low=0.0, high=1.0)
    n_steps = check_int("n_steps", n_steps, low=1)

    def entry(arg: str, key: NestedKey, *, flag: bool, required: bool):
        return read_entry(tensordict, arg, key, flag=flag, required=required)

    next_value = check_floating("next_value_key", next_value_key,
                                entry("next_value_key", next_value_key, flag=False, required=True)).detach()
    reward = entry("reward_key", reward_key, flag=False, required=True).detach().to(next_value.dtype)
    done = entry("done_key", done_key, flag=True, required=True)
    terminated = entry("terminated_key", terminated_key, flag=True, required=False)
    truncated = entry("truncated_key", truncated_key, flag=True, required=False)
    is_first = entry("is_first_key", is_first_key, flag=True, required=False)
    if is_first is None:  # TorchRL's flag, where ours is absent
        is_first = entry("is_first_key", INIT_KEY, flag=True, required=False)
    terminated, stop = stops(done, terminated, truncated, is_first)
    stop[..., -1, :] = True  # the row's end: bootstrap from ("next", "observation")
    bootstrap = next_value.masked_fill(terminated, 0.0)

    def ahead(x: torch.Tensor, k: int, fill) -> torch.Tensor:
        """x[..., t + k, :] at t, ``fill`` past the row's end."""
        if k == 0:
            return x
        pad = torch.full_like(x[..., :k, :], fill)
        return torch.cat([x[..., k:, :], pad], dim=-2)

    target = torch.zeros_like(next_value)
    running = torch.ones_like(stop)  # still inside the window of step t
    discount = 1.0
    for k in range(min(n_steps, stop.shape[-2])):  # every window has stopped by the row's end
        stop_k = ahead(stop, k, True)
        target = target + torch.where(running, discount * ahead(reward, k, 0.0), 0.0)
        last = running & (stop_k if k < n_steps - 1 else torch.ones_like(stop_k))
        target = target + torch.where(last, discount * gamma * ahead(bootstrap, k, 0.0), 0.0)
        running = running & ~stop_k
        discount *= gamma
    tensordict.set(target_key, target)
    return tensordict
