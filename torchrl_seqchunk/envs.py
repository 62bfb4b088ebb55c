"""Partially observable variants of gymnasium tasks, for recurrent agents.

:class:`MaskObservation` keeps a subset of a flat ``Box`` observation, e.g. CartPole-v1
without its two velocity components, so that a policy must infer them from memory.
:func:`make_masked_env` builds such an env wrapped for TorchRL; it is a module-level
function, so ``functools.partial(make_masked_env, ...)`` pickles into ``ParallelEnv``
workers.
"""
from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

__all__ = ["MaskObservation", "make_masked_env", "DEFAULT_KEEP"]

#: Observation indices kept by default for well-known tasks (positions without velocities).
#: CartPole-v1 observes [cart position, cart velocity, pole angle, pole angular velocity];
#: keeping (0, 2) is the classic "CartPole without velocities" POMDP.
DEFAULT_KEEP = {"CartPole-v1": (0, 2)}


class MaskObservation(gym.ObservationWrapper):
    """Keep only the given indices of a flat ``Box`` observation.

    The wrapped observation space is ``Box(low[keep], high[keep])`` with the original dtype;
    every observation ``obs`` of shape ``[D]`` becomes ``obs[keep]`` of shape ``[len(keep)]``.
    Rewards, termination and truncation are unchanged.

    Args:
        env (gymnasium.Env): an env whose observation space is a 1-D ``gymnasium.spaces.Box``.
        keep (sequence of int): the observation indices to keep, in the order given; each in
            ``[-D, D)``, no duplicates, at least one.

    Raises:
        TypeError: if the observation space is not a 1-D ``Box``, or ``keep`` holds a non-integer.
        ValueError: if ``keep`` is empty, out of range or has duplicates.

    Examples:
        >>> import gymnasium as gym
        >>> env = MaskObservation(gym.make("CartPole-v1"), keep=[0, 2])
        >>> env.observation_space.shape
        (2,)
        >>> full, _ = gym.make("CartPole-v1").reset(seed=0)
        >>> obs, _ = env.reset(seed=0)
        >>> bool((obs == full[[0, 2]]).all())
        True
    """

    def __init__(self, env: gym.Env, keep: Sequence[int]):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise TypeError(
                f"MaskObservation needs a 1-D Box observation space, got env.observation_space="
                f"{space}; flatten the observation first (gymnasium.wrappers.FlattenObservation)."
            )
        dim = space.shape[0]
        keep = list(keep)
        if not keep:
            raise ValueError("keep=[] keeps nothing; pass at least one observation index.")
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in keep):
            raise TypeError(f"keep must hold integers, got keep={keep}.")
        if any(not -dim <= i < dim for i in keep):
            raise ValueError(f"keep={keep} is out of range for an observation of size {dim}; "
                             f"use indices in [{-dim}, {dim}).")
        normalized = [int(i) % dim for i in keep]
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"keep={keep} repeats an index; list each index once.")
        self.keep = np.asarray(normalized, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep], high=space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation):
        return observation[self.keep]


def make_masked_env(env_id: str, keep: Sequence[int] | None = None, *, device="cpu", **make_kwargs):
    """Build ``env_id`` as a TorchRL env, keeping only the observation indices ``keep``.

    Args:
        env_id (str): any registered gymnasium id, e.g. ``"CartPole-v1"``.
        keep (sequence of int, optional): observation indices kept by :class:`MaskObservation`;
            ``None`` keeps the full observation.

    Keyword Args:
        device (torch.device or str): device of the TorchRL env's tensors. Defaults to ``"cpu"``.
        **make_kwargs: passed to ``gymnasium.make``.

    Returns:
        torchrl.envs.GymWrapper: observation under ``"observation"`` with shape ``[len(keep)]``
        (float32 for CartPole), the action spec of the gymnasium env.

    Examples:
        >>> env = make_masked_env("CartPole-v1", keep=(0, 2))
        >>> env.reset()["observation"].shape
        torch.Size([2])
        >>> # picklable factory for workers:
        >>> import functools
        >>> from torchrl.envs import SerialEnv
        >>> SerialEnv(2, functools.partial(make_masked_env, "CartPole-v1", (0, 2))).reset()["observation"].shape
        torch.Size([2, 2])
    """
    from torchrl.envs import GymWrapper

    env = gym.make(env_id, **make_kwargs)
    if keep is not None:
        env = MaskObservation(env, keep)
    return GymWrapper(env, device=device)
