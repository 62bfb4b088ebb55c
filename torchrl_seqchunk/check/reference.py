"""The acting side of a check: the rollout (collected or given), its episodes, and the policy
stepped again over it one step at a time, the reference every training pass is held to.

Every step of the rollout is tagged with where it comes from (:data:`ENV`, :data:`STEP`) and
its episode (:data:`EPISODE`, unique over the rollout); the tags travel with the steps through
any layout that indexes the rollout (windows, samplers, storages, transforms).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase, unravel_key
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

from .network import Network, written_keys

ENV = ("_check", "env")
"""long ``[E, T]``: the rollout row (env) of a step."""
STEP = ("_check", "t")
"""long ``[E, T]``: the step's time index in its row."""
EPISODE = ("_check", "episode")
"""long ``[E, T]``: the step's episode, unique over the rollout (a row's first steps that continue
an episode from before the rollout are an episode of their own)."""


@dataclass
class Episodes:
    """Where the acting pass reset, bool ``[E, T]`` each: ``init`` its reset flags; ``start`` those
    and each row's first step; ``last`` the steps after which it reset (``done``, or a next step
    flagged ``init``); ``episode`` as :data:`EPISODE`."""

    init: torch.Tensor
    start: torch.Tensor
    last: torch.Tensor
    episode: torch.Tensor


def collect(policy, env: EnvBase, steps: int, memory_keys: list, init_key) -> TensorDictBase:
    """``steps`` steps of every env of ``env`` (from a reset) acted by ``policy`` in step mode,
    sampling actions as a collector does; ``[E, T]``."""
    with torch.no_grad(), set_recurrent_mode(False), set_exploration_type(ExplorationType.RANDOM):
        rollout = env.rollout(steps, policy, break_when_any_done=False)
    missing = [k for k in (*memory_keys, init_key) if rollout.get(k, None) is None]
    if missing:
        raise ValueError(
            f"the env's rollout holds no {missing}: append TorchRL's InitTracker() (the reset flags) and the "
            "recurrent module's make_tensordict_primer() (its memory at the root, zeros at a reset) to the "
            "env, as for a collector, or pass init_key= / state_keys= naming the keys it holds."
        )
    return rollout


def prepare(rollout: TensorDictBase, init_key) -> tuple[TensorDictBase, Episodes]:
    """The rollout as ``[E, T]`` (a ``[T]`` one gets a row dim, leading dims are flattened) with
    its tags, and its :class:`Episodes`. Raises TypeError / ValueError naming ``rollout`` or
    ``init_key``."""
    if not isinstance(rollout, TensorDictBase):
        raise TypeError(f"the rollout must be a TensorDict [num_envs, T] (time last), got {type(rollout).__name__}.")
    if rollout.batch_dims == 0 or rollout.shape[-1] == 0:
        raise ValueError(f"the rollout has batch {list(rollout.shape)}; it needs steps, time the last batch dim "
                         "([num_envs, T] as a collector returns them).")
    rollout = rollout.unsqueeze(0) if rollout.batch_dims == 1 else rollout.reshape(-1, rollout.shape[-1])
    rows, steps = rollout.shape
    flag = rollout.get(init_key, None)
    if flag is None:
        raise ValueError(f"init_key={init_key!r} is not in the rollout: the checker needs the reset flags the "
                         "acting pass read (TorchRL's InitTracker writes 'is_init'); pass the key that holds them.")
    if flag.dtype != torch.bool or flag.numel() != rows * steps:
        raise TypeError(f"init_key={init_key!r} must be bool [num_envs, T, 1], got {flag.dtype} "
                        f"{list(flag.shape)}; convert it with .bool().reshape(num_envs, T, 1).")
    init = flag.reshape(rows, steps)
    start = init.clone()
    start[:, 0] = True
    done = rollout.get(("next", "done"), None)
    last = torch.zeros_like(init)
    last[:, :-1] = init[:, 1:]
    if done is not None:
        last |= done.reshape(rows, steps).bool()
    episode = start.reshape(-1).long().cumsum(0).reshape(rows, steps) - 1
    td = rollout.clone(False)
    td.set(ENV, torch.arange(rows).unsqueeze(1).expand(rows, steps).clone())
    td.set(STEP, torch.arange(steps).expand(rows, steps).clone())
    td.set(EPISODE, episode)
    return td, Episodes(init, start, last, episode)


@dataclass
class Reference:
    """The policy stepped over the rollout: ``outputs`` ``{key: [E, T, ...]}`` (the keys a step
    writes, and :data:`LOG_PROB`); per memory key, ``used`` (the memory each step started from)
    and ``after`` (the memory after it); ``fresh``: each step's outputs from a reset (the
    initial memory), the value a step takes where the memory is reset."""

    outputs: dict
    used: dict
    after: dict
    fresh: dict


def step_reference(net: Network, td: TensorDictBase, episodes: Episodes, init_key) -> Reference:
    """Steps ``net`` over ``td`` ``[E, T]`` in step mode from the stored memory of each row's first
    step (unless it is flagged ``init_key``), chaining its own memory; and once over every step
    from a reset."""
    rows, steps = td.shape
    keys = [*net.in_keys, unravel_key(init_key)] + ([net.action_key] if net.action_key is not None else [])
    inputs = td.select(*keys, strict=False).exclude(*net.memory_keys)
    state = {k: td.get(k)[:, 0] for k in net.memory_keys}
    writes_used = {k for m in net.memories if m.writes_used for k in m.keys}
    outputs, used, after, out_keys = {}, {k: [] for k in state}, {k: [] for k in state}, None
    for t, step in enumerate(inputs.unbind(1)):
        step = step.clone(False)
        for key, value in state.items():
            step.set(key, value)
        before = set(map(unravel_key, step.keys(True, True)))
        net.run(step, sequence=False)
        if out_keys is None:
            out_keys = written_keys(before, step, net.excluded)  # LOG_PROB among them where there is one
            outputs = {k: [] for k in out_keys}
        for key in out_keys:
            outputs[key].append(step.get(key))
        reset = episodes.init[:, t]
        for key, value in state.items():
            used[key].append(step.get(key) if key in writes_used else _masked(value, reset))
            state[key] = step.get(("next", *((key,) if isinstance(key, str) else key)))
            after[key].append(state[key])
    stack = lambda d: {k: torch.stack(v, 1) for k, v in d.items()}  # noqa: E731
    fresh = inputs.reshape(-1).clone(False)
    fresh.set(init_key, torch.ones(rows * steps, 1, dtype=torch.bool))
    for key in net.memory_keys:
        stored = td.get(key)
        fresh.set(key, torch.zeros_like(stored).reshape(rows * steps, *stored.shape[2:]))
    net.run(fresh, sequence=False)
    zero = {k: fresh.get(k).reshape(rows, steps, *fresh.get(k).shape[1:]) for k in out_keys if k in fresh.keys(True)}
    return Reference(stack(outputs), stack(used), stack(after), zero)


def _masked(value: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
    """``value`` with the rows where ``reset`` zeroed (TorchRL's step-mode rule)."""
    return torch.where(reset.reshape(-1, *[1] * (value.dim() - 1)), torch.zeros_like(value), value)
