"""The main job and the recurrent DQN on TorchRL's recurrent modules against ResetRNN, side by side.

Each round runs ``seqchunk ppo`` and ``seqchunk dqn`` once with ``--rnn resetrnn`` and once with
``--rnn torchrl`` (TorchRL's ``GRUModule`` inside ``ResetRNN``, the same weights), alternating, at
the recipes' default sizes for ``--frames`` frames; it prints the median over rounds of the
per-round ratio of wall seconds per frame as ``RATIO <name> <value>`` (lower: the TorchRL-module
path is cheaper), checks that both runs of a pair gave the same figures, and writes the times as
CSV.

    python benchmarks/bench_torchrl_modules.py               # 3 rounds of 8,192 frames each
    python benchmarks/bench_torchrl_modules.py --quick       # every code path in seconds
"""
import argparse
import tempfile
import time
from pathlib import Path

import torch

from timing import paired_ratio, write_figures  # benchmarks/timing.py

from torchrl_seqchunk.recipes import dqn, ppo

RECIPES = {"main_job": ppo, "dqn": dqn}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    parser.add_argument("--frames", type=int, default=None, help="frames per run (default 8192; 2560 with --quick; the DQN learns from 2000 on)")
    parser.add_argument("--quick", action="store_true", help="one short round: the code paths, not a figure")
    parser.add_argument("--out", default="runs/bench_torchrl_modules", help="folder of the CSV")
    args = parser.parse_args(argv)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    args.frames = args.frames if args.frames is not None else (2560 if args.quick else 8192)
    if args.rounds < 1 or args.frames < 2560:
        parser.error(f"--rounds must be >= 1 and --frames >= 2560 (the DQN learns from 2000 frames on), got {args.rounds} and {args.frames}")
    return args


def one_run(recipe, rnn: str, frames: int) -> tuple[float, list]:
    """Seconds per frame of one run and its figures (times left out, NaN as None)."""
    with tempfile.TemporaryDirectory() as runs:
        start = time.perf_counter()
        run = recipe.train(recipe.Config(total_frames=frames, runs_dir=runs, progress=False, rnn=rnn))
        seconds = time.perf_counter() - start
    figures = [{k: None if v != v else v for k, v in row.items() if k not in ("wall_s", "learn_s")}
               for row in run.rows]
    return seconds / run.rows[-1]["frames"], figures


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    times = {f"{name}_{rnn}": [] for name in RECIPES for rnn in ("resetrnn", "torchrl")}
    for _ in range(args.rounds):
        for name, recipe in RECIPES.items():
            ours, ours_figures = one_run(recipe, "resetrnn", args.frames)
            theirs, their_figures = one_run(recipe, "torchrl", args.frames)
            if ours_figures != their_figures:
                raise SystemExit(f"{name}: --rnn torchrl gave other figures than --rnn resetrnn")
            times[f"{name}_resetrnn"].append(ours)
            times[f"{name}_torchrl"].append(theirs)
    ratios = {f"torchrl_module_vs_resetrnn_{name}": paired_ratio(times, f"{name}_torchrl", f"{name}_resetrnn")
              for name in RECIPES}
    rows = [{"name": key, "value": f"{1e6 * sorted(v)[len(v) // 2]:.1f}", "unit": "us per frame",
             "note": f"median of {args.rounds} runs of {args.frames} frames"} for key, v in times.items()]
    rows += [{"name": key, "value": f"{value:.3f}", "unit": "ratio", "note": "per-round median"}
             for key, value in ratios.items()]
    write_figures(rows, ratios, Path(args.out) / "torchrl_modules.csv")


if __name__ == "__main__":
    main()
