"""One training pass of a layout over a rollout, gathered as flat slots with their origin."""
from __future__ import annotations

import contextlib

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from torchrl.modules import set_recurrent_mode

from .layouts import TRAINED, TrainingLayout
from .network import LOG_PROB, Network
from .reference import ENV, EPISODE, STEP

RATIO_LOG = ("_check", "log_ratio")
"""float ``[N, L]``: ``log pi_train(a) - stored log-prob``, written by a pass with a PPO loss."""


@dataclass
class Slots:
    """Every slot of a training pass, flat ``[S]``: its origin (``env``, ``t``, ``episode``), whether
    it trains, its training row (``row``; a stream for a carrying layout) and place in that row
    (``pos``, counted over the row's batches), whether it is its batch row's first or last trained
    slot (``first``, ``last``), the outputs ``{key: [S, ...]}`` and ``log_ratio`` (or None)."""

    env: torch.Tensor
    t: torch.Tensor
    episode: torch.Tensor
    trained: torch.Tensor
    row: torch.Tensor
    pos: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    outputs: dict
    log_ratio: torch.Tensor | None

    def same_slots(self, other: "Slots") -> bool:
        """Whether ``other`` holds the same steps in the same places (a layout that drew the same batches)."""
        return (self.env.shape == other.env.shape and bool((self.env == other.env).all())
                and bool((self.t == other.t).all()))

    def successor(self) -> torch.Tensor:
        """long ``[S]``: the index of the slot after each in its training row, ``-1`` at a row's end."""
        order = torch.argsort(self.row * (int(self.pos.max()) + 2) + self.pos)
        nxt = torch.full_like(self.row, -1)
        same = (self.row[order[1:]] == self.row[order[:-1]]) & (self.pos[order[1:]] == self.pos[order[:-1]] + 1)
        nxt[order[:-1][same]] = order[1:][same]
        return nxt


def make_runner(net: Network, ppo_loss=None):
    """``run(batch, main=True)``: the network in sequence mode over ``batch``; in the main pass with
    ``ppo_loss`` also the loss's actor (its parameters, its keys) writing :data:`RATIO_LOG`, else the
    pass's own log-probability against the stored one (``main=False``: a further pass, no ratio)."""

    def run(batch: TensorDictBase, main: bool = True) -> TensorDictBase:
        net.run(batch, sequence=True)
        if not main:
            return batch
        if ppo_loss is not None:
            keys = ppo_loss.tensor_keys
            if batch.get(keys.sample_log_prob, None) is None:
                raise ValueError(f"ppo_loss reads the stored log-probability {keys.sample_log_prob!r}, which the "
                                 "rollout lacks: act with return_log_prob=True, or set_keys(sample_log_prob=...) "
                                 "on the loss to name the key the actor writes.")
            params = ppo_loss.actor_network_params  # None where the loss is not functional
            with torch.no_grad(), set_recurrent_mode(True), \
                    contextlib.nullcontext() if params is None else params.to_module(ppo_loss.actor_network):
                dist = ppo_loss.actor_network.get_dist(batch)
                log_prob = dist.log_prob(batch.get(keys.action))
            batch.set(RATIO_LOG, log_prob.reshape(batch.shape) - batch.get(keys.sample_log_prob).reshape(batch.shape))
        elif net.log_prob_key is not None and batch.get(LOG_PROB, None) is not None \
                and batch.get(net.log_prob_key, None) is not None:
            batch.set(RATIO_LOG, batch.get(LOG_PROB).reshape(batch.shape)
                      - batch.get(net.log_prob_key).reshape(batch.shape))
        return batch

    return run


def original_batches(layout: TrainingLayout, network, rollout: TensorDictBase, memory_keys: list) -> list:
    """The layout's batches for ``rollout`` (after :meth:`TrainingLayout.start`), checked for shape and origin."""
    layout.start(network)
    batches = list(layout.batches(rollout, memory_keys))
    if not batches:
        raise ValueError(f"the layout {layout.describe()} gave no batch for a rollout {list(rollout.shape)}.")
    for batch in batches:
        if not isinstance(batch, TensorDictBase) or batch.batch_dims != 2:
            raise ValueError(f"the layout {layout.describe()} gave a batch {getattr(batch, 'shape', batch)}; a "
                             "layout yields TensorDicts [N, L], time last.")
        if batch.get(ENV, None) is None:
            raise ValueError(f"a batch of the layout {layout.describe()} lost the entries under '_check' (each "
                             "step's origin): build batches by indexing the rollout given, keeping its keys.")
    return batches


def run_pass(layout: TrainingLayout, net: Network, batches: list, run, out_keys: list) -> Slots:
    """The layout's training pass over ``batches`` (each through a copy without the outputs, so that
    a pass writing none leaves none), gathered as :class:`Slots`."""
    layout.start(net.module)
    parts, offset = [], 0
    for index, batch in enumerate(batches):
        work = batch.exclude(*out_keys, LOG_PROB, RATIO_LOG)
        with torch.no_grad(), set_recurrent_mode(True):  # training: a loss's own passes run in sequence mode
            layout.train(run, work)
        rows, steps = work.shape
        trained = work.get(TRAINED, None)
        trained = torch.ones(rows, steps, dtype=torch.bool) if trained is None else trained.reshape(rows, steps).bool()
        col = torch.arange(steps).expand(rows, steps)
        row = torch.arange(rows).unsqueeze(1).expand(rows, steps)
        if layout.carries:
            pos = col + index * steps
        else:
            row, pos = row + offset, col
        offset += rows
        outputs = {k: work.get(k).reshape(rows * steps, *work.get(k).shape[2:])
                   for k in (*out_keys, LOG_PROB) if work.get(k, None) is not None}
        ratio = work.get(RATIO_LOG, None)
        parts.append(dict(
            env=work.get(ENV).reshape(-1), t=work.get(STEP).reshape(-1), episode=work.get(EPISODE).reshape(-1),
            trained=trained.reshape(-1), row=row.reshape(-1), pos=pos.reshape(-1),
            first=(col == torch.where(trained, col, steps).amin(1, keepdim=True)).reshape(-1),
            last=(col == torch.where(trained, col, -1).amax(1, keepdim=True)).reshape(-1), outputs=outputs,
            log_ratio=None if ratio is None else ratio.reshape(-1)))
    keys = [k for k in parts[0]["outputs"] if all(k in p["outputs"] for p in parts)]  # the step's order
    gathered = {name: torch.cat([p[name] for p in parts]) for name in
                ("env", "t", "episode", "trained", "row", "pos", "first", "last")}
    ratios = [p["log_ratio"] for p in parts]
    return Slots(**gathered, outputs={k: torch.cat([p["outputs"][k] for p in parts]) for k in keys},
                 log_ratio=None if any(r is None for r in ratios) else torch.cat(ratios))
