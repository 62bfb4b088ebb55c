"""A next-frame world model trained on stream chunks of Atari pixels.

    seqchunk world-model                       # Breakout, 20k frames
    seqchunk world-model --env ALE/Pong-v5 --train-steps 500

Needs the atari extra (ale-py): pip install "torchrl-seqchunk[atari]".

1. A plain gymnasium loop plays a random policy and writes each finished episode into a
   TorchRL storage (observation [1, 64, 64] uint8, action, and the "next" keys).
2. StreamChunkSampler(B=16, T=64) cuts the stored episodes (IndexSelectStorage: TorchRL's
   LazyTensorStorage, its gather of pixel rows several times faster) into streams of consecutive
   chunks [B, T] with is_first; ChunkPrefetcher prepares them in a background thread.
3. Two identical models (conv encoder -> ResetRNN(GRU) -> frame and reward heads) train
   on the same chunks: one carries its hidden state from chunk to chunk (truncated BPTT),
   the other starts every chunk from zeros. Both reset at episode starts (is_first).
The prediction loss by position inside the chunk (t = 0..T-1) shows what carrying buys:
the reset model pays a loss bump at the start of every chunk, where it has no memory of
the motion so far. Writes runs/<name>/metrics.csv, loss_by_position.csv and
loss_by_position.png, and prints throughput and how long the trainer waited for data.
"""
from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from tensordict import TensorDict
from torch import nn
from torchrl.data import TensorDictReplayBuffer
from tqdm import tqdm

from torchrl_seqchunk import ChunkPrefetcher, IndexSelectStorage, ResetRNN, StreamChunkSampler

from .common import options
from .common.report import METRICS, Run, check_run_folder

__all__ = ["Config", "FrameModel", "Run", "check_command", "train"]


@dataclasses.dataclass
class Config:
    """The world model recipe's options: the Atari game and its frames, the stream chunks
    ``[num_streams, seq_len]``, the models and their training; ``check()`` raises a ValueError
    that names the field (as its flag) and the fix."""
    env: str = "ALE/Breakout-v5"
    """Atari game (gymnasium id; needs the atari extra)"""
    total_frames: int = 20_000
    """env steps collected by the random policy"""
    train_steps: int = 150
    """gradient steps per model"""
    seed: int = 0
    """seed of torch, the env and the sampler"""
    device: str = "cpu"
    """torch device of the models"""
    name: str = ""
    """run directory under --runs-dir; "" derives it from the env and seed"""
    runs_dir: str = "runs"
    """folder of the run directories"""
    overwrite: bool = False
    """replace the outputs of a finished run of the same name"""
    size: int = 64
    """frames are resized to size x size grayscale (a multiple of 8)"""
    num_streams: int = 16
    """B, streams per chunk"""
    seq_len: int = 64
    """T, steps per chunk"""
    hidden: int = 256
    """units of the recurrent layer"""
    lr: float = 3e-4
    """Adam learning rate, > 0"""
    prefetch_depth: int = 4
    """chunks the ChunkPrefetcher prepares ahead"""
    threads: int = 1
    """torch intra-op threads for training (the prefetcher has its own thread)"""

    def __post_init__(self) -> None:
        self.name = self.name or f"world_model_{self.env.split('/')[-1]}_seed{self.seed}"

    def check(self) -> None:
        """Every option against its meaning; a ValueError names the flag."""
        for name, low in {"total_frames": 1, "train_steps": 1, "size": 8, "num_streams": 1,
                          "seq_len": 1, "hidden": 1, "prefetch_depth": 1, "threads": 1}.items():
            options.integer(name, getattr(self, name), low)
        options.integer("seed", self.seed, 0, 2**64 - 1)  # torch.manual_seed's range
        try:
            import ale_py
        except ModuleNotFoundError:  # the Atari games come with the optional extra
            raise ValueError(f"--env {self.env}: the Atari games need ale-py: pip install "
                             "'torchrl-seqchunk[atari]' (in a checkout: pip install -e '.[atari]')") from None
        gym.register_envs(ale_py)
        options.gym_id("env", self.env)
        if not self.env.startswith("ALE/"):
            raise ValueError(f"--env must be an Atari game (ALE/..., e.g. ALE/Breakout-v5): its frames are "
                             f"read as grayscale pixels, got {self.env!r}")
        if self.size % 8:
            raise ValueError(f"--size must be a multiple of 8 (e.g. 64), got {self.size}")
        options.real("lr", self.lr, 0.0, open_low=True)
        options.device("device", self.device)


def check_command(cfg: Config) -> Config:
    """The checks of a command line beyond ``cfg.check()``: the run folder (a finished run is
    kept unless ``--overwrite``). Returns ``cfg``; a ValueError names the flag and the fix."""
    check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def to_frames(raw: list[np.ndarray], size: int) -> torch.Tensor:
    """L frames [H, W] uint8 grayscale -> [L, 1, size, size] uint8 (area interpolation)."""
    x = torch.from_numpy(np.stack(raw))[:, None].float()  # [L, 1, H, W]
    return F.interpolate(x, size=(size, size), mode="area").round().to(torch.uint8)


