"""POPGym memory tasks: the main job's batching and boundary modes, side by side with sb3-contrib.

A grid of POPGym envs (Morad et al., "POPGym: Benchmarking Partially Observable
Reinforcement Learning", ICLR 2023) x modes x seeds, ``--frames`` env frames per cell:

- ours: ``seqchunk ppo`` with its defaults but for the env and the mode:
  ``reset_continue``, ``mask`` and ``inverse_count`` (windows, ``RecurrentPPOLoss``) and
  ``streams`` (stream chunks with a carried state);
- ``sb3``: sb3-contrib ``RecurrentPPO("MlpLstmPolicy")`` with its default hyperparameters
  and 8 envs, for the same frames (needs the ``bench`` extra; ``--no-sb3`` leaves it out).

Both see the same observations: every space encoded into one flat float vector by
``EncodeObservation`` (one-hots for the discrete parts). For every cell it reports the
MMER, POPGym's metric: the maximum over the run of the mean episodic return (here the mean
of the last 20 finished episodes), and the frames until that mean first reaches
``--threshold``. Both are read at the frames where every run of the env reports (every
1,024 frames with sb3-contrib's 8 x 128-step rollouts beside our 8 x 32), so that a side
logging more often does not get more chances at a high maximum. Writes under ``--out``: ``memory.csv`` (one row per rollout
of every run), ``memory_table.md`` (median MMER over seeds, and the range) and
``memory_curves.png`` (one panel per env: mean and range over seeds of each mode).

    python benchmarks/bench_memory.py                               # the default suite
    python benchmarks/bench_memory.py --envs RepeatFirstEasy --modes reset_continue,mask --seeds 0,1,2,3,4
    python benchmarks/bench_memory.py --jobs 2 --resume   # two cells at once; only the missing ones
"""
from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import gymnasium as gym
import torch
from bench_learning import (  # benchmarks/bench_learning.py
    WINDOW,
    finished_runs,
    plot_runs,
    train_sb3,
)
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks
from tqdm import tqdm

from torchrl_seqchunk import EncodeObservation

SUITE = ("RepeatFirstEasy", "CountRecallEasy", "AutoencodeEasy", "ConcentrationEasy", "HigherLowerEasy",
         "MineSweeperEasy", "BattleshipEasy", "MultiarmedBanditEasy", "VelocityOnlyCartpoleEasy",
         "PositionOnlyPendulumEasy")
MODES = ("reset_continue", "mask", "inverse_count", "streams", "sb3")


def env_id(name: str) -> str:
    return f"popgym:popgym-{name}-v0"  # importing popgym registers "popgym-<Name>-v0"


def run_ours(name: str, mode: str, seed: int, frames: int, num_envs: int) -> list[dict]:
    from torchrl_seqchunk.recipes import ppo as job  # the main job

    batching = {"batching": "streams"} if mode == "streams" else {"boundary_mode": mode}
    with tempfile.TemporaryDirectory() as runs:
        cfg = job.Config(env=env_id(name), keep="all", seed=seed, total_frames=frames, num_envs=num_envs,
                         runs_dir=runs, name="cell", progress=False, **batching)
        return job.train(cfg).rows


def run_sb3(name: str, seed: int, frames: int, num_envs: int) -> list[dict]:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: EncodeObservation(gym.make(env_id(name))), n_envs=num_envs, seed=seed)
    return train_sb3(RecurrentPPO("MlpLstmPolicy", venv, seed=seed), frames)


def run_cell(name: str, mode: str, seed: int, frames: int, num_envs: int) -> list[dict]:
    torch.set_num_threads(1)
    rows = run_sb3(name, seed, frames, num_envs) if mode == "sb3" else run_ours(name, mode, seed, frames, num_envs)
    return [{"frames": r["frames"], "wall_s": r["wall_s"], "return_mean": r["return_mean"]} for r in rows]


def cell_summary(rows: list[dict], threshold: float, cap: int, frames: set[int]) -> dict:
    """MMER and frames to ``threshold`` (``cap`` if never), read at the rollouts ending at ``frames``."""
    rows = [r for r in rows if r["frames"] in frames]
    means = [r["return_mean"] for r in rows if not math.isnan(r["return_mean"])]
    reached = [r["frames"] for r in rows if r["return_mean"] >= threshold]
    return {"mmer": max(means, default=float("nan")), "frames_to_threshold": reached[0] if reached else cap}


