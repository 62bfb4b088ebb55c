"""The PPO steps both main jobs share: advantages, the update and the schedules."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from tensordict import TensorDictBase
from torch import nn

from torchrl_seqchunk import boundary_gae

LOGGED = ("loss_objective", "loss_critic", "entropy", "clip_fraction", "kl_approx")


def add_advantages(cfg, critic, rollout: TensorDictBase, *, standardize: bool = False) -> TensorDictBase:
    """Writes "advantage" and "value_target" into a rollout [num_envs, T] (advantages
    standardized over the rollout with ``standardize``) and returns it."""
    with torch.no_grad():  # V(next observation) under the memory held after each step
        next_values = critic(rollout["next"].reshape(-1))["state_value"]  # step mode, [num_envs * T, 1]
    rollout["next", "state_value"] = next_values.view(*rollout.shape, 1)
    boundary_gae(rollout, gamma=cfg.gamma, lmbda=cfg.lmbda)  # advantage, value_target
    if standardize:
        advantage = rollout["advantage"]
        rollout["advantage"] = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-8)
    return rollout


def update(loss_module, optim: torch.optim.Optimizer, batches: Iterable[TensorDictBase], *, weight,
           max_grad_norm: float) -> TensorDictBase:
    """One PPO gradient step per batch (its loss times ``weight(batch)``); returns the mean of the logged losses."""
    logs = []
    for batch in batches:
        loss = loss_module(batch)
        total = (loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]) * weight(batch)
        optim.zero_grad()
        total.backward()
        nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
        optim.step()
        logs.append(loss.detach().select(*LOGGED))
    return torch.stack(logs).mean()


def anneal(cfg, optim: torch.optim.Optimizer, loss_module, remaining: float) -> None:
    """Linear schedules, 1 -> 0 as `remaining` goes from 1 to 0."""
    if cfg.anneal_lr:
        for group in optim.param_groups:
            group["lr"] = cfg.lr * remaining
    if cfg.anneal_clip:
        loss_module.clip_epsilon.fill_(cfg.clip_epsilon * remaining)


def finished_returns(steps: TensorDictBase) -> list[float]:
    """The raw returns of the episodes that end in `steps` (any batch shape)."""
    done = steps["next", "done"].squeeze(-1)
    return steps["next", "episode_reward"][done].squeeze(-1).tolist()