def collect(cfg: Config, buffer: TensorDictReplayBuffer) -> tuple[int, int]:
    """Play a random policy; write every finished episode into the buffer.

    Returns (number of episodes, number of actions)."""

    env = gym.make(cfg.env, obs_type="grayscale")
    env.action_space.seed(cfg.seed)
    obs, _ = env.reset(seed=cfg.seed)
    frames, actions, rewards, terminated, truncated = [obs], [], [], [], []
    episodes = 0
    for _ in tqdm(range(cfg.total_frames), desc="collect", unit="frames"):
        action = env.action_space.sample()
        obs, reward, term, trunc, _ = env.step(action)
        frames.append(obs)
        actions.append(action)
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
        if term or trunc:
            pixels = to_frames(frames, cfg.size)  # [L + 1, 1, size, size]: o_0 .. o_L
            term_t, trunc_t = torch.tensor(terminated)[:, None], torch.tensor(truncated)[:, None]
            buffer.extend(TensorDict({  # L steps, TorchRL layout
                "observation": pixels[:-1],
                "action": torch.tensor(actions),
                "next": {"observation": pixels[1:],
                         "reward": torch.tensor(rewards, dtype=torch.float32)[:, None],
                         "terminated": term_t, "truncated": trunc_t, "done": term_t | trunc_t},
            }, batch_size=[len(actions)]))
            episodes += 1
            obs, _ = env.reset()
            frames, actions, rewards, terminated, truncated = [obs], [], [], [], []
    env.close()
    return episodes, int(env.action_space.n)


