"""The recurrent DQN's replay: the buffer of each ``--replay``, what goes into it, and the
training batches drawn from it (stream chunks, TorchRL's Sequence windows or its slices).

The batches, each ``[B, L]`` (L = ``cfg.window``): ``"is_first"`` bool ``[B, L, 1]`` where an
episode starts, the stored steps (observation, action, the ``"next"`` keys), and either
``LEARN`` bool ``[B, L]`` (windows: the steps that count in the loss) or ``STREAM`` long
``[B, T]`` (stream chunks: the stream each row continues).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.data.replay_buffers.sample_units import Sequence

from torchrl_seqchunk import StreamChunkSampler

from .common.windows import mark_outside

if TYPE_CHECKING:
    from .dqn import Config

LEARN = "learn"  # bool [B, L]: the steps of a window that count in the loss
STREAM = "stream"  # long [B, T]: the stream a row of stream chunks continues


def make_buffer(cfg: Config) -> TensorDictReplayBuffer:
    """The recipe's replay buffer: B sequences of `cfg.window` steps per sample, or [P, T]
    chunks of the P = stream_groups x B streams."""
    generator = torch.Generator().manual_seed(cfg.seed)
    if cfg.replay == "streams":
        streams = cfg.stream_groups * cfg.batch_rows
        sampler = StreamChunkSampler(streams, cfg.seq_len, traj_key=("collector", "traj_ids"),
                                     only_complete=False, generator=generator)
        return TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), sampler=sampler,
                                      batch_size=streams * cfg.seq_len)
    storage = LazyTensorStorage(cfg.buffer_size, ndim=2)  # [time, env]: each env's steps in order
    if cfg.replay == "sequence":
        unit = Sequence(length=cfg.seq_len, episode_boundary="include_reset", burn_in=cfg.burn_in)
        return TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=cfg.batch_rows,
                                      generator=generator)
    # init_key=None: the stored is_init flags stay; the window's first step starts from the
    # stored state unless it is an episode start (then from zeros)
    sampler = SliceSampler(slice_len=cfg.seq_len, end_key=("next", "done"), strict_length=False,
                           pad_output=True, init_key=None)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=cfg.batch_rows * cfg.seq_len,
                                  generator=generator)


STEP_KEYS = ["observation", "action", "is_init", ("collector", "traj_ids"),
             *(("next", key) for key in ("observation", "reward", "done", "terminated", "truncated"))]
"""What every recipe trains on; the actor's other outputs (features, values) are not stored."""


def write(cfg: Config, buffer: TensorDictReplayBuffer, batch: TensorDictBase) -> None:
    """Collector batch [num_envs, collect_len] -> the buffer (flat, env after env, for
    streams): the STEP_KEYS, plus the actor's memory where a window starts from it
    (stream chunks start from the carried state, so their steps store no memory)."""
    stored = [] if cfg.replay == "streams" or cfg.initial_state == "zero" else ["q_state"]
    batch = batch.select(*STEP_KEYS, *stored, strict=False)
    buffer.extend(batch.reshape(-1) if cfg.replay == "streams" else batch)


def batches(cfg: Config, buffer: TensorDictReplayBuffer):
    """Endless training batches [B, L]: a sample of windows each, or each [P, T] chunk of
    the streams (after the last --overlap steps of the stream's previous chunk) B rows at a
    time, in turn."""
    tail = None
    while True:
        batch = sample(cfg, buffer)
        if cfg.replay == "streams" and cfg.overlap:
            batch, tail = overlapped(batch, tail, cfg.overlap)
        yield from (batch.split(cfg.batch_rows, 0) if cfg.replay == "streams" else (batch,))


def overlapped(chunk: TensorDictBase, tail: TensorDictBase | None, k: int) -> tuple[TensorDictBase, TensorDictBase]:
    """A [P, T] chunk after its streams' previous last k steps ([P, k + T]), and its own last k.

    Before a stream's first chunk there is nothing to burn in: k copies of its first step,
    each an episode of one step, so the chunk's first step starts from zeros (it is an
    episode start anyway: streams begin with whole episodes)."""
    if tail is None:
        tail = chunk[:, :1].expand(chunk.shape[0], k).clone()
        tail["is_first"] = torch.ones_like(tail["is_first"])
        for key in ("done", "terminated"):
            tail["next", key] = torch.ones_like(tail["next", key])
        tail["next", "truncated"] = torch.zeros_like(tail["next", "truncated"])
    return torch.cat([tail, chunk], 1), chunk[:, -k:].clone()


def sample(cfg: Config, buffer: TensorDictReplayBuffer) -> TensorDictBase:
    """B sequences [B, L] with is_first, and LEARN where they count in the loss (windows);
    or a chunk [P, T] of the P streams, with is_first and each row's STREAM id.

    The steps past a window's real ones (repeats of the newest record, or of a short
    episode's last step) become one episode of their own, out of the loss, so that the
    last real step bootstraps from its own next observation."""
    batch = buffer.sample()
    if cfg.replay == "streams":  # [P, T], is_first from the sampler
        batch[STREAM] = torch.arange(batch.shape[0]).unsqueeze(1).expand(batch.shape)
        return batch
    batch = batch.reshape(cfg.batch_rows, cfg.window)
    if cfg.replay == "sequence":
        batch = from_first_record(batch)
        valid = batch["validity_mask"]
        learn = batch["learning_mask"] & valid
    else:
        valid = learn = batch.get(("collector", "mask"), None)  # written when a slice was padded
        if valid is None:
            valid = learn = torch.ones(batch.shape, dtype=torch.bool)
    return mark_outside(batch, valid, learn, LEARN)  # from_first_record left no step before the first record


def from_first_record(batch: TensorDictBase) -> TensorDictBase:
    """Sequence windows [B, L] whose burn-in reaches before the oldest stored record (TorchRL's
    Sequence then repeats that record, marked invalid in "validity_mask") moved to start at that
    record, from its own stored memory, instead of unrolling the repeats as steps of the episode.
    A row's steps shift left by its repeats; its last steps, now past its real ones, are marked
    invalid (the burn-in stays the first K steps, so up to K learned steps of such a window are
    only burnt in)."""
    valid = batch["validity_mask"]
    lead = (~valid).long().cumprod(1).sum(1, keepdim=True)  # [B, 1] repeats before the first real record
    if not bool(lead.any()):
        return batch
    steps = torch.arange(batch.shape[1]) + lead
    batch = batch[torch.arange(batch.shape[0]).unsqueeze(1), steps.clamp(max=batch.shape[1] - 1)]
    batch["validity_mask"] = batch["validity_mask"] & (steps < valid.shape[1])
    return batch
