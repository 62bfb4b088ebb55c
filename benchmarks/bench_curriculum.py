"""What the reverse curriculum buys: sparse-reward tasks from one demo, beside PPO from the env's reset.

Per seed, at equal training frames, in one run:

- ``curriculum``: the main job's recurrent PPO (``seqchunk curriculum``) with a
  ``ReverseCurriculum`` from the task's shipped demo (``torchrl_seqchunk/recipes/data/``);
- ``scratch``: the same PPO, the same seed, from the env's own reset (both arms with
  ``--options``, the example's settings under test, e.g. ``entropy_coeff=0.05``);
- ``sb3`` (MountainCar-v0 only, the ``bench`` extra): stable-baselines3's PPO with the rl-zoo
  ``MountainCar-v0`` settings (16 envs, n_steps 16, 4 epochs, gamma 0.99, GAE lambda 0.98,
  no entropy bonus, observations and rewards normalized; the zoo trains 1M frames).

Every run is evaluated the same way every ``--eval-every`` rollouts of 512 frames: greedy
episodes (``--eval-sample``: actions drawn from the policy) from the env's own reset
(starting point 0, no curriculum). Reported per run:
frames until the evaluation meets the task's target (MountainCar: mean return >= -110;
MiniGrid: goal rate >= 0.9; a run that never does counts as the budget; ``--stop-at-target``
ends each run once it meets it with the maximum at 0, sb3's too) and, with the curriculum, frames
until the maximum starting point first reaches 0. Runs are paired by seed
(the ratio per seed, its median; bench_boundary's paired statistics on the differences).

Writes under ``--out``: ``curriculum.csv`` (one row per evaluation of every run),
``curriculum_table.md`` and ``curriculum.png`` (maximum starting point and evaluation
against frames, mean and range over seeds). Prints ``RATIO frames_to_target_<arm>_vs_scratch_<env>``
(median over seeds of the per-seed ratio; below 1: the arm is faster).

    python benchmarks/bench_curriculum.py --envs MountainCar-v0 --seeds 0,1,2 --frames 100000
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from bench_boundary import paired_stats  # benchmarks/bench_boundary.py
from bench_learning import plot_runs  # benchmarks/bench_learning.py
from toolkit import checked_config, config_options, options  # benchmarks/toolkit.py
from tqdm import tqdm

from torchrl_seqchunk.recipes import cli
from torchrl_seqchunk.recipes import curriculum as recipe  # seqchunk curriculum

TARGETS = {"MountainCar-v0": ("eval_return", -110.0), "MiniGrid-DoorKey-5x5-v0": ("eval_success", 0.9),
           "MiniGrid-DoorKey-8x8-v0": ("eval_success", 0.9)}
FIELDS = ["env", "arm", "seed", "frames", "wall_s", "max_starting_point", "eval_return", "eval_success"]
# not --options: the recipe's fields the benchmark sets itself (the arm, the run, its evaluation)
SET_HERE = ("env", "seed", "total_frames", "eval_every", "eval_episodes", "runs_dir", "name", "overwrite",
            "progress", "curriculum", "eval_sample", "stop_at_target",
            "num_envs", "rollout_len")  # rollouts of 512 frames: the evaluations' interval, sb3's as ours


def run_ours(env: str, curriculum: bool, seed: int, args) -> list[dict]:
    """One run of ``seqchunk curriculum`` (``--no-curriculum``: PPO from the env's reset); its evaluated rows."""
    cfg = cli.parse(["curriculum", "--env", env, "--seed", str(seed), "--total-frames", str(args.frames),
                     "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
                     "--runs-dir", str(Path(args.out) / "runs"), "--overwrite", "--no-progress",
                     "--curriculum" if curriculum else "--no-curriculum",
                     "--eval-sample" if args.eval_sample else "--no-eval-sample",
                     "--stop-at-target" if args.stop_at_target else "--no-stop-at-target"])
    # its metrics.csv, row by row, under --out/runs
    rows = recipe.train(dataclasses.replace(cfg, **args.options)).rows
    return [r for r in rows if r["eval_return"] == r["eval_return"]]  # the evaluated rollouts


def run_sb3(seed: int, args) -> list[dict]:
    """sb3 PPO with the rl-zoo MountainCar-v0 settings, evaluated like ours every eval_every * 512 frames."""
    import time

    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env("MountainCar-v0", n_envs=16, seed=seed), gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=16, gae_lambda=0.98, gamma=0.99, n_epochs=4, ent_coef=0.0,
                seed=seed, device="cpu", verbose=0)
    rows, every, start = [], args.eval_every * 512, time.perf_counter()

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:  # False ends the run
            if self.num_timesteps // every > len(rows):
                rows.append(evaluate_sb3(model, env, seed, len(rows), args.eval_episodes,
                                         self.num_timesteps, time.perf_counter() - start, args.eval_sample))
                return not (args.stop_at_target and rows[-1]["eval_return"] >= TARGETS["MountainCar-v0"][1])
            return True

    model.learn(args.frames, callback=Evaluate())
    return rows


