"""Generalized advantage estimation that is right at every episode boundary.

Rollouts, stream chunks and windows all concatenate episodes along time. GAE over
such a layout must stop its recursion wherever an episode ends, zero the bootstrap
only where the episode *terminated*, bootstrap truncated steps from the value of
the final (pre-reset) observation, and bootstrap the last step of a chunk from the
value of its next observation. Once the flags and TD errors are prepared, the
recursion ``A_t = delta_t + gamma * lmbda * A_{t+1}`` is a linear recurrence with
resets, run backwards in time on the parallel scan of :func:`rnn_with_resets`.

TorchRL's GAE kernels (``torchrl.objectives.value.functional``) give the same
numbers from the same flags (the tests check it), but not the speed on CPU: the
loop kernel takes ``T`` Python steps, and the vectorised one pads every episode to
the longest and convolves it with a filter of ``log(1e-7) / log(gamma * lmbda)``
taps (about 260 for 0.99 * 0.95), slower still on a ``[64, 256]`` rollout. The
scan takes ``log2(T)`` element-wise rounds, several times faster than either
there (``benchmarks/bench_ppo.py``).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from .._boundaries import INIT_KEY, check_floating, read_entry, stops
from .._checks import check_real
from ..recurrent.functional import rnn_with_resets


class _DiscountedSum(nn.Module):
    """The cell ``h_t = decay * h_{t-1} + x_t``, a linear recurrence for the scan backend."""

    hidden_size = 1

    def __init__(self, decay: float):
        super().__init__()
        self.decay = decay

    def linear_coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(x, self.decay), x

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.add(x, h, alpha=self.decay)


def boundary_gae(
    tensordict: TensorDictBase,
    *,
    gamma: float,
    lmbda: float,
    value_key: NestedKey = "state_value",
    next_value_key: NestedKey | None = None,
    reward_key: NestedKey = ("next", "reward"),
    done_key: NestedKey = ("next", "done"),
    terminated_key: NestedKey = ("next", "terminated"),
    truncated_key: NestedKey = ("next", "truncated"),
    is_first_key: NestedKey = "is_first",
    advantage_key: NestedKey = "advantage",
    value_target_key: NestedKey = "value_target",
) -> TensorDictBase:
    """Writes GAE advantages and value targets on a ``[..., T]`` layout with episode boundaries.

    Works on anything whose last batch dimension is time and whose rows may hold
    several episodes back to back: collector rollouts ``[num_envs, T]``, stream
    chunks ``[B, T]`` and PPO windows ``[N, W]``. For every step ``t``:

    * the TD error is ``r_t + gamma * (1 - terminated_t) * V'_t - V_t`` where ``V'_t``
      is ``tensordict[next_value_key]``, the value of the observation reached by step
      ``t`` (for a truncated step: the final, pre-reset observation);
    * the recursion ``A_t = delta_t + gamma * lmbda * A_{t+1}`` stops after ``t`` when
      step ``t`` is done, terminated or truncated, when step ``t + 1`` is an episode
      start (``is_first``), and at the last step of every row (a chunk end, which
      therefore bootstraps from ``V'_t`` like a truncation).

    The last step of a row needs no done flag: it is always treated as a chunk end.
    When ``terminated_key`` is absent it is taken as ``done & ~truncated`` (or as
    ``done`` when ``truncated_key`` is absent too, as in TorchRL). The recursion runs
    without gradient, as a parallel scan (see the module docstring): advantages and
    value targets are detached even when the values carry a critic graph. A non-finite
    value or reward makes its own episode's advantages non-finite, no other's (as
    TorchRL's vectorized kernel).

    Algorithm: Schulman et al., "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", ICLR 2016.

    Args:
        tensordict: batch size ``[*B, T]`` with at least one dimension (time last).
            Needs ``value_key``, ``next_value_key``, ``reward_key`` (floating,
            ``[*B, T, 1]``) and ``done_key`` (bool ``[*B, T, 1]``); uses
            ``terminated_key``, ``truncated_key`` and ``is_first_key`` (bool
            ``[*B, T, 1]``) when present.

    Keyword Args:
        gamma (float): discount, in ``[0, 1]``.
        lmbda (float): GAE lambda, in ``[0, 1]``.
        value_key (NestedKey): critic value ``V(s_t)``. Defaults to ``"state_value"``.
        next_value_key (NestedKey, optional): ``V(s_{t+1})``, the value of the next
            observation (``("next", "observation")``) under the memory held after
            step ``t``. Defaults to ``("next", *value_key)``.
        reward_key, done_key, terminated_key, truncated_key (NestedKey): TorchRL's
            ``"next"`` entries.
        is_first_key (NestedKey): episode-start flag; where absent, TorchRL's ``"is_init"``
            (``InitTracker``) is read. Defaults to ``"is_first"``.
        advantage_key, value_target_key (NestedKey): where the results go
            (``[*B, T, 1]``, the dtype of the values).

    Returns:
        The same ``tensordict``, updated in place.

    Raises:
        TypeError: ``tensordict`` is not a TensorDict, a flag is not bool, the values
            are not floating, or ``gamma``/``lmbda`` is not a real number.
        ValueError: no batch dimension or an empty time dimension (``T = 0``),
            ``gamma``/``lmbda`` outside ``[0, 1]``, a required key missing, or an entry
            not shaped ``[*B, T, 1]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_seqchunk import boundary_gae
        >>> td = TensorDict({
        ...     "state_value": torch.ones(1, 2, 1),
        ...     ("next", "state_value"): torch.tensor([[[1.0], [2.0]]]),
        ...     ("next", "reward"): torch.ones(1, 2, 1),
        ...     ("next", "done"): torch.tensor([[[False], [True]]]),
        ...     ("next", "terminated"): torch.zeros(1, 2, 1, dtype=torch.bool),
        ... }, batch_size=[1, 2])
        >>> boundary_gae(td, gamma=0.9, lmbda=1.0)["advantage"].squeeze(-1)
        tensor([[2.5200, 1.8000]])
    """
    if not isinstance(tensordict, TensorDictBase):
        raise TypeError(
            f"tensordict must be a TensorDict, got {type(tensordict).__name__}; "
            "wrap the tensors in tensordict.TensorDict(..., batch_size=[*B, T])."
        )
    if tensordict.batch_dims < 1:
        raise ValueError(
            f"tensordict has batch_size={tuple(tensordict.batch_size)}; it needs time as its "
            "last batch dimension, e.g. batch_size=[num_envs, T]."
        )
    if tensordict.batch_size[-1] == 0:
        raise ValueError(
            f"tensordict has batch_size={tuple(tensordict.batch_size)}, an empty time "
            "dimension (T = 0): there is no step to compute advantages for; skip empty batches."
        )
    gamma = check_real("gamma", gamma, low=0.0, high=1.0)
    lmbda = check_real("lmbda", lmbda, low=0.0, high=1.0)
    if next_value_key is None:
        next_value_key = ("next", *((value_key,) if isinstance(value_key, str) else value_key))

    shape = (*tensordict.batch_size, 1)

    def entry(arg: str, key: NestedKey, *, flag: bool, required: bool):
        missing = "run the critic on the next observations (tensordict['next']) first." if arg == "next_value_key" else None
        return read_entry(tensordict, arg, key, flag=flag, required=required, missing=missing)

    value = check_floating("value_key", value_key, entry("value_key", value_key, flag=False, required=True))
    next_value = entry("next_value_key", next_value_key, flag=False, required=True)
    reward = entry("reward_key", reward_key, flag=False, required=True)
    done = entry("done_key", done_key, flag=True, required=True)
    terminated = entry("terminated_key", terminated_key, flag=True, required=False)
    truncated = entry("truncated_key", truncated_key, flag=True, required=False)
    is_first = entry("is_first_key", is_first_key, flag=True, required=False)
    if is_first is None:  # TorchRL's flag, where ours is absent
        is_first = entry("is_first_key", INIT_KEY, flag=True, required=False)

    terminated, stop = stops(done, terminated, truncated, is_first)

    steps = shape[-2]
    with torch.no_grad():
        value = value.detach()
        bootstrap = next_value.to(value.dtype).masked_fill(terminated, 0.0)
        delta = reward.to(value.dtype) + gamma * bootstrap - value
        # backwards in time, A_{t+1} is the state before step t: reset it after a stop
        # a non-finite delta (a diverged critic) stays in its episode: the scan contains it
        backward, _ = rnn_with_resets(
            _DiscountedSum(gamma * lmbda),
            delta.reshape(-1, steps, 1).flip(1),
            stop.reshape(-1, steps).flip(1),
            backend="scan",
        )
        advantage = backward.flip(1).reshape(shape)
        value_target = advantage + value
    tensordict.set(advantage_key, advantage)
    tensordict.set(value_target_key, value_target)
    return tensordict