class FrameModel(nn.Module):
    """Predicts frame t+1 and reward t from frames <= t and actions <= t.

    Shapes: frames [B, T, 1, S, S] uint8 (S = 64), actions [B, T] int64,
    features [B, T, H] from the ResetRNN; outputs [B, T, 1, S, S] logits in pixel space
    (sigmoid -> [0, 1]) and [B, T] rewards.
    """

    def __init__(self, num_actions: int, hidden: int, size: int, *, carry: bool):
        super().__init__()
        if size % 8:
            raise ValueError(f"size={size}: frames must be a multiple of 8 pixels wide, e.g. 64.")
        s = size // 8
        self.encoder = nn.Sequential(  # [N, 1, S, S] -> [N, 16, S/4, S/4] -> [N, 32 * S/8 * S/8]
            nn.Conv2d(1, 16, 8, 4, 2), nn.ReLU(), nn.Conv2d(16, 32, 4, 2, 1), nn.ReLU(), nn.Flatten())
        self.action_embed = nn.Embedding(num_actions, 32)
        self.rnn = ResetRNN(nn.GRU(32 * s * s + 32, hidden, batch_first=True),
                            in_key="embed", out_key="features", carry=carry, default_recurrent_mode=True)
        self.decoder = nn.Sequential(  # [N, H] -> [N, 32, S/4, S/4] -> [N, 16, S/4, S/4] -> [N, 1, S, S]
            nn.Linear(hidden, 32 * 4 * s * s), nn.Unflatten(-1, (32, 2 * s, 2 * s)), nn.ReLU(),
            nn.Conv2d(32, 16, 3, 1, 1), nn.PixelShuffle(4))
        self.reward_head = nn.Linear(hidden, 1)

    def forward(self, chunk: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = chunk.batch_size
        pixels = chunk["observation"].flatten(0, 1).float() / 255  # [B*T, 1, S, S]
        embed = torch.cat([self.encoder(pixels).unflatten(0, (B, T)),
                           self.action_embed(chunk["action"])], -1)  # [B, T, E]
        td = TensorDict({"embed": embed, "is_first": chunk["is_first"]}, batch_size=[B, T])
        features = self.rnn(td)["features"]  # [B, T, H]
        frame_logits = self.decoder(features.flatten(0, 1)).unflatten(0, (B, T))
        return frame_logits, self.reward_head(features).squeeze(-1)


def losses_by_position(model: FrameModel, chunk: TensorDict) -> torch.Tensor:
    """Per-position loss [T]: pixel BCE on frame t+1 (mean over pixels) + reward MSE, mean over B."""
    frame_logits, reward = model(chunk)
    target = chunk["next", "observation"].float() / 255
    frame_loss = F.binary_cross_entropy_with_logits(frame_logits, target, reduction="none")
    reward_loss = (reward - chunk["next", "reward"].squeeze(-1).sign()) ** 2
    return (frame_loss.flatten(2).mean(-1) + reward_loss).mean(0)  # [T]


def plot(curves: dict[str, np.ndarray], path: Path, title: str) -> None:
    """Loss by position for each model, and the reset model's excess over the carry model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, diff) = plt.subplots(1, 2, figsize=(10, 3.5))
    for label, curve in curves.items():
        ax.plot(np.arange(len(curve)), curve, label=label)
    ax.set(xlabel="position t inside the chunk", ylabel="prediction loss", title=title)
    ax.legend()
    carry, reset = curves.values()
    # both models train on the same chunks, so the difference cancels the chunks' own noise
    diff.bar(np.arange(len(carry)), reset - carry)
    diff.axhline(0, color="black", lw=0.8)
    diff.set(xlabel="position t inside the chunk", ylabel="loss(reset) - loss(carry)",
             title="what carrying the state saves")
    for a in (ax, diff):
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(cfg: Config) -> Run:
    """Collects random-policy episodes, then trains the carry and the reset model on the same
    stream chunks, writing ``<runs_dir>/<name>/``; returns the Run (metrics rows: step,
    loss_carry, loss_reset_at_chunk_start; files: metrics.csv, loss_by_position.csv, its
    figure). A ValueError names the option and the fix; a run whose random policy ends no
    episode within ``total_frames`` exits with status 2 before training.

    Examples:
        >>> from torchrl_seqchunk.recipes import world_model
        >>> world_model.Config(env="ALE/Pong-v5").name  # the run's folder under runs/
        'world_model_Pong-v5_seed0'
    """
    cfg.check()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out_dir = check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)

    buffer = TensorDictReplayBuffer(
        storage=IndexSelectStorage(cfg.total_frames),  # LazyTensorStorage, gathering pixels with index_select
        sampler=StreamChunkSampler(cfg.num_streams, cfg.seq_len,
                                   generator=torch.Generator().manual_seed(cfg.seed)),
        batch_size=cfg.num_streams * cfg.seq_len,
    )
    episodes, num_actions = collect(cfg, buffer)
    if not episodes:  # the sampler draws whole episodes only
        options.fail(f"no episode of {cfg.env} ended within --total-frames {cfg.total_frames}: raise "
                     "--total-frames (a random policy's episode lasts hundreds to thousands of frames)")
    print(f"stored {len(buffer)} steps in {episodes} episodes")
    t0 = time.perf_counter()
    for _ in range(20):  # the sampler alone, gathering [B, T] chunks of pixels
        buffer.sample()
    sampler_rate = 20 / (time.perf_counter() - t0)

    def build(carry: bool) -> FrameModel:
        torch.manual_seed(cfg.seed)  # both models start from the same weights
        return FrameModel(num_actions, cfg.hidden, cfg.size, carry=carry).to(cfg.device)

    models = {"carry": build(True), "reset at chunk start": build(False)}
    optims = {k: torch.optim.Adam(m.parameters(), lr=cfg.lr) for k, m in models.items()}
    # Position curves average the last quarter of training, when both models have settled.
    tail = max(1, cfg.train_steps // 4)
    curves = {k: torch.zeros(cfg.seq_len) for k in models}

    waited, start = 0.0, time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)  # every option checked, the data collected
    rows = []
    with ChunkPrefetcher(buffer.sample, depth=cfg.prefetch_depth, device=cfg.device) as chunks, \
            open(out_dir / METRICS, "w", newline="") as f:
        writer = csv.writer(f)
        columns = ["step", *[f"loss_{k.replace(' ', '_')}" for k in models]]
        writer.writerow(columns)
        it = iter(chunks)
        for step in tqdm(range(cfg.train_steps), desc="train", unit="steps"):
            t0 = time.perf_counter()
            chunk = next(it)  # [B, T]: observation [B, T, 1, 64, 64] uint8, is_first [B, T, 1]
            waited += time.perf_counter() - t0
            row = [step]
            for label, model in models.items():
                per_t = losses_by_position(model, chunk)  # [T]
                optims[label].zero_grad()
                per_t.mean().backward()
                optims[label].step()
                row.append(per_t.mean().item())
                if step >= cfg.train_steps - tail:
                    curves[label] += per_t.detach().cpu() / tail
            writer.writerow(row)
            rows.append(dict(zip(columns, row)))
    elapsed = time.perf_counter() - start

    curves = {k: v.numpy() for k, v in curves.items()}
    with open(out_dir / "loss_by_position.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t", *[k.replace(" ", "_") for k in curves]])
        writer.writerows([[t, *[float(c[t]) for c in curves.values()]] for t in range(cfg.seq_len)])
    plot(curves, out_dir / "loss_by_position.png", f"{cfg.env}: next-frame loss by position")
    print(f"sampler alone: {sampler_rate:.1f} chunks/s; training (both models): "
          f"{cfg.train_steps / elapsed:.2f} steps/s, "
          f"{cfg.train_steps * cfg.num_streams * cfg.seq_len / elapsed:.0f} frames/s; "
          f"trainer waited {100 * waited / elapsed:.1f}% of the time for chunks")
    for label, curve in curves.items():
        later = f"  t>=8 {curve[8:].mean():.4f}" if cfg.seq_len > 8 else ""  # none with --seq-len 8 or less
        print(f"{label:>22}: loss t=0 {curve[0]:.4f}  t<8 {curve[:8].mean():.4f}{later}")
    return Run(out_dir, rows, tuple(out_dir / n for n in (METRICS, "loss_by_position.csv", "loss_by_position.png")))