def evaluate_sb3(model, env, seed: int, index: int, episodes: int, frames: int, wall_s: float,
                 sample: bool = False) -> dict:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    evaluation = VecNormalize(make_vec_env("MountainCar-v0", n_envs=episodes, seed=10_000 + 1_000 * seed + index),
                              training=False, norm_reward=False)
    evaluation.obs_rms = env.obs_rms
    obs, returns, ended = evaluation.reset(), np.zeros(episodes), np.zeros(episodes, dtype=bool)
    goals = np.zeros(episodes, dtype=bool)
    while not ended.all():
        obs, reward, done, infos = evaluation.step(model.predict(obs, deterministic=not sample)[0])
        returns += reward * ~ended
        goals |= done & ~ended & ~np.array([i.get("TimeLimit.truncated", False) for i in infos])
        ended |= done
    return {"frames": frames, "wall_s": round(wall_s, 2), "max_starting_point": 0,
            "eval_return": float(returns.mean()), "eval_success": float(goals.mean())}


def run(cell: tuple[str, str, int], args) -> list[dict]:
    env, arm, seed = cell
    return run_sb3(seed, args) if arm == "sb3" else run_ours(env, arm == "curriculum", seed, args)


def first(rows: list[dict], test, budget: int) -> tuple[int, bool]:
    """Frames of the first row passing ``test``, or the budget; and whether one did."""
    hit = next((r["frames"] for r in rows if test(r)), None)
    return (budget, False) if hit is None else (hit, True)


