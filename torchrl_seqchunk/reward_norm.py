"""Reward scaling by the running spread of the discounted return (an env transform).

TorchRL's ``VecNormV2`` normalizes a reward by the reward's own running mean and standard
deviation, which turns a constant reward (CartPole's 1 per step) into 0. PPO implementations
that learn control tasks fast (OpenAI baselines' ``VecNormalize``, which Stable-Baselines3
and the rl-zoo use) instead divide the reward by the running standard deviation of the
discounted return, without centring it. :class:`ReturnScaledReward` is that scaling as a
TorchRL transform.
"""
from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.envs.transforms import Transform

__all__ = ["ReturnScaledReward"]


class ReturnScaledReward(Transform):
    """Divide rewards by the running standard deviation of the discounted return, then clip.

    Every env of the batch keeps a discounted return ``G <- gamma * G + r`` (reset to 0 after
    a done step). Its running mean and variance over every step and env seen so far
    (``count``-weighted merge of batch moments, Chan, Golub and LeVeque 1979) give the new
    reward ``clip(r / sqrt(var + eps), -clip, clip)``. The reward keeps its sign and is not
    centred. Same rule as ``VecNormalize(norm_reward=True)`` of OpenAI baselines and
    Stable-Baselines3, whose initial statistics (mean 0, variance 1, count 1e-4) are used too.

    Put it after any transform that should see the raw reward (e.g. ``RewardSum``, which
    reports the undiscounted return) and before the policy's data is stored. The statistics
    are buffers (``state_dict``), so a resumed run scales alike; with a batched env they are
    shared by its envs.

    Keyword Args:
        gamma (float): discount of the return, in ``[0, 1]``; use the agent's. Default 0.99.
        clip (float): bound on the scaled reward (> 0). Default 10.
        eps (float): added to the variance (> 0). Default 1e-8.
        reward_key (NestedKey): the reward, float ``[*batch, 1]``. Default ``"reward"``.
        done_key (NestedKey): bool ``[*batch, 1]``, True on the last step of an episode.
            Default ``"done"``.

    Raises:
        ValueError: ``gamma`` outside ``[0, 1]``, ``clip`` or ``eps`` not positive.

    Examples:
        >>> from torchrl.envs import GymEnv, RewardSum, TransformedEnv, Compose
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), Compose(RewardSum(), ReturnScaledReward(gamma=0.98)))
        >>> td = env.rollout(3)
        >>> td["next", "episode_reward"][-1].item()  # RewardSum came first: the raw return
        3.0
        >>> td["next", "reward"][0].item()  # one return seen: variance ~2e-4, 1 / 0.014 clipped
        10.0
    """

    def __init__(
        self,
        *,
        gamma: float = 0.99,
        clip: float = 10.0,
        eps: float = 1e-8,
        reward_key: NestedKey = "reward",
        done_key: NestedKey = "done",
    ):
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}; pass the agent's discount.")
        for name, value in (("clip", clip), ("eps", eps)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}.")
        super().__init__(in_keys=[reward_key], out_keys=[reward_key])
        self.gamma, self.clip, self.eps = float(gamma), float(clip), float(eps)
        self.reward_key, self.done_key = reward_key, done_key
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))
        self._return = None  # [*batch, 1] discounted return of every env's current episode

    def _update(self, returns: torch.Tensor) -> None:
        values = returns.detach().reshape(-1).double()
        n, mean, var = values.numel(), values.mean(), values.var(correction=0)
        total = self.count + n
        delta = mean - self.mean
        self.var.copy_((self.var * self.count + var * n + delta**2 * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        reward = next_tensordict.get(self.reward_key)
        done = next_tensordict.get(self.done_key)
        if done.shape != reward.shape:
            raise ValueError(
                f"done_key {self.done_key!r} has shape {list(done.shape)}, the reward "
                f"{list(reward.shape)}; one done flag per reward, as TorchRL stores them."
            )
        if self._return is None or self._return.shape != reward.shape:
            self._return = torch.zeros_like(reward)
        self._return = self._return * self.gamma + reward
        self._update(self._return)
        scale = torch.sqrt(self.var + self.eps).to(reward.dtype)
        next_tensordict.set(self.reward_key, (reward / scale).clamp(-self.clip, self.clip))
        self._return = self._return.masked_fill(done, 0.0)
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        # envs reset without a done step (e.g. a collector's reset_at_each_iter) start a new return
        if self._return is not None:
            reset = tensordict.get("_reset", None) if tensordict is not None else None
            if reset is None:
                self._return = torch.zeros_like(self._return)
            else:
                self._return = self._return.masked_fill(reset.reshape(self._return.shape), 0.0)
        return tensordict_reset
