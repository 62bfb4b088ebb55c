"""Env transforms that normalize by running statistics: the reward by the spread of the
discounted return, the observation by its mean and standard deviation.

TorchRL's ``VecNormV2`` normalizes a reward by the reward's own running mean and standard
deviation, which turns a constant reward (CartPole's 1 per step) into 0. PPO implementations
that learn control tasks fast (OpenAI baselines' ``VecNormalize``, which Stable-Baselines3
and the rl-zoo use) instead divide the reward by the running standard deviation of the
discounted return, without centring it. :class:`ReturnScaledReward` is that scaling as a
TorchRL transform. :class:`RunningObservationNorm` is ``VecNormV2``'s observation rule for a
batched env (``decay=1``, ``reduce_batch_dims=True``) on plain tensors, a few times cheaper
per step, counting at a partial reset only the envs reset.
"""
from __future__ import annotations

import math

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import Bounded, Unbounded
from torchrl.envs.transforms import Transform

from ._checks import check_real

__all__ = ["ReturnScaledReward", "RunningObservationNorm"]


def _merge_moments(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, values: torch.Tensor,
                   what: str) -> None:
    """Merges the moments of ``values`` ``[n, *mean.shape]`` into the running ``mean``, ``var``
    (population) and ``count``, in place (Chan, Golub and LeVeque 1979); a ValueError naming
    ``what`` if ``values`` hold a NaN or an infinity, the statistics left as they were."""
    n = values.shape[0]
    if not n:
        return
    batch_var, batch_mean = torch.var_mean((values.detach() if values.requires_grad else values).to(mean.dtype), 0,
                                           correction=0)
    spread = batch_var if batch_var.dim() == 0 else batch_var.sum()
    if not math.isfinite(spread.item()):  # a NaN, an infinity or an overflow makes it non-finite (the one read)
        bad = int((~torch.isfinite(values)).sum())
        found = (f"holds {bad} NaN or infinite value(s) in this batch of {values.numel()}" if bad else
                 f"holds values too large for their variance in {mean.dtype} (up to {values.abs().max().item():.3g})")
        raise ValueError(
            f"{what} {found}; merged into the running statistics they would make every value normalized after "
            "it NaN. The statistics are left as they were: find where the env produces them, or replace or "
            "rescale them before this transform."
        )
    old = _count_of(count)
    total = old + n
    delta = batch_mean - mean
    # var <- (var * old + batch_var * n + delta^2 * old * n / total) / total
    var.mul_(old / total).add_(batch_var, alpha=n / total).addcmul_(delta, delta, value=old * n / total**2)
    mean.add_(delta, alpha=n / total)
    count.fill_(total)
    if not count.is_inference():  # the value just written, valid until the buffer changes otherwise
        count._merged = (count.data_ptr(), count._version, total)


