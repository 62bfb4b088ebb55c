"""The recipes' envs and the collector that steps them."""
from __future__ import annotations

import functools
import warnings

import torch
from torchrl.collectors import Collector
from torchrl.envs import Compose, InitTracker, ParallelEnv, RewardSum, SerialEnv, TensorDictPrimer, TransformedEnv

from torchrl_seqchunk import ReturnScaledReward, RunningObservationNorm, VectorEnvCollector
from torchrl_seqchunk.envs import DEFAULT_KEEP, make_masked_env, make_vector_env


def kept_indices(cfg, *, warn: bool = False) -> tuple[int, ...] | None:
    """The observation indices of ``--keep`` (None: the whole observation); ``warn``: say if
    ``--keep auto`` knows no mask for the env."""
    if cfg.keep == "all":
        return None
    if cfg.keep != "auto":
        return tuple(int(i) for i in cfg.keep.split(","))  # e.g. "0,2"
    keep = DEFAULT_KEEP.get(cfg.env)
    if warn and keep is None:
        warnings.warn(f"--keep auto: no known mask for {cfg.env}, so the agent sees the env's whole "
                      "observation (right for tasks that are partially observable already, such as "
                      "POPGym's); pass --keep with the indices to keep to hide the rest.", stacklevel=2)
    return keep


def check_keep(cfg) -> None:
    """Builds one env of the run to check ``--keep`` against its observation; a ValueError names the flag."""
    try:
        make_masked_env(cfg.env, kept_indices(cfg)).close()
    except ValueError as err:
        raise ValueError(f"--keep {cfg.keep}: {err}") from None


def make_env(cfg, *, warn: bool = False) -> TransformedEnv:
    """The batched, transformed env of the run; ``warn``: say once per run if --keep auto knows no mask."""
    limit = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    keep = kept_indices(cfg, warn=warn)
    prev_reward = getattr(cfg, "prev_reward", False)  # a recipe's option (seqchunk sac's)
    if cfg.env_batching == "vector":  # the episodes of serial for the same seed, several times faster
        batched = make_vector_env(cfg.env, cfg.num_envs, keep, prev_reward=prev_reward, **limit)
    else:
        factory = functools.partial(make_masked_env, cfg.env, keep, prev_reward=prev_reward, **limit)  # picklable
        batched = {"serial": SerialEnv, "parallel": ParallelEnv}[cfg.env_batching](cfg.num_envs, factory)
    # TorchRL's is_init: True on the first step of every episode, what ResetRNN's step mode resets on.
    transforms = [InitTracker(), RewardSum()]  # RewardSum: the raw return
    if cfg.obs_norm:  # VecNormV2's rule, one set of statistics over all envs, counting the envs reset
        transforms.append(RunningObservationNorm())
    if cfg.reward_norm:
        transforms.append(ReturnScaledReward(gamma=cfg.gamma))
    return TransformedEnv(batched, Compose(*transforms))


def obs_norm_of(env: TransformedEnv) -> RunningObservationNorm | None:
    """The env's RunningObservationNorm (``make_env`` appends one with ``cfg.obs_norm``), or None."""
    return next((t for t in env.transform if isinstance(t, RunningObservationNorm)), None)


def make_acting_env(cfg, rnns, seed: int) -> TransformedEnv:
    """make_env's env with the primers of the agent's ResetRNNs, seeded: what a collector steps.

    The primers declare each ResetRNN's memory in the env specs: zeros at reset, carried
    from ("next", state) to the root by the collector; one TensorDictPrimer holds them all
    (one pass at each reset). A module-level function, so
    functools.partial(make_acting_env, cfg, rnns, seed) is a picklable env factory for
    workers in other processes (Ray actors)."""
    env = make_env(cfg)
    specs = {key: spec for rnn in rnns for key, spec in rnn.make_tensordict_primer().primers.items(True, True)}
    env.append_transform(TensorDictPrimer(specs, expand_specs=True))
    env.set_seed(seed)
    return env


def seeded(seed: int, factory):
    """``factory()`` after seeding torch's global generator with ``seed``: in a worker process
    (a Ray actor) the generator its policy draws the actions from, which every process would
    otherwise start from torch's one default seed. ``functools.partial(seeded, seed, factory)``
    is a picklable env factory."""
    torch.manual_seed(seed)
    return factory()


def make_collector(cfg, env, policy, frames_per_batch: int, total_frames: int):
    """The collector of a run: steps ``env`` with ``policy`` (whose ResetRNNs store their memory);
    on the in-process vector env (``--env-batching vector``) VectorEnvCollector (the rollouts of
    TorchRL's Collector, without its per-step TensorDict work), else TorchRL's Collector."""
    kind = VectorEnvCollector if cfg.env_batching == "vector" else Collector
    return kind(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames, device=cfg.device)
