"""The PPO steps the PPO recipes share: advantages, the update and the schedules, and one iteration of them."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from tensordict import TensorDictBase
from torch import nn

from torchrl_seqchunk import RunningObservationNorm, boundary_gae

LOGGED = ("loss_objective", "loss_critic", "entropy", "clip_fraction", "kl_approx")
"""The metrics of an update: the losses' means over its steps, the rest of its last step."""


def next_values(critic, rollout: TensorDictBase) -> torch.Tensor:
    """V(next observation) under the memory held after each step, ``[num_envs, T, 1]``.

    Where the episode goes on, that is the next step's own value, computed when acting;
    the critic runs (step mode) only on the next observations of the steps that end an
    episode (a truncation bootstraps from it) and of each row's last step."""
    values = rollout["state_value"].roll(-1, dims=-2)  # V(s_{t+1}); the last column is replaced
    ends = rollout["next", "done"].squeeze(-1).clone()  # [num_envs, T]
    ends[..., -1] = True
    with torch.no_grad():
        values[ends] = critic(rollout["next"][ends])["state_value"]
    return values


def add_advantages(cfg, critic, rollout: TensorDictBase, *, standardize: bool = False) -> TensorDictBase:
    """Writes "advantage" and "value_target" into a rollout [num_envs, T] (advantages
    standardized over the rollout with ``standardize`` or ``cfg.advantage_std_floor``, by
    their std or that floor, whichever is larger) and returns it. Every step counts, also
    those that ``--boundary-mode mask`` drops from a window (RecurrentPPOLoss's own
    ``normalize_advantage``, used when the floor is 0, counts only the slots that train)."""
    rollout["next", "state_value"] = next_values(critic, rollout)
    boundary_gae(rollout, gamma=cfg.gamma, lmbda=cfg.lmbda)  # advantage, value_target
    if standardize or cfg.advantage_std_floor:
        rollout["advantage"] = standardized(rollout["advantage"], floor=cfg.advantage_std_floor)
    return rollout


def standardized(advantage: torch.Tensor, *, floor: float = 0.0) -> torch.Tensor:
    """``(advantage - mean) / max(std, floor, 1e-8)`` over every element."""
    return (advantage - advantage.mean()) / advantage.std().clamp_min(max(1e-8, floor))


def update(loss_module, optim: torch.optim.Optimizer, batches: Iterable[TensorDictBase], *, weight,
           max_grad_norm: float) -> dict[str, float]:
    """One PPO gradient step per batch (its loss times ``weight(batch)``). Returns LOGGED: the losses'
    means over the steps, and ``entropy``, ``clip_fraction``, ``kl_approx`` of the last step (a loss
    with a ``diagnostics`` switch, as RecurrentPPOLoss, computes them for that step only; the switch
    is left as it was). A ValueError if ``batches`` is empty."""
    params = list(loss_module.parameters())
    switch = getattr(loss_module, "module", loss_module)  # under DistributedDataParallel, the loss itself
    switched = isinstance(getattr(switch, "diagnostics", None), bool)
    losses, out, batches = [], None, iter(batches)
    batch, diagnostics = next(batches, None), switch.diagnostics if switched else None
    try:
        while batch is not None:
            following = next(batches, None)
            if switched:
                switch.diagnostics = following is None
            out = loss_module(batch)
            total = (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]) * weight(batch)
            optim.zero_grad()
            total.backward()
            nn.utils.clip_grad_norm_(params, max_grad_norm)
            optim.step()
            losses.append(torch.stack([out["loss_objective"], out["loss_critic"]]).detach())
            batch = following
    finally:
        if switched:
            switch.diagnostics = diagnostics  # as the caller built it
    if out is None:
        raise ValueError("update got no batch: nothing to train on (a rollout with no window or chunk).")
    objective, critic = torch.stack(losses).mean(0).tolist()
    return {"loss_objective": objective, "loss_critic": critic,
            **{name: out[name].item() for name in LOGGED[2:]}}


def learn(cfg, rollout: TensorDictBase, critic, batching, loss_module, optim: torch.optim.Optimizer, *,
          remaining: float, obs_norm: RunningObservationNorm | None = None) -> dict[str, float]:
    """One iteration's learning from a rollout ``[num_envs, T]``: its advantages (standardized as
    ``batching`` asks), a PPO gradient step per batch of ``batching``, then the schedules at
    ``remaining`` (the run's share still to come, 1 -> 0; see :func:`anneal`). Returns
    :func:`update`'s LOGGED."""
    add_advantages(cfg, critic, rollout, standardize=batching.standardize_advantages)
    losses = update(loss_module, optim, batching.batches(rollout), weight=batching.weight,
                    max_grad_norm=cfg.max_grad_norm)
    anneal(cfg, optim, loss_module, remaining, obs_norm)
    return losses


def anneal(cfg, optim: torch.optim.Optimizer, loss_module, remaining: float,
           obs_norm: RunningObservationNorm | None = None) -> None:
    """Linear schedules, 1 -> 0 as `remaining` goes from 1 to 0; ``obs_norm`` (the env's, None
    without one) frozen once the run's done fraction ``1 - remaining`` reaches ``cfg.obs_norm_until``."""
    if cfg.anneal_lr:
        for group in optim.param_groups:
            group["lr"] = cfg.lr * remaining
    if cfg.anneal_clip:
        loss_module.clip_epsilon.fill_(cfg.clip_epsilon * remaining)
    if obs_norm is not None and cfg.obs_norm_until < 1 and 1 - remaining >= cfg.obs_norm_until:
        obs_norm.frozen = True
