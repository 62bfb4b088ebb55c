"""What matters for recurrent PPO on CartPole without velocities: the main job, one change at a time.

Each row runs ``seqchunk ppo`` with its defaults but for one option (leave one
out), seed after seed, until the mean return of the last 20 episodes first reaches 450 or
``--frames`` frames pass (a miss counts as the cap). Prints a markdown table of frames to
450 (median and range over seeds, and how many seeds got there) and writes ``ablation.csv``
under ``--out``. Runs in parallel over ``--jobs`` processes (one torch thread each).

    python benchmarks/ablation_learning.py                 # seeds 0, 1, 2; 2 processes
"""
from __future__ import annotations

import argparse
import csv
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from bench_learning import TARGET, summary  # benchmarks/bench_learning.py
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks
from tqdm import tqdm

from torchrl_seqchunk.recipes import ppo  # the main job

ROWS = {
    "defaults": {},
    "no ReturnScaledReward": {"reward_norm": False},
    "no observation normalization": {"obs_norm": False},
    "20 epochs instead of 10": {"epochs": 20},
    "GAE lambda 0.95": {"lmbda": 0.95},
    "gamma 0.98, no advantage std floor (the defaults before)": {"gamma": 0.98, "advantage_std_floor": 0.0},
    "LSTM instead of GRU": {"cell": "lstm"},
    "stream chunks (8 x 32, carried state)": {"batching": "streams"},
    "boundary_mode mask": {"boundary_mode": "mask"},
}


def run(row: str, seed: int, frames: int) -> dict:
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as runs:
        cfg = ppo.Config(seed=seed, total_frames=frames, runs_dir=runs, name="ablation", progress=False,
                         stop_at_target=True, **ROWS[row])
        rows = ppo.train(cfg).rows
    return {"row": row, "seed": seed, **summary(rows, frames)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--frames", type=int, default=100_000, help="frame cap per run (default 100000)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--out", default="runs/ablation_learning", help="output folder")
    args = options.parse(parser, ints={"frames": 1, "jobs": 1}, int_lists={"seeds": 0})
    seeds = args.seeds
    tasks = [(row, seed) for row in ROWS for seed in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, row, seed, args.frames) for row, seed in tasks]
        results = [f.result() for f in tqdm(futures, desc="runs")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ablation.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    print(f"| change from the defaults | frames to {TARGET:g}, median (range) | seeds reaching it |")
    print("| --- | --- | --- |")
    for row in ROWS:
        got = [r for r in results if r["row"] == row]
        frames = [r["frames_to_450"] for r in got]
        print(f"| {row} | {statistics.median(frames):,.0f} ({min(frames):,} to {max(frames):,}) | "
              f"{sum(r['reached'] for r in got)} of {len(got)} |")


if __name__ == "__main__":
    main()