def _count_of(count: torch.Tensor) -> float:
    """The running count's value: the one the last merge wrote, while the buffer holds it (the same
    storage and version: not loaded, filled or copied since), else read from the buffer."""
    merged = getattr(count, "_merged", None)
    if merged is not None and not count.is_inference() and merged[:2] == (count.data_ptr(), count._version):
        return merged[2]
    return count.item()


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
        ValueError: ``gamma`` outside ``[0, 1]``, ``clip`` or ``eps`` not positive, ``eps``
            not finite.

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
        if not math.isfinite(eps):  # every reward would come out 0
            raise ValueError(f"eps must be finite, got {eps}.")
        super().__init__(in_keys=[reward_key], out_keys=[reward_key])
        self.gamma, self.clip, self.eps = float(gamma), float(clip), float(eps)
        self.reward_key, self.done_key = reward_key, done_key
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))
        self._return = None  # [*batch, 1] discounted return of every env's current episode

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        reward = self.scale(next_tensordict.get(self.reward_key), next_tensordict.get(self.done_key))
        next_tensordict.set(self.reward_key, reward)
        return next_tensordict

    def scale(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """One step of every env on plain tensors: updates the returns and the statistics and
        returns the scaled reward (what :meth:`_step` writes).

        Args:
            reward (Tensor): float ``[*batch, 1]``, the raw reward of the step.
            done (Tensor): bool ``[*batch, 1]``, True where the step ends an episode.

        Raises:
            ValueError: if ``done`` and ``reward`` differ in shape, or a reward is NaN or infinite
                (this transform's returns and statistics are left as they were; what other
                transforms did with the same step, such as an observation normalizer's merge,
                is not undone). TypeError: if ``done`` is not bool.
        """
        if done.shape != reward.shape:
            raise ValueError(
                f"done_key {self.done_key!r} has shape {list(done.shape)}, the reward "
                f"{list(reward.shape)}; one done flag per reward, as TorchRL stores them."
            )
        if done.dtype != torch.bool:
            raise TypeError(f"done_key {self.done_key!r} must be bool (True where an episode ends), got {done.dtype}.")
        last = self._return
        if last is None or last.shape != reward.shape:
            # a low-precision reward accumulates in float32 at least: its return would overflow float16
            last = torch.zeros_like(reward, dtype=torch.promote_types(reward.dtype, torch.float32))
        returns = last * self.gamma + reward
        _merge_moments(self.mean, self.var, self.count, returns.reshape(-1),
                       f"the discounted return of reward_key {self.reward_key!r}")
        self._return = returns.masked_fill(done, 0.0)
        # a low-precision reward is divided in float32: its scale may overflow float16
        dtype = torch.promote_types(reward.dtype, torch.float32)
        scale = torch.sqrt(self.var + self.eps).to(dtype)
        return (reward.to(dtype) / scale).clamp(-self.clip, self.clip).to(reward.dtype)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        self.reset_returns(tensordict.get("_reset", None) if tensordict is not None else None)
        return tensordict_reset

    def reset_returns(self, mask: torch.Tensor | None = None) -> None:
        """Start a new return where ``mask`` (bool ``[*batch]`` or ``[*batch, 1]``; ``None``:
        every env): envs reset without a done step, e.g. a collector's ``reset_at_each_iter``."""
        if self._return is not None:
            if mask is None:
                self._return = torch.zeros_like(self._return)
            else:
                self._return = self._return.masked_fill(mask.reshape(self._return.shape), 0.0)


class RunningObservationNorm(Transform):
    """Normalize an observation by the running mean and standard deviation of every one seen.

    ``VecNormV2(in_keys=[key], decay=1.0, reduce_batch_dims=True)``'s rule: per feature, the
    mean and the population variance of every observation of every env so far (the new
    ones first merged in), then ``(obs - mean) / max(sqrt(var), eps)``. The statistics are
    float64 buffers merged by batch moments (Chan, Golub and LeVeque 1979) where
    ``VecNormV2`` keeps float32 running moments; they agree to float32 rounding.

    .. note:: At a partial reset only the envs reset (``"_reset"``) count; ``VecNormV2``
        counts every row of the reset, and a ``SerialEnv`` and a gymnasium vector env fill
        the rows not reset differently, so with this transform both give the same statistics.

    A feature that has been (nearly) constant has a standard deviation at the floor ``eps``, so
    a value it has not taken before comes out at ``(obs - mean) / eps``, 1e4 per unit of
    difference: the grid cells of a MiniGrid view seen only on one layout, then on another.
    ``clip`` bounds the normalized values (``VecNormalize``'s ``clip_obs`` of OpenAI baselines
    and Stable-Baselines3, 10 there); ``VecNormV2`` does not clip, so the default does not either.

    The statistics are the buffers ``mean``, ``var`` (float64 ``[*F]``) and ``count``, in the
    ``state_dict``; ``clip`` and ``frozen`` are settings of the transform, not state (as
    ``VecNormV2``'s ``frozen``): loading a state does not change them. :meth:`clone` copies
    the statistics (a clone in another env does not merge into this one's).

    Keyword Args:
        in_key (NestedKey): the observation, float ``[*batch, *F]``. Default ``"observation"``.
        eps (float): floor of the standard deviation (> 0). Default 1e-4, ``VecNormV2``'s.
        clip (float, optional): normalized values are clamped to ``[-clip, clip]`` (> 0);
            ``None``: not clamped. Default ``None``.
        frozen (bool): normalize with the statistics as they are, merging nothing (an
            evaluation env beside the training one: :meth:`frozen_copy`). Default ``False``.

    Raises:
        ValueError: ``eps`` or ``clip`` not positive or not finite. TypeError: ``eps`` or
            ``clip`` not a real number, ``frozen`` not a bool.

    Examples:
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), RunningObservationNorm())
        >>> obs = env.rollout(50)["next", "observation"]
        >>> bool(obs.abs().max() < 10)  # standardized features
        True
    """

    def __init__(self, *, in_key: NestedKey = "observation", eps: float = 1e-4, clip: float | None = None,
                 frozen: bool = False):
        eps = check_real("eps", eps, low=0.0, open_low=True)
        if clip is not None:
            clip = check_real("clip", clip, low=0.0, open_low=True)
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be a bool, got {type(frozen).__name__}; pass True or False.")
        super().__init__(in_keys=[in_key], out_keys=[in_key])
        self.key, self.eps, self.clip, self.frozen = in_key, eps, clip, frozen
        for name in ("mean", "var"):  # [*F], shaped by the first observation
            self.register_buffer(name, torch.zeros(0, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def clone(self) -> RunningObservationNorm:
        """A transform with the same settings and a copy of the statistics (not shared)."""
        copy = RunningObservationNorm(in_key=self.key, eps=self.eps, clip=self.clip, frozen=self.frozen)
        copy.load_state_dict(self.state_dict())
        return copy

    def frozen_copy(self) -> RunningObservationNorm:
        """A transform that normalizes by this one's statistics as they are now, merging nothing
        (the same ``in_key``, ``eps`` and ``clip``; the statistics copied, not shared).

        Raises:
            ValueError: if this transform has seen no observation yet (no statistics to freeze).
        """
        if not self.count:
            raise ValueError("frozen_copy() of a RunningObservationNorm that has seen no observation: there are no "
                             "statistics to normalize by; freeze it after the training env has run.")
        copy = self.clone()
        copy.frozen = True
        return copy

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("mean", "var"):  # a fresh transform takes the saved feature shape
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def normalize(self, obs: torch.Tensor, *, batch_dims: int = 1, counted: torch.Tensor | None = None) -> torch.Tensor:
        """Merges observations into the statistics and returns them normalized, on plain tensors.

        Args:
            obs (Tensor): float ``[*batch, *F]``, ``batch_dims`` leading dims of envs.

        Keyword Args:
            batch_dims (int): how many leading dims of ``obs`` are the env batch. Default 1.
            counted (Tensor, optional): bool ``[batch.numel()]``, the rows merged into the
                statistics (a partial reset's envs reset); ``None``: every row.

        Returns:
            Tensor: ``(obs - mean) / max(sqrt(var), eps)`` (clamped to ``[-clip, clip]`` with a
            ``clip``), the shape and dtype of ``obs``; a ``frozen`` transform merges nothing.

        Raises:
            ValueError: if the features ``F`` differ from those the statistics were made for,
                the transform is ``frozen`` with no statistics yet, ``counted`` is not one flag
                per row, or an observation merged holds a NaN or an infinity (the statistics
                are left as they were).
            TypeError: if ``obs`` is not floating point (normalized values are not integers:
                convert first, e.g. with TorchRL's ``DTypeCastTransform``), or ``counted`` is not bool.
        """
        if not obs.is_floating_point():
            raise TypeError(f"{self.key!r} is {obs.dtype}: normalized observations are real numbers; cast it to a "
                            "float dtype before this transform (e.g. DTypeCastTransform or EncodeObservation).")
        if counted is not None and counted.dtype != torch.bool:
            raise TypeError(f"counted must be a bool mask of the rows merged, got {counted.dtype}; an integer "
                            "tensor would index rows instead.")
        features = obs.shape[batch_dims:]
        rows = obs.reshape(-1, *features)
        if counted is not None and counted.shape != rows.shape[:1]:
            raise ValueError(f"counted has shape {list(counted.shape)}; it must be one flag per env row, "
                             f"[{rows.shape[0]}] for {self.key!r} of shape {list(obs.shape)}.")
        if self.frozen and not self.count:
            raise ValueError(f"this frozen RunningObservationNorm has no statistics to normalize {self.key!r} by "
                             "(it has seen no observation): freeze a transform after it has run (frozen_copy()).")
        if self.mean.shape != features:
            if self.count:
                raise ValueError(f"{self.key!r} has features {list(features)}, the statistics "
                                 f"{list(self.mean.shape)}; one transform per observation shape.")
            self.mean = torch.zeros(features, dtype=torch.float64, device=obs.device)
            self.var = torch.zeros_like(self.mean)
        if not self.frozen:
            _merge_moments(self.mean, self.var, self.count, rows if counted is None else rows[counted],
                           f"{self.key!r}")
        normalized = (obs - self.mean) / self.var.sqrt().clamp_min(self.eps)
        if self.clip is not None:
            normalized = normalized.clamp(-self.clip, self.clip)
        return normalized.to(obs.dtype)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        obs = next_tensordict.get(self.key)
        next_tensordict.set(self.key, self.normalize(obs, batch_dims=next_tensordict.batch_dims))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        reset = tensordict.get("_reset", None) if tensordict is not None else None
        obs = tensordict_reset.get(self.key)
        tensordict_reset.set(self.key, self.normalize(obs, batch_dims=tensordict_reset.batch_dims,
                                                      counted=None if reset is None else reset.reshape(-1)))
        return tensordict_reset

    def transform_observation_spec(self, observation_spec):
        spec = observation_spec[self.key]  # normalized values leave the observation's bounds
        if self.clip is None:
            observation_spec[self.key] = Unbounded(shape=spec.shape, dtype=spec.dtype, device=spec.device)
        else:
            observation_spec[self.key] = Bounded(-self.clip, self.clip, shape=spec.shape, dtype=spec.dtype,
                                                 device=spec.device)
        return observation_spec
