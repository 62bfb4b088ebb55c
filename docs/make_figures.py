"""Draws the concept figures of the docs from the library's own output.

    python docs/make_figures.py            # writes docs/img/{streams,carry,window_counts}.png

Every figure is computed, not drawn by hand: the streams come from StreamChunkSampler,
the carried state from ResetRNN, the window counts from make_windows.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_seqchunk import ResetRNN, StreamChunkSampler, make_windows

EPISODE_LENGTHS = [5, 9, 3, 7, 4, 6, 8, 5]
NUM_STREAMS, SEQ_LEN, NUM_CHUNKS = 3, 8, 3
COLORS = plt.get_cmap("tab10").colors


def episodes_td(lengths: list[int]) -> TensorDict:
    """Steps of back-to-back episodes: "episode" id and ("next", "done") per step."""
    episode = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    done = torch.zeros(len(episode), 1, dtype=torch.bool)
    done[torch.tensor(lengths).cumsum(0) - 1] = True
    return TensorDict({"episode": episode, ("next", "done"): done}, batch_size=[len(episode)])


def sample_streams() -> TensorDict:
    """NUM_CHUNKS chunks [B, T] of the stored episodes, concatenated along time: [B, NUM_CHUNKS * T]."""
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=StreamChunkSampler(NUM_STREAMS, SEQ_LEN, generator=torch.Generator().manual_seed(1)),
        batch_size=NUM_STREAMS * SEQ_LEN,
    )
    rb.extend(episodes_td(EPISODE_LENGTHS))
    return torch.cat([rb.sample() for _ in range(NUM_CHUNKS)], dim=1)


def draw_cells(ax, row: int, episodes, is_first, *, label: str) -> None:
    for t, (e, first) in enumerate(zip(episodes.tolist(), is_first.tolist())):
        ax.add_patch(plt.Rectangle((t, row - 0.4), 1, 0.8, color=COLORS[e % 10], alpha=0.75))
        ax.text(t + 0.5, row, str(e), ha="center", va="center", fontsize=7)
        if first:
            ax.plot([t, t], [row - 0.45, row + 0.45], color="black", lw=2.5)
    ax.text(-0.5, row, label, ha="right", va="center", fontsize=9)


def figure_streams(streams: TensorDict, path: Path) -> None:
    total = streams.shape[1]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    storage = episodes_td(EPISODE_LENGTHS)
    starts = torch.zeros(len(storage), dtype=torch.bool)
    starts[torch.tensor([0, *EPISODE_LENGTHS]).cumsum(0)[:-1]] = True
    draw_cells(ax, NUM_STREAMS + 1.2, storage["episode"], starts, label="storage")
    for b in range(NUM_STREAMS):
        draw_cells(ax, NUM_STREAMS - 1 - b, streams["episode"][b], streams["is_first"][b, :, 0],
                   label=f"stream {b}")
    for k in range(1, NUM_CHUNKS):
        ax.axvline(k * SEQ_LEN, ymax=0.72, color="gray", ls="--", lw=1)
    for k in range(NUM_CHUNKS):
        ax.text((k + 0.5) * SEQ_LEN, -0.9, f"chunk {k}", ha="center", fontsize=9)
    ax.set(xlim=(-4, max(total, len(storage)) + 0.5), ylim=(-1.2, NUM_STREAMS + 1.8))
    ax.axis("off")
    ax.set_title("Episodes (numbers, colors) stored flat, dealt into streams, cut into chunks; "
                 "black bars: is_first", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Accumulate(nn.Module):
    """h_t = h_(t-1) + x_t: the state counts the steps since the last reset."""

    hidden_size = 1

    def forward(self, x, h):
        return h + x


def figure_carry(streams: TensorDict, path: Path) -> None:
    is_first = streams["is_first"][:1]  # stream 0, [1, NUM_CHUNKS * T, 1]
    fig, ax = plt.subplots(figsize=(9, 2.8))
    for carry, style in ((True, "-"), (False, "--")):
        module = ResetRNN(Accumulate(), in_key="x", out_key="h", carry=carry, default_recurrent_mode=True)
        outputs = []
        for k in range(NUM_CHUNKS):  # one call per chunk, as a trainer does
            flags = is_first[:, k * SEQ_LEN:(k + 1) * SEQ_LEN]
            chunk = TensorDict({"x": torch.ones(1, SEQ_LEN, 1), "is_first": flags}, [1, SEQ_LEN])
            outputs.append(module(chunk)["h"][0, :, 0])
        h = torch.cat(outputs)
        ax.step(range(len(h)), h.tolist(), where="mid", ls=style,
                label="ResetRNN(carry=True)" if carry else "ResetRNN(carry=False)")
    for t in is_first[0, :, 0].nonzero().flatten().tolist():
        ax.axvline(t - 0.5, color="black", lw=2, alpha=0.6)
    for k in range(1, NUM_CHUNKS):
        ax.axvline(k * SEQ_LEN - 0.5, color="gray", ls=":", lw=1)
    ax.set(xlabel="time step of stream 0 (dotted: chunk boundaries, black: is_first)",
           ylabel="hidden state h")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_window_counts(path: Path, lengths=(5, 7, 4), window: int = 4) -> None:
    steps = episodes_td(list(lengths)).unsqueeze(0)  # rollout [1, 16]
    steps["recurrent_state"] = torch.zeros(*steps.shape, 1)
    windows = make_windows(steps, window)  # [N, W]
    step_of_slot = torch.arange(steps.shape[1] - window + 1)[:, None] + torch.arange(window)
    reset = windows["is_first"][..., 0].clone()
    reset[:, 0] = False
    # boundary_mode="mask" drops every slot from the first reset past slot 0 on
    kept = reset.cumsum(1) == 0
    count = torch.zeros(steps.shape[1])
    counts = {
        "mask": count.index_add(0, step_of_slot.flatten(), kept.flatten().float()),
        "reset_continue": count.index_add(0, step_of_slot.flatten(), torch.ones(step_of_slot.numel())),
    }
    fig, ax = plt.subplots(figsize=(8, 3))
    x = torch.arange(steps.shape[1])
    for i, (name, c) in enumerate(counts.items()):
        ax.bar((x + (i - 0.5) * 0.4).tolist(), c.tolist(), width=0.4, label=name)
    start = 0
    for e, length in enumerate(lengths):
        ax.axvspan(start - 0.5, start + length - 0.5, color=COLORS[e], alpha=0.12)
        start += length
    ax.set(xlabel=f"step (episodes of lengths {list(lengths)}, shaded)",
           ylabel="windows training the step", title=f"W = {window}, one window per start step")
    ax.set_xticks(x.tolist())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    streams = sample_streams()
    figure_streams(streams, out_dir / "streams.png")
    figure_carry(streams, out_dir / "carry.png")
    figure_window_counts(out_dir / "window_counts.png")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "img")
