"""What :class:`~torchrl_seqchunk.VectorEnvCollector` runs, checked when it is built: the
vector env's wrapper, its transforms (each applied by its rule on plain tensors), the policy's
primers and device, and the structure it compares at each rollout."""
from __future__ import annotations

import torch
from tensordict import unravel_key
from torch import nn
from torchrl.data import Bounded, Unbounded
from torchrl.envs import Compose, InitTracker, RewardSum, TensorDictPrimer, TransformedEnv

from ..envs import SyncVectorGymWrapper
from ..recurrent.module import ResetRNN
from ..reward_norm import ReturnScaledReward, RunningObservationNorm

APPLIED = (InitTracker, RewardSum, RunningObservationNorm, ReturnScaledReward)  # by their rules, on plain tensors


def check_base(base: SyncVectorGymWrapper) -> None:
    """Refuses a wrapper whose TorchRL step does more than one gymnasium step read as one array
    "observation": frame skipping, info dict readers, other observation entries (pixels, a dict
    space) or a one-hot / categorical observation (TorchRL encodes it, the plain step would not)."""
    if base.wrapper_frame_skip != 1:
        raise ValueError(f"the SyncVectorGymWrapper was built with frame_skip={base.wrapper_frame_skip}, which "
                         "VectorEnvCollector does not apply (it steps each env once per action); skip frames "
                         "in the gymnasium envs (a wrapper) or step this env with TorchRL's Collector.")
    if base.info_dict_reader:
        raise ValueError("the SyncVectorGymWrapper has an info dict reader, whose keys VectorEnvCollector does "
                         "not read; step this env with TorchRL's Collector.")
    keys = list(base.observation_spec.keys(True, True))
    if keys != ["observation"] or not isinstance(base.observation_spec["observation"], (Bounded, Unbounded)):
        raise TypeError(f"VectorEnvCollector reads one Box observation into \"observation\"; this env's "
                        f"observation spec is {[(str(k), type(base.observation_spec[k]).__name__) for k in keys]} "
                        "(flatten or encode the observation in the gymnasium envs, as make_vector_env does, or "
                        "step this env with TorchRL's Collector).")


def structure(env: TransformedEnv, policy: nn.Module) -> tuple:
    """What the collector reads when built: the env's transforms and the policy's modules (their
    inner modules and hooks), by identity."""
    modules = tuple((id(m), id(getattr(m, "module", None)), len(m._forward_hooks),
                     sum(getattr(hook, "__name__", "") != "_infer_parameters"  # a lazy module's own, removed when it
                         for hook in m._forward_pre_hooks.values()))        # first runs
                    for m in policy.modules())
    return tuple(map(id, flat(env.transform))), modules


def canonical(device) -> torch.device:
    """``device`` with its index resolved (``"cuda"`` is the current CUDA device, ``"cpu:0"`` the CPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None:
        index = torch.cuda.current_device() if device.type == "cuda" and torch.cuda.is_available() else 0
        return torch.device(device.type, index)
    return device


def flat(transform) -> list:
    """A transform, or a Compose of them (nested too), as a flat list."""
    if isinstance(transform, Compose):
        return [leaf for t in transform for leaf in flat(t)]
    return [transform]


def read_transforms(env: TransformedEnv, policy: nn.Module):
    """The env's transforms, checked: each known, with its default keys, once; the primers those
    of the policy's ResetRNN states among them. Returns (RunningObservationNorm, ReturnScaledReward,
    RewardSum?, the primed keys)."""
    transforms = flat(env.transform)
    kinds = [type(t) for t in transforms]
    if not any(isinstance(t, InitTracker) for t in transforms):  # a subclass is named below
        raise ValueError("the env has no InitTracker: append InitTracker() (the episode-start flags "
                         "\"is_init\" the rollouts hold and ResetRNN resets on).")
    obs_norm = reward_scale = None
    primed: dict = {}
    for transform in transforms:
        if type(transform) is TensorDictPrimer:
            if transform.random or any(not isinstance(v, (int, float)) or v != 0
                                       for v in transform.default_value.values()):
                raise ValueError("a TensorDictPrimer with random=True or a default_value other than 0: "
                                 "VectorEnvCollector resets primed entries to zeros; step this env with "
                                 "TorchRL's Collector.")
            primed.update((unravel_key(k), spec.shape) for k, spec in transform.primers.items(True, True))
            continue
        if type(transform) not in APPLIED:
            known = isinstance(transform, (*APPLIED, TensorDictPrimer))
            sub = " (a subclass, whose changes its rules would skip)" if known else ""
            raise TypeError(f"VectorEnvCollector cannot apply {type(transform).__name__}{sub} on plain tensors "
                            "(it applies InitTracker, RewardSum, RunningObservationNorm, ReturnScaledReward "
                            "and the primers of the policy's ResetRNN states, by their own rules); step this env "
                            "with TorchRL's Collector.")
        if kinds.count(type(transform)) > 1:
            raise ValueError(f"the env applies {type(transform).__name__} more than once; VectorEnvCollector "
                             "applies each transform once: keep one.")
        if isinstance(transform, InitTracker):
            ok = transform.init_key == "is_init"
        elif isinstance(transform, RewardSum):
            ok = list(transform.in_keys) == ["reward"] and list(transform.out_keys) == ["episode_reward"]
        elif isinstance(transform, RunningObservationNorm):
            ok, obs_norm = transform.key == "observation", transform
        else:
            if RewardSum in kinds[kinds.index(ReturnScaledReward):]:
                raise ValueError("ReturnScaledReward comes before RewardSum: the episode return would sum "
                                 "scaled rewards; put RewardSum first, as TorchRL's chain reads them.")
            ok, reward_scale = (transform.reward_key, transform.done_key) == ("reward", "done"), transform
        if not ok:
            raise ValueError(f"{type(transform).__name__} reads or writes other keys than the defaults "
                             "(observation, reward, done, is_init, episode_reward) VectorEnvCollector "
                             "uses; build it with its default keys.")
    check_primers(primed, policy)
    return obs_norm, reward_scale, RewardSum in kinds, list(primed)


def check_primers(primed: dict, policy: nn.Module) -> None:
    """Every ResetRNN state of the policy has a primer of its shape."""
    states = {key: shape for rnn in policy.modules() if isinstance(rnn, ResetRNN)
              for key, shape in zip(rnn.state_keys, rnn.state_shapes)}
    for key, shape in states.items():
        if key not in primed or tuple(primed[key][len(primed[key]) - len(shape):]) != tuple(shape):
            raise ValueError(f"the policy's ResetRNN state {key!r} {list(shape)} has no primer of that shape in "
                             "the env: append rnn.make_tensordict_primer() for each ResetRNN (TorchRL's Collector "
                             "needs it too).")
