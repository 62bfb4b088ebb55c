"""Rollouts of an in-process gymnasium vector env, acted on plain tensors, in TorchRL's layout.

TorchRL's ``Collector`` pays a few milliseconds of TensorDict work per step (the env's
transforms, ``step_mdp``, the policy's modules), an order of magnitude more than a cheap
env and a small recurrent policy cost. :class:`VectorEnvCollector` steps the same env (the
gymnasium ``SyncVectorEnv`` under a :class:`~torchrl_seqchunk.envs.SyncVectorGymWrapper` and
its transforms) with the same policy (through :func:`~torchrl_seqchunk.collect.tensor_policy`)
on plain tensors, and builds one TensorDict per rollout, the ``Collector``'s.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, unravel_key
from torch import nn
from torchrl.collectors.utils import split_trajectories
from torchrl.envs import TransformedEnv
from torchrl.envs.libs.gym import GymWrapper

from .._checks import check_int
from ..envs import SyncVectorGymWrapper
from .accepted import canonical, check_base, read_transforms, structure
from .policy import tensor_policy

__all__ = ["VectorEnvCollector"]

_FLAGS = ("done", "terminated", "truncated")
_STATE = ("policy_state_dict", "env_state_dict", "frames", "iter", "traj_pool")  # state_dict()'s, the Collector's


class VectorEnvCollector:
    """Rollouts ``[num_envs, T]`` of a vector env stepped by a policy on plain tensors.

    A drop-in for ``torchrl.collectors.Collector(env, policy, frames_per_batch=...,
    total_frames=...)`` on the env of :func:`~torchrl_seqchunk.envs.make_vector_env` with the
    transforms below: iterating yields the same rollouts, key for key and value for value
    (tested against the ``Collector`` step for step), at several times the frames per second.
    Each step calls the gymnasium vector env and the policy's modules
    (:func:`~torchrl_seqchunk.collect.tensor_policy`) directly, applies each transform's rule
    to plain tensors (``InitTracker``, ``RewardSum``,
    :class:`~torchrl_seqchunk.RunningObservationNorm`,
    :class:`~torchrl_seqchunk.ReturnScaledReward`, ``TensorDictPrimer``: zeros at a reset),
    carries entries from step to step as TorchRL's ``step_mdp`` does (every root entry, and the
    primed ones from ``"next"``), resets the envs that
    ended on gymnasium's ``reset_mask`` and numbers trajectories as the ``Collector`` does
    (``("collector", "traj_ids")``). A rollout holds the policy's outputs and ``"observation"``,
    ``"is_init"``, ``"episode_reward"``, the done flags at the root and under ``"next"`` (with
    ``"reward"`` and the next observation: a truncated step's final one).

    .. note:: Unlike TorchRL's ``Collector``, it runs only this env and these transforms (anything
        else is refused when it is built), and the policy through :func:`tensor_policy` (plain
        tensors where it can, the module itself on a TensorDict of the step's entries elsewhere,
        e.g. TorchRL's ``QValueModule`` and ``EGreedyModule``), under ``torch.no_grad`` with
        TorchRL's random interaction mode (its default). Its ``set_seed`` and
        ``load_state_dict`` start every env anew, where the ``Collector``'s keep the episodes in
        flight (see each; a warning says so).

    Args:
        env (TransformedEnv): a ``TransformedEnv`` over a ``SyncVectorGymWrapper`` (batch
            ``[N]``, a float ``"observation"`` ``[N, D]``) whose transforms are among
            ``InitTracker()``, ``RewardSum()``, ``RunningObservationNorm()``,
            ``ReturnScaledReward()`` (after ``RewardSum``) and ``TensorDictPrimer`` (one for each
            ResetRNN of the policy, ``rnn.make_tensordict_primer()``; zeros), with their
            default keys. Seed it (``env.set_seed``) before building the collector, which resets it.
        policy (nn.Module): a policy :func:`tensor_policy` runs, writing ``"action"`` in the
            env's action format.

    Keyword Args:
        frames_per_batch (int): frames per rollout, a multiple of ``N`` (``T = frames_per_batch // N``).
        total_frames (int or None): frames in all; iteration stops once they are collected
            (whole rollouts); negative (``float("-inf")`` too), ``None`` or ``float("inf")``:
            never, as in TorchRL (a whole float such as ``1e5`` is read as an int, a one-element
            tensor as its number). Default ``-1``.
        device (torch.device or str): where the policy runs and the rollouts are stored (the env
            and its transforms' rules run on the CPU). Default ``"cpu"``.
        split_trajs (bool): yield each rollout split by trajectory (TorchRL's
            ``split_trajectories``: ``[trajectories, T]``, zero-padded, with a ``("collector",
            "mask")``), as the ``Collector``'s option. Default ``False``.

    Raises:
        TypeError: ``env`` not such a ``TransformedEnv``, another transform, a policy
            :func:`tensor_policy` refuses, an observation other than one Box array
            ``"observation"`` (pixels, a dict, a one-hot or categorical space). ValueError: the
            wrapper built with ``frame_skip`` or given an info dict reader; no ``InitTracker``,
            a transform twice or with other keys, ``ReturnScaledReward`` before ``RewardSum``, a ResetRNN of the
            policy without a primer of its state's shape, a primer of random or non-zero values;
            ``frames_per_batch`` not a positive multiple of ``N``; ``total_frames`` 0 (a
            fractional positive float, or a tensor of other than one element, is a TypeError);
            the policy's parameters on another device than ``device``; at a step, a policy that
            writes no ``"action"``; at a rollout, transforms or policy modules (or their hooks)
            changed since it was built. A subclass of the transforms above is a TypeError (their
            rules here would skip its changes).

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from torch import nn
        >>> from torchrl.envs import Compose, InitTracker, RewardSum, TransformedEnv
        >>> from torchrl_seqchunk.envs import make_vector_env
        >>> env = TransformedEnv(make_vector_env("CartPole-v1", 4), Compose(InitTracker(), RewardSum()))
        >>> _ = env.set_seed(0)
        >>> policy = TensorDictModule(lambda obs: torch.nn.functional.one_hot((obs[:, 2] > 0).long(), 2),
        ...                           ["observation"], ["action"])
        >>> collector = VectorEnvCollector(env, policy, frames_per_batch=64, total_frames=128)
        >>> [rollout.shape for rollout in collector]
        [torch.Size([4, 16]), torch.Size([4, 16])]
    """

    def __init__(self, env: TransformedEnv, policy: nn.Module, *, frames_per_batch: int, total_frames: int | None = -1,
                 device="cpu", split_trajs: bool = False):
        if not isinstance(env, TransformedEnv) or not isinstance(env.base_env, SyncVectorGymWrapper):
            raise TypeError(f"env must be a TransformedEnv over a SyncVectorGymWrapper (make_vector_env), got "
                            f"{type(env).__name__}; step other envs with TorchRL's Collector.")
        check_base(env.base_env)
        self.env, self.device = env, torch.device("cpu" if device is None else device)
        self.num_envs = env.batch_size[0] if env.batch_dims == 1 else 0
        check_int("frames_per_batch", frames_per_batch, low=1)
        if not self.num_envs or frames_per_batch % self.num_envs:
            raise ValueError(f"frames_per_batch={frames_per_batch} must be a multiple of the env batch "
                             f"{list(env.batch_size)}: give num_envs * steps per rollout.")
        if isinstance(total_frames, torch.Tensor) and total_frames.numel() == 1:  # its number, as TorchRL's int()
            total_frames = total_frames.item()
        endless = isinstance(total_frames, float) and (total_frames < 0 or total_frames == float("inf"))
        if total_frames is None or endless:  # as TorchRL reads them
            total_frames = -1
        elif isinstance(total_frames, float) and total_frames.is_integer():
            total_frames = int(total_frames)
        if check_int("total_frames", total_frames) == 0:
            raise ValueError("total_frames must be positive, or negative or None (never stop), got 0.")
        self.frames_per_batch = frames_per_batch
        self.total_frames = None if total_frames < 0 else total_frames
        self.split_trajs = bool(split_trajs)
        self._steps = frames_per_batch // self.num_envs
        devices = {canonical(p.device) for p in policy.parameters()} - {canonical(self.device)}
        if devices:
            raise ValueError(f"the policy's parameters are on {sorted(map(str, devices))} but device={str(self.device)!r}: "
                             "move the policy there (policy.to(device)) or pass the device it is on.")
        self._obs_norm, self._reward_scale, self._reward_sum, self._primed = read_transforms(env, policy)
        self._act = tensor_policy(policy)
        self.policy, self._built = policy, structure(env, policy)
        self._vector = env.base_env._env  # the gymnasium SyncVectorEnv
        self._obs_dtype = env.base_env.observation_spec["observation"].dtype
        self._read_action = _action_reader(env.base_env)
        # the root done flags are False at every step: made per step only for a policy that reads or writes them
        touched = {unravel_key(key) for key in (*getattr(policy, "in_keys", ()), *getattr(policy, "out_keys", ()))}
        self._step_flags = not hasattr(policy, "in_keys") or bool(touched & set(_FLAGS))
        self.frames, self._iter, self._next_traj = 0, -1, 0  # _iter: the rollouts yielded less one (the Collector's)
        self.reset()  # through TorchRL once: the same first observation and statistics
        if _collector_probes(policy):  # as the Collector calls it when built: the same draws from torch's
            # generator (none where the modules' default interaction type is deterministic), the same in-place changes
            flag = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
            with torch.no_grad():
                policy(TensorDict({**self._carried, **self._root, **{name: flag for name in _FLAGS},
                                   ("collector", "traj_ids"): self._traj_ids},
                                  batch_size=[self.num_envs], device=self.device))

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames is None or self.frames < self.total_frames:
            rollout = self.rollout()
            self.frames, self._iter = self.frames + rollout.numel(), self._iter + 1
            yield split_trajectories(rollout, prefix="collector") if self.split_trajs else rollout

    @torch.no_grad()
    def reset(self) -> None:
        """Starts every env anew, as the ``Collector``'s ``reset()``: the env's reset through its
        transforms, the primed entries' zeros, a new trajectory id for each env."""
        first = self.env.reset()
        flag = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
        self._root = {"observation": first["observation"].to(self.device), "is_init": ~flag,
                      **({name: flag for name in _FLAGS} if self._step_flags else {})}
        if self._reward_sum:
            self._root["episode_reward"] = torch.zeros(self.num_envs, 1, device=self.device)
        self._carried = {key: first[key].to(self.device) for key in self._primed}  # the primers' zeros
        self._traj_ids = torch.arange(self._next_traj, self._next_traj + self.num_envs, device=self.device)
        self._next_traj += self.num_envs

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the env (``env.set_seed``: env ``i`` gets the ``i``-th seed of TorchRL's chain) and
        starts every env anew from the seeded reset (:meth:`reset`); returns the next seed.

        The envs then give the episodes of a collector built on the env seeded the same way (the
        transforms' running statistics go on from theirs). TorchRL's ``Collector.set_seed`` seeds the env (which resets it) but keeps the
        observation it held before, so its next step starts from an observation that is not
        the env's; this collector starts from the env's (a warning says so).
        """
        out = self.env.set_seed(seed, static_seed=static_seed)
        warnings.warn("VectorEnvCollector.set_seed starts every env anew from the seeded reset, where "
                      "TorchRL's Collector.set_seed keeps its observation from before the seed.", stacklevel=2)
        self.reset()
        return out

    def state_dict(self) -> OrderedDict:
        """The ``Collector``'s state, in its entries (either collector loads the other's):
        ``"policy_state_dict"``, ``"env_state_dict"`` (the env's transforms: observation and
        return statistics), ``"frames"`` (int), ``"iter"`` (int, the rollouts yielded less one)
        and ``"traj_pool"`` (``{"traj_id": ...}``, the next trajectory id, an int32 0-dim tensor).
        Its tensors are the live ones, as ``nn.Module.state_dict``'s: save it (``torch.save``)
        or deep-copy it before collecting on."""
        return OrderedDict(zip(_STATE, (self.policy.state_dict(), self.env.transform.state_dict(), self.frames,
                                        self._iter, {"traj_id": torch.tensor(self._next_traj, dtype=torch.int)})))

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads :meth:`state_dict`'s output, or that of TorchRL's ``Collector`` (on the same env
        and policy, tracking trajectory ids, its default), and starts every env anew
        (:meth:`reset`), its observation normalized by the loaded statistics.

        TorchRL's ``Collector`` goes on with the episodes in flight under new trajectory ids;
        they were normalized by the statistics before the load, so this collector starts new
        ones (a warning says so).

        Raises:
            KeyError: an entry of :meth:`state_dict` missing (the state of a ``Collector``
                built with ``track_traj_ids=False`` lacks ``"traj_pool"``). Those of
                ``nn.Module.load_state_dict`` (strict).
        """
        missing = [key for key in _STATE if key not in state_dict]
        if missing:
            raise KeyError(f"state_dict lacks {missing}: load what VectorEnvCollector.state_dict() or TorchRL's "
                           "Collector.state_dict() (with track_traj_ids=True) returned.")
        self.policy.load_state_dict(state_dict["policy_state_dict"])
        self.env.transform.load_state_dict(state_dict["env_state_dict"])
        self.frames, self._iter = int(state_dict["frames"]), int(state_dict["iter"])
        self._next_traj = int(state_dict["traj_pool"]["traj_id"])
        warnings.warn("VectorEnvCollector.load_state_dict starts every env anew, where TorchRL's Collector "
                      "goes on with the episodes in flight.", stacklevel=2)
        self.reset()

    @torch.no_grad()
    def rollout(self) -> TensorDictBase:
        """One rollout ``[N, T]``, going on from where the previous one stopped."""
        if structure(self.env, self.policy) != self._built:
            raise ValueError("the env's transforms or the policy's modules (or their hooks) changed since the "
                             "VectorEnvCollector was built, which runs them as they were then: build a new one.")
        steps = []
        for _ in range(self._steps):
            # the env's entries win over those carried from the previous step
            data = self._act({**self._carried, **self._root, ("collector", "traj_ids"): self._traj_ids})
            action = data.get("action")
            if action is None:
                raise ValueError(f"the policy wrote no \"action\" (its outputs: {sorted(map(str, data))}).")
            nxt, ended = self._step(action)
            # under "next": a primed entry the policy left unwritten keeps its value (TensorDictPrimer's step)
            after = {**{key: data[key] for key in self._primed if key in data}, **_next_entries(data)}
            steps.append((data, after, nxt))
            # TorchRL's step_mdp (keep_other=True): every root entry goes on, the primed ones from "next"
            self._carried = {**{key: value for key, value in data.items() if not _is_next(key)},
                             **{key: after[key] for key in self._primed if key in after}}
            self._reset_ended(nxt, ended)
        out = _stack([{k: v for k, v in data.items() if not _is_next(k)} for data, _, _ in steps])
        if not self._step_flags:  # False at every step, which follows a reset or a step that went on
            out.update({name: torch.zeros(self.num_envs, self._steps, 1, dtype=torch.bool, device=self.device)
                        for name in _FLAGS})
        out["next"] = _stack([{**carried, **nxt} for _, carried, nxt in steps])
        return TensorDict(out, batch_size=[self.num_envs, self._steps], device=self.device)

    def _step(self, action: torch.Tensor) -> tuple[dict, np.ndarray]:
        """Steps every env; the next step's entries, through the transforms' step rules, and the
        envs that ended (bool ``[N]``, numpy)."""
        obs, reward, terminated, truncated, _ = self._vector.step(self._read_action(action))
        ended = terminated | truncated
        shape = (self.num_envs, 1)
        # the env's values and the transforms' rules on the CPU, where the env and their statistics live
        raw_reward = torch.from_numpy(np.asarray(reward, dtype=np.float32)).view(shape)
        env = {"observation": torch.tensor(obs, dtype=self._obs_dtype), "reward": raw_reward,
               "terminated": torch.from_numpy(terminated).view(shape), "truncated": torch.from_numpy(truncated).view(shape),
               "done": torch.from_numpy(ended).view(shape)}
        if self._obs_norm is not None:
            env["observation"] = self._obs_norm.normalize(env["observation"])
        if self._reward_scale is not None:
            env["reward"] = self._reward_scale.scale(raw_reward, env["done"])
        nxt = env if self.device.type == "cpu" else {key: value.to(self.device) for key, value in env.items()}
        nxt["is_init"] = torch.zeros(shape, dtype=torch.bool, device=self.device)
        if self._reward_sum:
            nxt["episode_reward"] = self._root["episode_reward"] + raw_reward.to(self.device)
        return nxt, ended

    def _reset_ended(self, nxt: dict, ended: np.ndarray) -> None:
        """The next step's root: the step's next entries, the envs that ended reset (transforms' reset rules)."""
        root = {"observation": nxt["observation"], "is_init": nxt["is_init"]}
        if self._step_flags:  # root flags: False at every step, a tensor of its own per flag (a module may write)
            root.update({name: torch.zeros_like(nxt["is_init"]) for name in _FLAGS})
        if self._reward_sum:
            root["episode_reward"] = nxt["episode_reward"]
        if ended.any():
            obs, _ = self._vector.reset(options={"reset_mask": ended})
            obs = torch.tensor(obs, dtype=self._obs_dtype)  # the env's and the transforms' side, as in _step
            counted = torch.from_numpy(ended)
            if self._obs_norm is not None:
                obs = self._obs_norm.normalize(obs, counted=counted)
            if self._reward_scale is not None:
                self._reward_scale.reset_returns(counted)
            obs, done = obs.to(self.device), counted.to(self.device)
            column = done.unsqueeze(-1)
            root["observation"] = torch.where(column, obs, root["observation"])
            root["is_init"] = column
            for key in self._primed:  # TensorDictPrimer's reset: zeros in the envs reset
                value = self._carried[key]
                self._carried[key] = value.masked_fill(column.view(-1, *[1] * (value.dim() - 1)), 0)
            if self._reward_sum:
                root["episode_reward"] = root["episode_reward"].masked_fill(column, 0.0)
            new = torch.arange(self._next_traj, self._next_traj + int(ended.sum()), device=self.device)
            self._traj_ids = self._traj_ids.masked_scatter(done, new)
            self._next_traj += new.numel()
        self._root = root

    @torch.no_grad()
    def update_policy_weights_(self, policy_or_weights=None, *, worker_ids=None) -> None:
        """The policy runs in this process, so with no argument there is nothing to do; weights given
        (a module of the policy's structure, its ``TensorDict.from_module`` weights, or a state dict)
        are copied into the policy's parameters in place, as TorchRL's ``Collector`` loads them.
        ``worker_ids`` is accepted for ``Collector``'s interface (one worker here)."""
        if policy_or_weights is None:
            return
        if isinstance(policy_or_weights, nn.Module):
            policy_or_weights = TensorDict.from_module(policy_or_weights)
        if isinstance(policy_or_weights, TensorDictBase):
            TensorDict.from_module(self.policy).data.update_(policy_or_weights.data)
        elif isinstance(policy_or_weights, dict):
            self.policy.load_state_dict(policy_or_weights)
        else:
            raise TypeError(f"policy_or_weights must be a module, a TensorDict of weights or a state dict, got "
                            f"{type(policy_or_weights).__name__}.")

    def shutdown(self) -> None:
        """Closes the env."""
        self.env.close()


def _action_reader(base: SyncVectorGymWrapper):
    """``action -> numpy``: the wrapper's ``read_action`` (its action spec's ``to_numpy``), the spec
    looked up once where the wrapper reads one action entry as ``GymWrapper`` does."""
    if type(base).read_action is not GymWrapper.read_action or len(base.action_keys) != 1:
        return lambda action: base.read_action(action.cpu())
    spec = base.full_action_spec[base.action_keys[0]]
    return lambda action: spec.to_numpy(action.cpu(), safe=False)


def _collector_probes(policy: nn.Module) -> bool:
    """Whether TorchRL's ``Collector`` (its default buffers) calls the policy once when it is built, on
    the first step's entries, to learn its outputs: a policy without a complete ``spec``, or whose
    ``out_keys`` the spec lacks (``Collector._maybe_make_final_rollout``)."""
    spec = getattr(policy, "spec", None)
    if spec is None or any(value is None for value in spec.values(True, True)):
        return True
    return any(unravel_key(key) not in set(spec.keys(True, True)) for key in getattr(policy, "out_keys", ()))


def _is_next(key) -> bool:
    return isinstance(key, tuple) and key[0] == "next"


def _next_entries(data: dict) -> dict:
    """The policy's ``("next", *key)`` outputs under ``key``: what the next step reads at the root."""
    return {(key[1:] if len(key) > 2 else key[1]): value for key, value in data.items() if _is_next(key)}


def _stack(steps: list[dict]) -> dict:
    """Per-step dicts of ``[N, ...]`` tensors -> nested dict of ``[N, T, ...]`` tensors, leaving out
    private keys (a part starting with ``"_"``), as TorchRL's collectors do."""
    out: dict = {}
    for key in steps[0]:
        if any(part.startswith("_") for part in (key if isinstance(key, tuple) else (key,))):
            continue
        value = torch.stack([step[key] for step in steps], 1)
        *parents, leaf = key if isinstance(key, tuple) else (key,)
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out
