"""When does reset-and-continue beat masking? Windows long relative to episodes, rewards set by the first step.

The claim behind ``reset_continue``: the masked baseline drops every window slot after the
first episode start inside a window, so (with sliding windows, stride 1) a step ``k`` steps
into its episode trains in ``min(k + 1, W)`` windows instead of ``W``, and the first steps of
every episode, the spawn states the agent meets each episode, are under-trained. That should
matter when episodes are short relative to the window ``W`` and when the first observations
decide the reward.

Task: POPGym's RepeatFirstEasy (Morad et al., "POPGym", ICLR 2023) truncated to
``--episode-len`` steps by gymnasium's ``TimeLimit``: at every step the agent must name the
suit of the episode's first card, so the first observation decides every reward (return
between ``-L/51`` and ``L/51`` for an episode of ``L`` steps). The main job
(``seqchunk ppo``, its defaults otherwise: 8 envs, rollouts of 32 steps) runs
every ``W`` of ``--windows`` (stride 1) x ``--modes`` x ``--seeds``.

Per run, the score is the area under the learning curve: the mean over rollouts of the
mean return of the last 20 episodes, rescaled from ``[-L/51, L/51]`` to ``[0, 1]`` (1.0:
perfect from the start; 0.5: chance; 0: always wrong). Runs with the same seed share their env draws
and initial weights, so modes are compared pair by pair: for each ``W`` the table gives the
mean paired difference of ``reset_continue`` against each other mode, a 95% bootstrap
confidence interval, and the two-sided p-value of an exact sign-flip permutation test over
the seeds.

Beside it, measured on the same rollouts (a random policy on the same env, seed 0): each
step's share of the loss by its position in the episode, from
:func:`~torchrl_seqchunk.slot_weights`, relative to every step counting once (1.0).

Writes under ``--out``: ``boundary.csv`` (one row per rollout of every run),
``boundary_table.md``, ``boundary_weights.csv`` and ``boundary.png`` (learning curves per
``W``, mean and range over seeds, and the shares by position). Prints ``RATIO
auc_reset_continue_vs_<mode>_W<W>`` (mean AUC ratio over seeds).

    python benchmarks/bench_boundary.py                        # the grid of the docs (about an hour here)
    python benchmarks/bench_boundary.py --windows 16 --seeds 0,1 --frames 4096
    python benchmarks/bench_boundary.py --resume                # after an interruption: only the missing runs
"""
from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_learning import (  # benchmarks/bench_learning.py
    WINDOW,
    finished_runs,
    plot_runs,
)
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks
from tqdm import tqdm

from torchrl_seqchunk import make_windows, slot_weights
from torchrl_seqchunk.recipes import ppo  # the main job
from torchrl_seqchunk.recipes.common.envs import make_env

ENV = "popgym:popgym-RepeatFirstEasy-v0"
MODES = ("reset_continue", "mask", "inverse_count")
CARDS = 52  # RepeatFirstEasy: one deck; each step scores +-1/51
KEY = {"window": int, "mode": str, "seed": int}  # a run of the grid


def run(mode: str, window: int, seed: int, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as runs:
        cfg = ppo.Config(env=ENV, keep="all", max_episode_steps=args.episode_len, window=window, stride=1,
                         boundary_mode=mode, seed=seed, total_frames=args.frames, runs_dir=runs, name="cell",
                         progress=False)
        return ppo.train(cfg).rows


def auc(rows: list[dict], best: float) -> float:
    """Mean over rollouts of the mean return, rescaled from ``[-best, best]`` to ``[0, 1]`` (NaN left out)."""
    values = [r["return_mean"] for r in rows if r["return_mean"] == r["return_mean"]]
    return (statistics.mean(values) + best) / (2 * best)


def paired_stats(diffs: list[float], rng: np.random.Generator) -> tuple[float, float, float, float]:
    """Mean paired difference, its 95% bootstrap interval, and the exact sign-flip p-value (two-sided)."""
    d = np.asarray(diffs)
    boot = rng.choice(d, size=(10_000, d.size)).mean(axis=1)
    signs = np.array(list(itertools.product((1, -1), repeat=d.size)))  # every sign flip: 2**n
    p = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))
    return float(d.mean()), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)), p


def loss_shares(window: int, episode_len: int) -> dict[str, list[float]]:
    """Per mode: the mean loss share of a step at each position in its episode, 1.0 = counted once."""
    cfg = ppo.Config(env=ENV, keep="all", max_episode_steps=episode_len, window=window, stride=1, seed=0,
                     progress=False)
    env = make_env(cfg)
    env.set_seed(0)
    rollout = env.rollout(cfg.rollout_len, break_when_any_done=False, auto_cast_to_device=True)  # [E, T]
    env.close()
    is_first = rollout["is_init"].squeeze(-1)  # the env's InitTracker flags
    position = torch.zeros_like(is_first, dtype=torch.long)  # steps since the episode's first step
    for t in range(1, is_first.shape[1]):
        position[:, t] = torch.where(is_first[:, t], 0, position[:, t - 1] + 1)
    rollout["position"] = position
    windows = make_windows(rollout, window, stride=1, memory_key="position")
    shares = {}
    for mode in MODES:
        weights = slot_weights(windows["is_first"], windows["count_weight"], mode) * is_first.numel()
        by_position = torch.zeros(episode_len).index_add_(0, windows["position"].flatten(), weights.flatten())
        steps = torch.bincount(position.flatten(), minlength=episode_len).clamp(min=1)
        shares[mode] = (by_position / steps).tolist()
    return shares