def plot(curves: dict, envs: list[str], modes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(envs), 5)
    fig, axes = plt.subplots(-(-len(envs) // cols), cols, figsize=(3.2 * cols, 2.6 * -(-len(envs) // cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, envs):
        for mode in modes:
            runs = curves.get((name, mode))
            if not runs:
                continue
            plot_runs(ax, runs, mode, lw=1)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(envs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("env frames")
    fig.supylabel(f"mean return, last {WINDOW} episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


KEY = {"env": str, "mode": str, "seed": int}  # a cell of the grid


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs", default=",".join(SUITE), help="comma-separated POPGym env names")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--frames", type=int, default=100_000, help="env frames per run")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per run, both sides")
    parser.add_argument("--threshold", type=float, default=0.0,
                        help="mean return whose first frame is reported (POPGym returns lie in [-1, 1])")
    parser.add_argument("--no-sb3", action="store_true", help="leave sb3-contrib out (no bench extra needed)")
    parser.add_argument("--out", default="runs/bench_memory", help="output folder")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once, one process each (one core each)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out/memory.csv (made "
                        "with the same --frames and --num-envs; refused otherwise)")
    return options.parse(parser, argv, ints={"frames": 1, "num_envs": 1, "jobs": 1}, int_lists={"seeds": 0},
                         reals={"threshold": (None, None)}, check=check)


def check(args) -> None:
    """The lists parsed (``env_names``, ``mode_names``) and the kept runs (``done``) set on ``args``."""
    args.env_names = args.envs.split(",")
    for name in args.env_names:
        options.gym_id("envs", env_id(name))
    args.mode_names = [m for m in options.names("modes", args.modes, MODES) if not (args.no_sb3 and m == "sb3")]
    if not args.mode_names:
        raise ValueError("--modes: nothing left to run once --no-sb3 removed sb3")
    args.settings = {"total_frames": ("frames", args.frames), "num_envs": ("num_envs", args.num_envs)}
    args.done = finished_runs(Path(args.out) / "memory.csv", KEY, args.settings) if args.resume else {}


def main(argv=None) -> None:
    args = parse_args(argv)
    envs, modes, seeds, done = args.env_names, args.mode_names, args.seeds, args.done
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = [(name, mode, seed) for name in envs for mode in modes for seed in seeds]
    todo = [cell for cell in grid if cell not in done]
    settings = {column: value for column, (_, value) in args.settings.items()}
    with open(out / "memory.csv", "a" if done else "w", newline="") as f, \
            ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        writer = csv.DictWriter(f, fieldnames=[*KEY, *settings, "frames", "wall_s", "return_mean"])
        if not done:
            writer.writeheader()
        running = {pool.submit(run_cell, *cell, args.frames, args.num_envs): cell for cell in todo}
        for future in tqdm(as_completed(running), total=len(todo), desc="grid"):
            cell = running[future]
            done[cell] = future.result()
            writer.writerows(dict(zip(KEY, cell), **settings, **r) for r in done[cell])
            f.flush()
    curves, cells = {}, {}
    for name in envs:  # the frames at which every run of the env reports
        common = set.intersection(*({r["frames"] for r in done[(name, mode, seed)]} for mode in modes for seed in seeds))
        for mode in modes:
            for seed in seeds:
                rows = done[(name, mode, seed)]
                curves.setdefault((name, mode), []).append(rows)
                cells.setdefault((name, mode), []).append(cell_summary(rows, args.threshold, args.frames, common))
    ours = [m for m in modes if m != "sb3"]
    versus = "sb3" in modes and bool(ours)  # the goal: the best of our modes vs sb3-contrib
    lines = [f"MMER (median over seeds {','.join(map(str, seeds))}, range) and frames to a mean return of "
             f"{args.threshold:g} (median), {args.frames:,} frames per run", "",
             "| env | " + " | ".join(modes) + (" | best of ours - sb3 (median MMER) |" if versus else " |"),
             "| --- |" + " --- |" * (len(modes) + versus)]
    for name in envs:
        entries, median = [], {}
        for mode in modes:
            got = cells[(name, mode)]
            mmer = [c["mmer"] for c in got]
            median[mode] = statistics.median(mmer)
            frames = statistics.median(c["frames_to_threshold"] for c in got)
            entries.append(f"{median[mode]:.3f} ({min(mmer):.3f} to {max(mmer):.3f}), {frames:,.0f}")
        if versus:
            best = max(ours, key=median.get)
            gap = median[best] - median["sb3"]
            entries.append(f"{best}: {gap:+.3f}")
            print(f"RATIO mmer_best_ours_minus_sb3_{name} {gap:+.3f}")
        lines.append(f"| {name} | " + " | ".join(entries) + " |")
    table = "\n".join(lines)
    (out / "memory_table.md").write_text(table + "\n")
    print(table)
    plot(curves, envs, modes, out / "memory_curves.png")
    print(f"wrote {out / 'memory.csv'}, {out / 'memory_table.md'} and {out / 'memory_curves.png'}")


if __name__ == "__main__":
    main()
