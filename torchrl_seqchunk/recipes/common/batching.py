"""Rollout -> batches: the main job's two batchings behind one interface.

Each batching has ``make_loss(actor, critic)``, ``batches(rollout)`` (every gradient step's
batch for one rollout, all epochs), ``weight(batch)`` (the batch's share of a gradient
step) and ``standardize_advantages`` (whether advantages are standardized per rollout
before batching, rather than per batch by the loss).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import torch
from tensordict import TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.objectives import ClipPPOLoss

from torchrl_seqchunk import ChunkPrefetcher, RecurrentPPOLoss, StreamChunkSampler, make_windows


def ppo_options(cfg) -> dict:
    return dict(clip_epsilon=cfg.clip_epsilon, entropy_coeff=cfg.entropy_coeff, critic_coeff=cfg.critic_coeff,
                loss_critic_type="l2", normalize_advantage=True)


class WindowBatching:
    """``--batching windows``: make_windows cuts every rollout [num_envs, T] into windows [N, W]
    (``--window``, ``--stride``), shuffled into ``--minibatches`` per epoch, unrolled by
    RecurrentPPOLoss with ``--boundary-mode``."""

    standardize_advantages = False

    def __init__(self, cfg, memory_keys: list):
        self.cfg, self.memory_keys = cfg, memory_keys

    def make_loss(self, actor, critic) -> RecurrentPPOLoss:
        # with --advantage-std-floor, add_advantages standardizes each rollout (floored) instead
        options = {**ppo_options(self.cfg), "normalize_advantage": not self.cfg.advantage_std_floor}
        return RecurrentPPOLoss(actor, critic, boundary_mode=self.cfg.boundary_mode, **options)

    def batches(self, rollout: TensorDictBase) -> list[TensorDictBase]:
        cfg = self.cfg
        windows = make_windows(rollout, cfg.window, stride=cfg.stride, memory_key=self.memory_keys)  # [N, W]
        return [windows[idx] for _ in range(cfg.epochs)
                for idx in torch.randperm(windows.shape[0]).chunk(cfg.minibatches)]

    def weight(self, batch: TensorDictBase) -> float:
        return 1.0


class StreamBatching:
    """``--batching streams``: the steps go into a storage read as ``--num-streams`` balanced
    streams, each episode piece once per epoch (StreamChunkSampler(replacement=False)); a
    ChunkPrefetcher delivers chunks [B, T] in order and the ResetRNNs carry their state from
    one chunk to the next (truncated BPTT), so TorchRL's ClipPPOLoss is enough."""

    standardize_advantages = True

    def __init__(self, cfg, buffer: TensorDictReplayBuffer, *, epoch: Iterable | None = None):
        """``epoch``: what one epoch iterates (default: the buffer, one pass of chunks)."""
        self.cfg, self.buffer, self.epoch = cfg, buffer, buffer if epoch is None else epoch

    @staticmethod
    def make_buffer(cfg, capacity: int, generator: torch.Generator) -> TensorDictReplayBuffer:
        """A storage of ``capacity`` rollout steps read as B balanced streams of chunks [B, T]."""
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity, device=cfg.device),
            sampler=StreamChunkSampler(cfg.num_streams, cfg.seq_len, replacement=False,
                                       traj_key=("collector", "traj_ids"), only_complete=False,
                                       generator=generator),
            batch_size=cfg.num_streams * cfg.seq_len,
        )

    def make_loss(self, actor, critic) -> ClipPPOLoss:
        # Padded slots (("collector", "mask") False) are left out of the loss's means, but not
        # out of its advantage statistics: advantages are standardized per rollout instead.
        return ClipPPOLoss(actor, critic, **{**ppo_options(self.cfg), "normalize_advantage": False})

    def batches(self, rollout: TensorDictBase | None = None) -> Iterator[TensorDictBase]:
        """``rollout`` [num_envs, T] replaces the buffer's steps (None: the buffer was filled elsewhere)."""
        if rollout is not None:
            self.buffer.empty()
            self.buffer.extend(rollout.reshape(-1))  # [num_envs * T] steps, env after env
        epochs = itertools.chain.from_iterable(itertools.repeat(self.epoch, self.cfg.epochs))
        with ChunkPrefetcher(epochs, device=self.cfg.device) as chunks:  # keeps the chunks' order
            yield from chunks

    def weight(self, batch: TensorDictBase) -> torch.Tensor:
        return batch["collector", "mask"].float().mean()  # a chunk weighs what its real slots do


def make_batching(cfg, rnns, capacity: int) -> WindowBatching | StreamBatching:
    """The batching ``cfg.batching`` names, for rollouts of ``capacity`` steps; streams drawn
    with a generator seeded by ``cfg.seed``."""
    if cfg.batching == "windows":
        return WindowBatching(cfg, [k for rnn in rnns for k in rnn.state_keys])
    generator = torch.Generator().manual_seed(cfg.seed)
    return StreamBatching(cfg, StreamBatching.make_buffer(cfg, capacity, generator))