def plot(curves: dict, shares: dict, windows: list[int], modes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(windows), figsize=(3.3 * len(windows), 5.4), squeeze=False)
    for column, window in enumerate(windows):
        ax = axes[0, column]
        for mode in modes:
            plot_runs(ax, curves[(mode, window)], mode, lw=1)
        ax.set_title(f"W = {window}", fontsize=9)
        ax.set_xlabel("env frames", fontsize=8)
        ax = axes[1, column]
        for mode in modes:
            ax.plot(shares[window][mode], marker="o", ms=3, label=mode)
        ax.set_xlabel("step of the episode", fontsize=8)
        for ax in axes[:, column]:
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(f"mean return, last {WINDOW} episodes", fontsize=8)
    axes[1, 0].set_ylabel("loss share (1 = counted once)", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def check(args) -> None:
    """The modes parsed (``mode_names``) and the kept runs (``done``) set on ``args``."""
    args.mode_names = options.names("modes", args.modes, MODES)
    if args.mode_names[0] != "reset_continue":
        raise ValueError(f"--modes: reset_continue first, then any of {MODES[1:]}; got {args.modes!r}")
    args.settings = {"total_frames": ("frames", args.frames), "episode_len": ("episode_len", args.episode_len)}
    args.done = finished_runs(Path(args.out) / "boundary.csv", KEY, args.settings) if args.resume else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Task: POPGym's RepeatFirstEasy "
                                     "(the popgym extra); the default grid, 96 runs, takes about an hour on 2 cores.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--windows", default="4,8,16,32", help="comma-separated window lengths W (<= 32)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}; "
                        "reset_continue first (the others are compared with it)")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7", help="comma-separated seeds")
    parser.add_argument("--episode-len", type=int, default=8, help="steps per episode (TimeLimit)")
    parser.add_argument("--frames", type=int, default=10_240, help="env frames per run")
    parser.add_argument("--out", default="runs/bench_boundary", help="output folder")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out/boundary.csv (made "
                        "with the same --frames and --episode-len; refused otherwise)")
    args = options.parse(parser, ints={"episode_len": (1, CARDS - 1), "frames": 1},
                         int_lists={"windows": (1, 32), "seeds": 0}, check=check)  # the main job's rollouts: 32 steps
    windows, seeds, modes = args.windows, args.seeds, args.mode_names
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    best = args.episode_len / (CARDS - 1)
    shares = {window: loss_shares(window, args.episode_len) for window in windows}
    with open(out / "boundary_weights.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["window", "mode", *[f"step_{k}" for k in range(args.episode_len)]])
        writer.writerows([window, mode, *(f"{v:.3f}" for v in values)]
                         for window in windows for mode, values in shares[window].items())
    curves, scores = {}, {}
    grid = [(window, mode, seed) for window in windows for seed in seeds for mode in modes]
    done, settings = args.done, {column: value for column, (_, value) in args.settings.items()}
    with open(out / "boundary.csv", "a" if done else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*KEY, *settings, "frames", "wall_s", "return_mean"])
        if not done:
            writer.writeheader()
        for window, mode, seed in tqdm(grid, desc="grid"):
            rows = done.get((window, mode, seed))
            if rows is None:
                rows = run(mode, window, seed, args)
                writer.writerows({"window": window, "mode": mode, "seed": seed, **settings, "frames": r["frames"],
                                  "wall_s": r["wall_s"], "return_mean": r["return_mean"]} for r in rows)
                f.flush()
            curves.setdefault((mode, window), []).append(rows)
            scores[(mode, window, seed)] = auc(rows, best)
    rng = np.random.default_rng(0)
    lines = [f"RepeatFirstEasy, episodes of {args.episode_len} steps, {args.frames} frames per run, "
             f"seeds {','.join(map(str, seeds))}; AUC = mean return over the run, 0 = always wrong, 0.5 = chance, "
             "1 = perfect.", "",
             "| W | " + " | ".join(f"AUC {m}" for m in modes) + " | "
             + " | ".join(f"reset_continue - {m}: mean [95% CI], p" for m in modes[1:]) + " |",
             "|---" * (1 + 2 * len(modes) - 1) + "|"]
    for window in windows:
        cells = [f"{statistics.mean(scores[(m, window, s)] for s in seeds):.3f}" for m in modes]
        for mode in modes[1:]:
            diffs = [scores[("reset_continue", window, s)] - scores[(mode, window, s)] for s in seeds]
            mean, low, high, p = paired_stats(diffs, rng)
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}], p={p:.3f}")
            ratio = (statistics.mean(scores[("reset_continue", window, s)] for s in seeds)
                     / statistics.mean(scores[(mode, window, s)] for s in seeds))
            print(f"RATIO auc_reset_continue_vs_{mode}_W{window} {ratio:.3f}")
        lines.append(f"| {window} | " + " | ".join(cells) + " |")
    lines += ["", "Loss share by step of the episode (1 = counted once), one random-policy rollout:", "",
              "| W | mode | " + " | ".join(f"k={k}" for k in range(args.episode_len)) + " |",
              "|---" * (2 + args.episode_len) + "|"]
    lines += [f"| {window} | {mode} | " + " | ".join(f"{v:.2f}" for v in values) + " |"
              for window in windows for mode, values in shares[window].items()]
    (out / "boundary_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(curves, shares, windows, modes, out / "boundary.png")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
