"""A small recurrent regression task the distributed tests train on."""
from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import set_recurrent_mode

from torchrl_seqchunk import ResetRNN, StreamChunkSampler, rank_seed


def episodes(lengths, generator=None, *, obs=None) -> TensorDict:
    """Episodes of the given lengths written back to back: "obs" [n, 2], "target" [n, 1]
    (random, from ``generator``, or ``obs`` given), ("next", "done") True at each end."""
    n = sum(lengths)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[torch.tensor(lengths).cumsum(0) - 1] = True
    obs = torch.randn(n, 2, generator=generator) if obs is None else obs
    target = torch.randn(n, 1, generator=generator)
    return TensorDict({"obs": obs, "target": target, ("next", "done"): done}, [n])


def make_buffer(rank: int, *, capacity: int = 100, streams: int = 2, seq_len: int = 4):
    """Rank ``rank``'s buffer: epochs without replacement, draws seeded by (0, rank)."""
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=StreamChunkSampler(streams, seq_len, replacement=False, seed=rank_seed(0, rank)),
        batch_size=streams * seq_len,
    )


def make_model(dropout: float = 0.0) -> tuple[TensorDictSequential, ResetRNN]:
    """obs [B, T, 2] -> Linear -> ResetRNN(GRU, carry) -> Dropout, Linear -> "pred" [B, T, 1]."""
    rnn = ResetRNN(nn.GRU(3, 4, batch_first=True))
    model = TensorDictSequential(
        TensorDictModule(nn.Linear(2, 3), ["obs"], ["embed"]),
        rnn,
        TensorDictModule(nn.Sequential(nn.Dropout(dropout), nn.Linear(4, 1)), ["features"], ["pred"]),
    )
    return model, rnn


def chunk_loss(model, chunk) -> torch.Tensor:
    """Mean squared error over the real (unpadded) slots of a [B, T] chunk."""
    mask = chunk["collector", "mask"].unsqueeze(-1).float()
    with set_recurrent_mode(True):  # [B, T] chunks: sequences
        error = (model(chunk)["pred"] - chunk["target"]).pow(2)
    return (error * mask).sum() / mask.sum()