def plot(curves: dict, envs: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(envs), figsize=(5 * len(envs), 6), squeeze=False)
    for column, env in enumerate(envs):
        key, target = TARGETS[env]
        for row, (value, label) in enumerate((("max_starting_point", "maximum starting point"),
                                              (key, "evaluation " + key.split("_")[1] + " from the env's reset"))):
            ax = axes[row, column]
            for arm, runs in curves[env].items():
                if row == 0 and arm == "sb3":
                    continue
                plot_runs(ax, [[{"frames": r["frames"], "return_mean": r[value]} for r in run] for run in runs], arm,
                          ragged=True)  # runs stopped at their target end early
            if row == 1:
                ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
            ax.set(xlabel="training frames", ylabel=label, title=env if row == 0 else None)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs", default="MountainCar-v0", help=f"comma-separated, from {list(TARGETS)}")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--frames", type=int, default=100_000, help="training frames per run (>= 512)")
    parser.add_argument("--eval-every", type=int, default=4, help="rollouts of 512 frames between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=8, help="episodes per evaluation")
    parser.add_argument("--eval-sample", action="store_true",
                        help="evaluate every arm with actions drawn from its policy, not greedy ones (the "
                             "example's --eval-sample: a greedy MiniGrid policy can loop)")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="end each run (sb3's too) at its first evaluation that meets the target with the "
                             "maximum starting point at 0 (its frames to the target are the same; its curves end there)")
    parser.add_argument("--sb3", action=argparse.BooleanOptionalAction, default=True,
                        help="also run sb3's rl-zoo PPO on MountainCar-v0 (the bench extra)")
    parser.add_argument("--options", default="",
                        help="both arms of ours: the recipe's Config fields that differ from its defaults, "
                             "e.g. entropy_coeff=0.05 (default none)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--out", default="runs/bench_curriculum", help="output folder")

    def check(args):
        args.envs = options.names("envs", args.envs, list(TARGETS))
        config = recipe.Config
        args.options = config_options(config, args.options, SET_HERE)
        for env in args.envs:
            checked_config(config, args.options, env=env)

    args = options.parse(parser, argv, ints={"frames": 512, "eval_every": 1, "eval_episodes": 1, "jobs": 1},
                         int_lists={"seeds": 0}, check=check)
    if args.sb3 and "MountainCar-v0" in args.envs and importlib.util.find_spec("stable_baselines3") is None:
        print("stable-baselines3 is missing (pip install -e '.[bench]'): the sb3 arm is skipped")
        args.sb3 = False
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = [(env, arm, seed) for env in args.envs for seed in args.seeds
            for arm in ("curriculum", "scratch", "sb3") if arm != "sb3" or (args.sb3 and env == "MountainCar-v0")]
    curves: dict = {env: {} for env in args.envs}
    with open(out / "curriculum.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for (env, arm, seed), rows in tqdm(zip(grid, pool.map(run, grid, [args] * len(grid))),
                                               total=len(grid), desc="runs"):
                writer.writerows({"env": env, "arm": arm, "seed": seed, **r} for r in rows)
                f.flush()
                curves[env].setdefault(arm, []).append(rows)
    lines = [f"{args.frames} training frames per run, seeds {args.seeds}; frames to the target from the env's "
             f"own reset ({'sampled' if args.eval_sample else 'greedy'} evaluation of {args.eval_episodes} episodes "
             f"every {args.eval_every * 512} frames; never: the budget, marked *); frames until the maximum starting "
             "point first reaches 0." + (f" Ours with {args.options}." if args.options else ""), "",
             "| env | arm | frames to target per seed | median | reached | frames to start 0 per seed |",
             "|---|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for env in args.envs:
        key, target = TARGETS[env]
        frames = {}
        for arm, runs in curves[env].items():
            hits = [first(rows, lambda r: r[key] >= target, args.frames) for rows in runs]
            frames[arm] = [h for h, _ in hits]
            zeros = ([first(rows, lambda r: r["max_starting_point"] == 0, args.frames) for rows in runs]
                     if arm == "curriculum" else [])
            cells = ", ".join(f"{h}{'' if ok else '*'}" for h, ok in hits)
            to_zero = ", ".join(f"{h}{'' if ok else '*'}" for h, ok in zeros) or "-"
            lines.append(f"| {env} | {arm} | {cells} | {statistics.median(frames[arm]):.0f} | "
                         f"{sum(ok for _, ok in hits)}/{len(hits)} | {to_zero} |")
        for arm in [a for a in frames if a != "scratch"]:
            ratios = [a / b for a, b in zip(frames[arm], frames["scratch"])]
            mean, low, high, p = paired_stats([a - b for a, b in zip(frames[arm], frames["scratch"])], rng)
            lines.append(f"| {env} | {arm} - scratch | paired difference {mean:+.0f} frames [95% CI {low:+.0f}, "
                         f"{high:+.0f}], sign-flip p={p:.3f} | ratio {statistics.median(ratios):.3f} | | |")
            print(f"RATIO frames_to_target_{arm}_vs_scratch_{env} {statistics.median(ratios):.3f}")
        if "sb3" in frames:
            ratios = [a / b for a, b in zip(frames["curriculum"], frames["sb3"])]
            print(f"RATIO frames_to_target_curriculum_vs_sb3_{env} {statistics.median(ratios):.3f}")
    (out / "curriculum_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(curves, args.envs, out / "curriculum.png")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
