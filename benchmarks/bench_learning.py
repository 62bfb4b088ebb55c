"""Recurrent PPO side by side with sb3-contrib's RecurrentPPO on CartPole without velocities.

Both learn CartPole-v1 with only cart position and pole angle observed (the default
TimeLimit of 500; the same gymnasium env factory, ``MaskObservation(gym.make(...), (0, 2))``,
for both), one torch thread each, seed after seed, ours then theirs, so that machine load
hits both alike. The common metric: env frames (summed over envs) until the mean
undiscounted return of the last 20 finished training episodes first reaches 450, and the
wall seconds until then (a run that never gets there counts as the frame cap and its whole
wall time).

- ours: ``seqchunk ppo`` with its defaults but for ``--options`` (``--frames`` frames);
- sb3-contrib 2.9.2 ``RecurrentPPO`` with the rl-zoo ``ppo_lstm`` hyperparameters for
  CartPoleNoVel-v1, unchanged: VecNormalize (gamma 0.98), 8 envs x 32 steps, batch 256,
  20 epochs, gamma 0.98, GAE lambda 0.8, no entropy bonus, learning rate and clip range
  linear from 1e-3 and 0.2 to 0 over the run (1e5 timesteps in the zoo, the default
  ``--frames``), ``MlpLstmPolicy`` with an LSTM of 64 for the actor and one for the critic,
  ReLU heads of 64, no orthogonal init.

- defaults (``--sides ours,defaults``): the main job with its defaults, beside ours with
  ``--options`` (a recipe under test, e.g. ``gamma=0.98,advantage_std_floor=0``), for the same frames.

Prints a per-seed table, ``RATIO frames_to_450_vs_<side> <median ours / median side>`` and
``RATIO wall_to_450_vs_<side>`` for every other side, and each side's final mean return
and how many runs ended at or above 450; writes ``learning.csv`` (one row per rollout of
each run) and ``learning_curves.png`` (mean and range over seeds) under ``--out``. sb3
needs the ``bench`` extra (``pip install -e ".[bench]"``).

    python benchmarks/bench_learning.py                    # seeds 0, 1, 2; ours and sb3
    python benchmarks/bench_learning.py --seeds 11,12,13,14,15 --sides ours,defaults \
        --options gamma=0.98,advantage_std_floor=0 --stop-at-target defaults
"""
from __future__ import annotations

import argparse
import csv
import functools
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import gymnasium as gym
import torch
from toolkit import checked_config, config_options, options  # benchmarks/toolkit.py: the recipes' option checks
from tqdm import tqdm

from torchrl_seqchunk import MaskObservation
from torchrl_seqchunk.recipes import ppo  # the main job
from torchrl_seqchunk.recipes.common.envs import check_keep

TARGET, WINDOW, KEEP = 450.0, 20, (0, 2)
# not --options: set here, or the task and its metric, which the sb3 side and the summary fix (masked
# CartPole, its 500-step limit, 450 over the last WINDOW episodes)
SET_HERE = ("seed", "total_frames", "runs_dir", "name", "progress", "stop_at_target",
            "env", "keep", "max_episode_steps", "return_window", "target_return")


def masked_cartpole() -> gym.Env:
    """The env both sides learn: CartPole-v1 observing cart position and pole angle."""
    return MaskObservation(gym.make("CartPole-v1"), KEEP)


def run_ours(seed: int, frames: int, **options) -> list[dict]:
    """The main job with its defaults but for ``options`` (Config fields); one row per rollout."""
    with tempfile.TemporaryDirectory() as runs:
        cfg = ppo.Config(seed=seed, total_frames=frames, runs_dir=runs, name="bench", progress=False, **options)
        rows = ppo.train(cfg).rows  # its env: make_masked_env("CartPole-v1", (0, 2)), masked_cartpole in TorchRL
    return [{"frames": r["frames"], "wall_s": r["wall_s"], "return_mean": r["return_mean"]} for r in rows]


def train_sb3(model, frames: int) -> list[dict]:
    """Train an sb3 model for `frames` frames; one row per rollout: frames, wall_s, return_mean
    (of the last WINDOW finished episodes, undiscounted, as the Monitor wrapper saw them)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Log(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns, self.rows, self.start = deque(maxlen=WINDOW), [], time.perf_counter()

        def _on_step(self) -> bool:
            self.returns.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

        def _on_rollout_end(self) -> None:
            mean = sum(self.returns) / len(self.returns) if self.returns else float("nan")
            self.rows.append({"frames": self.num_timesteps, "return_mean": mean,
                              "wall_s": round(time.perf_counter() - self.start, 2)})

    log = Log()
    model.learn(frames, callback=log)
    return log.rows


def run_sb3(seed: int, frames: int) -> list[dict]:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    venv = VecNormalize(make_vec_env(masked_cartpole, n_envs=8, seed=seed), gamma=0.98)
    model = RecurrentPPO(
        "MlpLstmPolicy", venv, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
        n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed,
        policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                           enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])),
    )
    return train_sb3(model, frames)  # the linear schedules run over `frames` (the zoo's 1e5)


def finished_runs(path: Path, key: dict[str, type], settings: dict[str, tuple[str, object]]) -> dict[tuple, list[dict]]:
    """The runs an earlier call wrote to the CSV ``path`` (a run's rows are written once it
    ends), by the tuple of its ``key`` columns converted with their types; each row keeps
    frames, wall_s and return_mean. Empty if ``path`` does not exist.

    ``settings`` maps a column to ``(option, value)``: the options that change a run's numbers
    (its frames, its envs, ...). A ValueError names the option when a kept run was made with
    another value, or when the CSV does not record it."""
    runs = {}
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [option for column, (option, _) in settings.items() if column not in (reader.fieldnames or ())]
            if missing:
                raise ValueError(f"--resume: {path} does not record the {', '.join(map(options.flag, missing))} of "
                                 "its runs (written by an older version): run without --resume, or give another --out")
            for r in reader:
                for column, (option, value) in settings.items():
                    if type(value)(r[column]) != value:
                        raise ValueError(f"--resume: {path} holds runs made with {options.flag(option)} {r[column]}, "
                                         f"not {value}: give {options.flag(option)} {r[column]} to complete them, "
                                         "or another --out")
                runs.setdefault(tuple(kind(r[name]) for name, kind in key.items()), []).append(
                    {"frames": int(r["frames"]), "wall_s": float(r["wall_s"]), "return_mean": float(r["return_mean"])})
    return runs


def summary(rows: list[dict], cap: int) -> dict:
    """Frames and wall seconds to the target (the cap and the whole run if never), final return."""
    reached = [r for r in rows if r["return_mean"] >= TARGET]
    first = reached[0] if reached else None
    return {"frames_to_450": first["frames"] if first else cap,
            "wall_to_450": first["wall_s"] if first else rows[-1]["wall_s"],
            "reached": first is not None, "final_return": rows[-1]["return_mean"]}


def plot_runs(ax, runs: list[list[dict]], label: str, *, ragged: bool = False, **line_kwargs) -> None:
    """The mean over runs of ``return_mean`` by frame, with the range shaded (NaN left out);
    up to the shortest run, or with ``ragged`` up to the longest, over the runs still going
    (``runs`` logged at the same frames while they went on)."""
    length = (max if ragged else min)(len(r) for r in runs)
    runs = sorted(runs, key=len, reverse=True)  # runs[0] holds every frame drawn
    frames = [r["frames"] for r in runs[0][:length]]
    values = [[run[i]["return_mean"] for run in runs if i < len(run)] for i in range(length)]
    values = [[v for v in vs if v == v] or [float("nan")] for vs in values]  # v == v: not NaN
    line, = ax.plot(frames, [statistics.mean(v) for v in values], label=label, **line_kwargs)
    ax.fill_between(frames, [min(v) for v in values], [max(v) for v in values], alpha=0.2,
                    color=line.get_color())


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for side, runs in curves.items():
        plot_runs(ax, runs, f"{side} (mean of {len(runs)} seeds)")
    ax.axhline(TARGET, color="gray", ls="--", lw=1, label=f"target {TARGET:g}")
    ax.set(xlabel="env frames", ylabel=f"mean return, last {WINDOW} episodes",
           title="CartPole-v1 without velocities")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


SIDES = ("ours", "defaults", "sb3")


def check_sides(args) -> None:
    """``--sides`` (ours first: the ratios are ours over each other side), ``--stop-at-target``, ``--options``."""
    args.sides = options.names("sides", args.sides, SIDES)
    if args.sides[0] != "ours" or len(args.sides) < 2:
        raise ValueError(f"--sides {','.join(args.sides)}: give ours first and at least one side to compare "
                         "it with, e.g. --sides ours,defaults")
    args.options = config_options(ppo.Config, args.options, SET_HERE)
    checked_config(ppo.Config, args.options, check_keep, total_frames=args.frames)
    args.stop_at_target = options.names("stop_at_target", args.stop_at_target, args.sides) if args.stop_at_target else []
    if "sb3" in args.stop_at_target:
        raise ValueError("--stop-at-target: sb3's runs go to --frames; name sides of the main job only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--frames", type=int, default=100_000,
                        help="frames per run, also the cap counted for a miss (default 100000)")
    parser.add_argument("--sides", default="ours,sb3",
                        help=f"comma-separated, ours first, from {SIDES} (default ours,sb3)")
    parser.add_argument("--options", default="",
                        help="ours: the main job's Config fields that differ from its defaults, e.g. "
                             "gamma=0.98,advantage_std_floor=0 (default none)")
    parser.add_argument("--stop-at-target", default="",
                        help="comma-separated sides of the main job (ours, defaults) whose runs end at the target: "
                             "the same frames to 450 (the schedules keep --frames), no final return (default none)")
    parser.add_argument("--out", default="runs/bench_learning", help="output folder (default runs/bench_learning)")
    args = options.parse(parser, ints={"frames": 1}, int_lists={"seeds": 0}, check=check_sides)
    torch.set_num_threads(1)
    seeds = args.seeds
    runners = {"ours": functools.partial(run_ours, **args.options), "defaults": run_ours, "sb3": run_sb3}
    runners = {side: runners[side] for side in args.sides}
    curves, results = {side: [] for side in runners}, {side: [] for side in runners}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "learning.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["side", "seed", "frames", "wall_s", "return_mean"])
        writer.writeheader()
        for seed in tqdm(seeds, desc="seeds"):
            for side, run in runners.items():
                rows = run(seed, args.frames, **({"stop_at_target": True} if side in args.stop_at_target else {}))
                writer.writerows({"side": side, "seed": seed, **r} for r in rows)
                curves[side].append(rows)
                results[side].append(summary(rows, args.frames))
    print(f"{'seed':>4} {'side':>8} {'frames_to_450':>14} {'wall_to_450_s':>14} {'final_return':>13}")
    for i, seed in enumerate(seeds):
        for side in runners:
            r = results[side][i]
            mark = "" if r["reached"] else " (never)"
            final = "stopped" if side in args.stop_at_target else f"{r['final_return']:.1f}"
            print(f"{seed:>4} {side:>8} {r['frames_to_450']:>14}{mark} {r['wall_to_450']:>14.1f} {final:>13}")
    median = {side: {k: statistics.median(r[k] for r in results[side]) for k in ("frames_to_450", "wall_to_450")}
              for side in runners}
    for side in args.sides[1:]:
        for k in ("frames_to_450", "wall_to_450"):
            print(f"RATIO {k}_vs_{side} {median['ours'][k] / median[side][k]:.3f}")
    for side in (s for s in runners if s not in args.stop_at_target):
        finals = [round(r["final_return"], 1) for r in results[side]]
        print(f"final_return {side} {finals} reached {sum(r['reached'] for r in results[side])}/{len(seeds)} "
              f"ended >= {TARGET:g} {sum(f >= TARGET for f in finals)}/{len(seeds)}")
    plot(curves, out / "learning_curves.png")
    print(f"wrote {out / 'learning.csv'} and {out / 'learning_curves.png'}")


if __name__ == "__main__":
    main()
