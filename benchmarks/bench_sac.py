"""Recurrent SAC recipes side by side on Pendulum-P (cos, sin observed) and Pendulum-V (velocity only).

Every run is ``seqchunk sac`` with its defaults (or the same ``--options``) and only
``--net`` / ``--replay`` changed, so the recipes see equal env frames and gradient steps, each of
``B * T`` learned steps:

- ``streams``: ``StreamChunkSampler(B, T)``, actor, critic and target critic each carrying its state;
- ``sequence``: TorchRL's ``Sequence(T, "include_reset", burn_in=T/2)`` from the stored states (R2D2);
- ``slice``: TorchRL's ``SliceSampler(slice_len=T)`` from the stored states;
- ``ff``: TorchRL's ``SACLoss``, MLPs on the partial observation, uniform transitions;
- ``framestack``: the same on TorchRL's ``CatFrames`` of the last 4 observations.

Per run: a deterministic evaluation every ``--eval-every`` frames (``--eval-episodes`` episodes side by
side); the final return is the mean of the last 20% of the evaluation points (pomdp-baselines'
rule); gradient steps per second of learning time. Beside them, sb3-contrib's ``RecurrentPPO``
(rl-zoo's tuned ``ppo_lstm`` entry for PendulumNoVel-v1, its ``VecNormalize`` included), evaluated the same way, where installed (the
``bench`` extra); else the published figures are printed as references.

Before the grid (unless ``--no-speed``; alone with ``--speed-only``) it times gradient steps per second
of ``streams`` against ``sequence`` at burn-in 0 and ``T/2``, and ``slice``, at equal ``B, T`` on one
buffer of random-policy steps, in interleaved rounds (median over rounds).

Writes under ``--out``: ``sac.csv`` (one row per evaluation of every run), ``sac_summary.csv`` (one row
per run), ``sac.png`` (mean and range over seeds, a panel per task); prints the table and ``RATIO`` lines:
``cost_<recipe>_vs_streams_<task>`` (cost = minus the median final return: above 1, streams ahead)
and ``grad_steps_per_s_streams_vs_<recipe>``.

    python benchmarks/bench_sac.py                                   # 50k frames, 5 + 3 seeds: hours on a CPU
    python benchmarks/bench_sac.py --tasks pendulum_p --recipes streams,ff,sequence --seeds 1 --frames 12000
    python benchmarks/bench_sac.py --speed-only
    python benchmarks/bench_sac.py --merge runs/sac_p,runs/sac_v --out runs/bench_sac  # a grid run in pieces
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_learning import plot_runs  # benchmarks/bench_learning.py
from tqdm import tqdm

from toolkit import checked_config, config_options, options  # benchmarks/toolkit.py

from torchrl_seqchunk.recipes import sac as recurrent_sac
from torchrl_seqchunk.recipes.common.report import evaluation_points, final_evaluation

TASKS = {"pendulum_p": ("Pendulum-v1", "0,1"), "pendulum_v": ("Pendulum-v1", "2")}
RECIPES = {"streams": dict(replay="streams"), "sequence": dict(replay="sequence"), "slice": dict(replay="slice"),
           "ff": dict(net="ff"), "framestack": dict(net="framestack")}
PUBLISHED = {"pendulum_p": "sb3-contrib RecurrentPPO -217.9 at 100k steps (rl-zoo)",
             "pendulum_v": "recurrent TD3 about -180 (pomdp-baselines, Ni et al. 2022)"}
GOAL = -180.0  # the goal for streams on both tasks
SET_HERE = ("env", "keep", "seed", "total_frames", "runs_dir", "name", "progress", "net", "replay", "burn_in")
"""The example's fields the benchmark sets itself: sequence burns in half its windows' T."""


SETTINGS = "sac_settings.json"  # a grid's --frames and Config fields, compared by --merge


def settings(args) -> dict:
    """What every run of a grid shares: ``--frames`` and the recipe Config's fields as ``--options``
    resolves them (defaults included; those set per run left out), as ``sac_settings.json`` holds them."""
    config = dataclasses.asdict(recurrent_sac.Config(**{"progress": False, **args.options}))
    return {"frames": args.frames, **{k: v for k, v in config.items() if k not in SET_HERE}}


def recipe_options(recipe: str, chosen: dict) -> dict:
    """The example's options of ``recipe`` (``sequence``: burn-in ``T/2``)."""
    if recipe != "sequence":
        return RECIPES[recipe]
    return {**RECIPES[recipe], "burn_in": chosen.get("seq_len", recurrent_sac.Config.seq_len) // 2}


def run(task: str, recipe: str, seed: int, args) -> tuple[list[dict], dict]:
    if recipe == "sb3":
        return run_sb3(task, seed, args)
    env, keep = TASKS[task]
    with tempfile.TemporaryDirectory() as runs:
        cfg = recurrent_sac.Config(env=env, keep=keep, seed=seed, total_frames=args.frames, runs_dir=runs,
                                   name="cell", progress=False, **recipe_options(recipe, args.options), **args.options)
        rows = recurrent_sac.train(cfg).rows
    last, evals = rows[-1], evaluation_points(rows)
    return evals, {"final_return": final_evaluation(evals), "grad_steps": last["grad_steps"],
                   "grad_steps_per_s": last["grad_steps"] / max(last["learn_s"], 1e-9), "wall_s": last["wall_s"]}


def sb3_env(task: str, prev_reward: bool = False):
    """The gymnasium env of ``task`` for sb3-contrib: the kept entries, then the previous reward
    where ``prev_reward`` (as ``seqchunk sac --prev-reward``)."""
    import gymnasium as gym

    from torchrl_seqchunk import MaskObservation, PreviousReward

    env_id, keep = TASKS[task]
    env = MaskObservation(gym.make(env_id), [int(i) for i in keep.split(",")])
    return PreviousReward(env) if prev_reward else env


def run_sb3(task: str, seed: int, args) -> tuple[list[dict], dict]:
    """sb3-contrib RecurrentPPO with rl-zoo's tuned PendulumNoVel-v1 ``ppo_lstm`` entry (its
    ``VecNormalize`` of observations and rewards included; evaluation on the raw rewards with the
    training statistics), evaluated every ``--eval-every`` frames on ``--eval-episodes``
    deterministic episodes: the policy acting at that frame, and after a rollout's update where the
    rollout ends; once more after the last update. Runs whole rollouts of 4 x 1024 frames past
    ``--frames`` (as the recipes round up to whole collector batches). The previous reward appended
    to the observation where ``--options prev_reward=True`` (the other options are the recipe's)."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common import evaluation
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    make = functools.partial(sb3_env, task, args.options.get("prev_reward", False))
    env = VecNormalize(make_vec_env(make, n_envs=4, seed=seed), gamma=0.9)  # rl-zoo's normalize: True, its gamma
    eval_env = VecNormalize(make_vec_env(make, n_envs=1, seed=seed + 10**6), training=False, norm_reward=False)
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                         learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4, seed=seed,
                         policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                                            enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))
    rollout, evals, start = model.n_steps * model.n_envs, [], time.perf_counter()

    def evaluate() -> None:
        sync_envs_normalization(env, eval_env)
        mean, _ = evaluation.evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
        evals.append({"frames": model.num_timesteps, "return_mean": float(mean)})

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:  # inside a rollout: the policy it acts with
            if self.num_timesteps % rollout and self.num_timesteps // args.eval_every > len(evals):
                evaluate()
            return True

        def _on_rollout_start(self) -> None:  # after the last rollout's update
            if self.num_timesteps // args.eval_every > len(evals):
                evaluate()

    model.learn(args.frames, callback=Evaluate())
    evaluate()  # the last update, which no rollout follows
    return evals, {"final_return": final_evaluation(evals), "grad_steps": float("nan"), "grad_steps_per_s": float("nan"),
                   "wall_s": time.perf_counter() - start}


def speed(args) -> dict[str, float]:
    """Gradient steps per second of each recipe on one buffer of random-policy steps, interleaved A/B
    rounds (median); RATIO lines of streams against each other."""
    half = recipe_options("sequence", args.options)
    variants = {"streams": dict(), "sequence_burnin0": dict(replay="sequence", burn_in=0),
                f"sequence_burnin{half['burn_in']}": half, "slice": dict(replay="slice")}
    cfgs = {name: checked_config(recurrent_sac.Config, args.options, recurrent_sac.envs.check_keep, seed=0,
                                 progress=False, total_frames=args.frames, **v) for name, v in variants.items()}
    first = cfgs["slice"]  # stores both memories, which the windows start from
    nets = recurrent_sac.make_nets(first, recurrent_sac.make_env(first, [], 1, 0))
    env = recurrent_sac.make_env(first, nets["rnns"], first.num_envs, 0)
    with torch.no_grad():
        data = env.rollout(args.speed_frames // first.num_envs, recurrent_sac.Seq(nets["act"], nets["critic"]),
                           break_when_any_done=False).contiguous()
    env.close()
    data["collector", "traj_ids"] = (data["is_init"].squeeze(-1).long().cumsum(1)
                                     + 10_000 * torch.arange(data.shape[0]).unsqueeze(1))  # one id per episode
    steps = {}
    for name, cfg in cfgs.items():
        buffer = recurrent_sac.make_buffer(cfg)
        recurrent_sac.write(cfg, buffer, data.clone())
        loss, updater = recurrent_sac.make_loss(cfg, nets)
        optim = torch.optim.Adam(loss.parameters(), lr=1e-4)

        def step(cfg=cfg, buffer=buffer, loss=loss, updater=updater, optim=optim):
            out = loss(recurrent_sac.sample(cfg, buffer))
            optim.zero_grad()
            (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
            optim.step()
            updater.step()
        steps[name] = step

    def timed(name: str, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            steps[name]()
        return (time.perf_counter() - start) / count

    for name in steps:  # warm up
        timed(name, 2)
    seconds = {name: [] for name in steps}
    for _ in tqdm(range(args.speed_rounds), desc="speed"):
        for name in steps:
            seconds[name].append(timed(name, args.speed_steps))
    median = {name: statistics.median(s) for name, s in seconds.items()}
    for name in steps:
        print(f"{name}: {1 / median[name]:.1f} gradient steps/s (median of {args.speed_rounds} rounds)")
    ratios = {name: median[name] / median["streams"] for name in steps if name != "streams"}
    for name, ratio in ratios.items():
        print(f"RATIO grad_steps_per_s_streams_vs_{name} {ratio:.3f}")
    return ratios


def plot(curves: dict, tasks: list[str], recipes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for recipe in recipes:
            if curves.get((task, recipe)):
                plot_runs(ax, curves[(task, recipe)], recipe, ragged=True, lw=1)
        ax.axhline(GOAL, color="gray", ls="--", lw=1, label=f"goal {GOAL:g}")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("env frames", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("deterministic evaluation return", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def paired(summaries: dict, task: str, recipe: str, seeds: dict) -> str:
    """``PAIRED`` line of ``recipe`` against streams on the seeds both ran (a seed: the same env
    seeds, the same torch seed): on how many streams' final return is higher, and the mean
    difference; "" where they share no evaluated seed, or ``recipe`` is streams or sb3 (its seeds are
    not the recipes' env seeds)."""
    shared = [s for s in seeds.get("streams", []) if s in seeds.get(recipe, [])
              and not math.isnan(summaries.get((task, "streams", s), {}).get("final_return", math.nan))
              and not math.isnan(summaries.get((task, recipe, s), {}).get("final_return", math.nan))]
    if recipe in ("streams", "sb3") or not shared:
        return ""
    diffs = [summaries[(task, "streams", s)]["final_return"] - summaries[(task, recipe, s)]["final_return"]
             for s in shared]
    ahead = sum(d > 0 for d in diffs)
    return (f"PAIRED streams_vs_{recipe}_{task} streams ahead on {ahead} of {len(diffs)} seeds, mean difference "
            f"{statistics.mean(diffs):+.1f}\n")


def report(summaries: dict, tasks: list[str], recipes: list[str], seeds: dict) -> list[str]:
    """The table (markdown lines) and the RATIO and GOAL lines."""
    lines = ["| task | recipe | seeds | median final return | finals | median grad steps/s | median wall s |",
             "|---" * 7 + "|"]
    for task in tasks:
        medians = {}
        for recipe in recipes:
            runs = [summaries[(task, recipe, s)] for s in seeds[recipe] if (task, recipe, s) in summaries]
            unevaluated = [r for r in runs if math.isnan(r["final_return"])]
            if unevaluated:
                print(f"{task} {recipe}: {len(unevaluated)} run(s) without an evaluation, left out of the median")
            runs = [r for r in runs if not math.isnan(r["final_return"])]
            if not runs:
                continue
            medians[recipe] = statistics.median(r["final_return"] for r in runs)
            finals = ", ".join(f"{r['final_return']:.0f}" for r in runs)
            lines.append(f"| {task} | {recipe} | {len(runs)} | {medians[recipe]:.1f} | {finals} | "
                         f"{statistics.median(r['grad_steps_per_s'] for r in runs):.1f} | "
                         f"{statistics.median(r['wall_s'] for r in runs):.0f} |")
        lines.append(f"| {task} | published | | {PUBLISHED[task]} | | | |")
        for recipe, value in medians.items():
            if recipe != "streams" and "streams" in medians and medians["streams"] < 0 and value < 0:
                print(f"RATIO cost_{recipe}_vs_streams_{task} {value / medians['streams']:.3f}")
            print(paired(summaries, task, recipe, seeds) or "", end="")
        if "streams" in medians:
            reached = "reached" if medians["streams"] >= GOAL else "not reached"
            print(f"GOAL streams_median_final_{task} {medians['streams']:.1f} (>= {GOAL:g}: {reached})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {tuple(TASKS)}")
    parser.add_argument("--recipes", default="streams,sequence,slice,ff,framestack,sb3",
                        help=f"comma-separated, streams first, from {(*RECIPES, 'sb3')} (without streams: a piece "
                             "of a grid to --merge)")
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds of streams")
    parser.add_argument("--other-seeds", default="1,2,3", help="comma-separated seeds of the other recipes")
    parser.add_argument("--frames", type=int, default=50_000, help="env frames per run")
    parser.add_argument("--eval-every", type=int, default=1000, help="frames between evaluations (sb3's too)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="deterministic episodes per evaluation")
    parser.add_argument("--out", default="runs/bench_sac", help="output folder")
    parser.add_argument("--merge", default="",
                        help="comma-separated --out folders of earlier runs (e.g. a grid split over processes): "
                             "their CSVs joined into --out, with the table, RATIO lines and plot (refused where they ran with "
                             "other --frames or --options, as their sac_settings.json say); nothing runs")
    parser.add_argument("--speed-only", action="store_true", help="only the speed comparison")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed comparison")
    parser.add_argument("--speed-frames", type=int, default=4096, help="random-policy frames in the speed buffer")
    parser.add_argument("--speed-rounds", type=int, default=10, help="A/B rounds of the speed comparison")
    parser.add_argument("--speed-steps", type=int, default=4, help="gradient steps per recipe per round")
    parser.add_argument("--options", default="", help="fields of the example's Config for every run, e.g. "
                        "replay_ratio=128,hidden=32")

    def check(args) -> None:
        if args.merge:
            read_runs([Path(folder) for folder in args.merge.split(",")])
            return
        options.names("tasks", args.tasks, tuple(TASKS))
        recipes = options.names("recipes", args.recipes, (*RECIPES, "sb3"))
        if "streams" in recipes and recipes[0] != "streams":  # without it: a piece of a grid to --merge
            raise ValueError("--recipes must start with streams (the others are compared with it).")
        if args.speed_only and args.no_speed:
            raise ValueError("--speed-only and --no-speed leave nothing to run: give one of them.")
        args.options = config_options(recurrent_sac.Config, args.options, (*SET_HERE, "eval_every", "eval_episodes"))
        if "sb3" in recipes and args.options.get("max_episode_steps"):
            raise ValueError("--recipes sb3 runs Pendulum's own 200-step episodes (rl-zoo's setting): drop "
                             "max_episode_steps from --options, or sb3 from --recipes.")
        args.options.update(eval_every=args.eval_every, eval_episodes=args.eval_episodes)
        for task in args.tasks.split(","):
            for recipe in (r for r in args.recipes.split(",") if r != "sb3"):
                checked_config(recurrent_sac.Config, args.options, recurrent_sac.envs.check_keep,
                               env=TASKS[task][0], keep=TASKS[task][1], total_frames=args.frames,
                               **recipe_options(recipe, args.options))

    args = options.parse(parser, ints={"frames": 1, "eval_every": 1, "eval_episodes": 1, "speed_frames": 64,
                                       "speed_rounds": 1, "speed_steps": 1},
                         int_lists={"seeds": 0, "other_seeds": 0}, check=check)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        return merge([Path(folder) for folder in args.merge.split(",")], out)
    tasks, recipes = args.tasks.split(","), args.recipes.split(",")
    if "sb3" in recipes and not _has_sb3():
        print("sb3-contrib is missing (pip install -e '.[bench]'): its arm is skipped; published references: "
              + "; ".join(PUBLISHED[t] for t in tasks))
        recipes.remove("sb3")
    torch.set_num_threads(1)
    if not args.no_speed:
        speed(args)
    if args.speed_only:
        return
    seeds = {r: args.seeds if r == "streams" else args.other_seeds for r in recipes}
    (out / SETTINGS).write_text(json.dumps(settings(args), sort_keys=True) + "\n")
    grid = [(t, s, r) for t in tasks for s in sorted(set(args.seeds) | set(args.other_seeds)) for r in recipes
            if s in seeds[r]]
    summaries, curves = {}, {}
    with open(out / "sac.csv", "w", newline="") as f, open(out / "sac_summary.csv", "w", newline="") as g:
        rows = csv.DictWriter(f, fieldnames=["task", "recipe", "seed", "frames", "return_mean"])
        summary = csv.DictWriter(g, fieldnames=["task", "recipe", "seed", "final_return", "grad_steps",
                                                "grad_steps_per_s", "wall_s"])
        rows.writeheader()
        summary.writeheader()
        for task, seed, recipe in tqdm(grid, desc="grid"):
            evals, result = run(task, recipe, seed, args)
            rows.writerows({"task": task, "recipe": recipe, "seed": seed, **e} for e in evals)
            summary.writerow({"task": task, "recipe": recipe, "seed": seed, **result})
            f.flush()
            g.flush()
            summaries[(task, recipe, seed)] = result
            curves.setdefault((task, recipe), []).append(evals)
    finish(out, f"{args.frames} frames per run, evaluations every {args.eval_every} ({args.eval_episodes} episodes)",
           summaries, curves, tasks, recipes, seeds)


def finish(out: Path, heading: str, summaries: dict, curves: dict, tasks: list, recipes: list, seeds: dict) -> None:
    """Writes ``sac_table.md`` and ``sac.png`` under ``out`` and prints the table and the RATIO lines."""
    lines = [heading, "", *report(summaries, tasks, recipes, seeds)]
    (out / "sac_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(curves, tasks, recipes, out / "sac.png")
    print(f"-> {out}")


def read_runs(folders: list[Path]) -> tuple[dict, dict, dict]:
    """The runs in the ``sac_summary.csv`` and ``sac.csv`` of ``folders`` (outputs of this script):
    ``(summaries, evals, settings)``, the first two by ``(task, recipe, seed)``, the last the runs'
    shared ``--frames`` and Config fields (``sac_settings.json``); a ValueError where a folder lacks
    them, two hold the same run or two ran with other settings."""
    evals, summaries, settings = {}, {}, {}
    for folder in folders:
        missing = [name for name in ("sac_summary.csv", "sac.csv", SETTINGS) if not (folder / name).exists()]
        if missing:
            raise ValueError(f"--merge {folder}: no {' and '.join(missing)} there (give --out folders of earlier "
                             f"runs; {SETTINGS}: what a grid ran with, written since it is compared).")
        settings[folder] = json.loads((folder / SETTINGS).read_text())
        if settings[folder] != settings[folders[0]]:
            differ = sorted(k for k in {*settings[folder], *settings[folders[0]]}
                            if settings[folder].get(k) != settings[folders[0]].get(k))
            raise ValueError(f"--merge: {folder} ran with other settings than {folders[0]} ({', '.join(differ)} "
                             f"differ in their {SETTINGS}); merge runs of the same --frames and --options only.")
        with open(folder / "sac_summary.csv") as f:
            for row in csv.DictReader(f):
                key = (row["task"], row["recipe"], int(row["seed"]))
                if key in summaries:
                    raise ValueError(f"--merge: the run {key} is in two folders; give each run once.")
                summaries[key] = {name: float(row[name]) for name in row if name not in ("task", "recipe", "seed")}
        with open(folder / "sac.csv") as f:
            for row in csv.DictReader(f):
                evals.setdefault((row["task"], row["recipe"], int(row["seed"])), []).append(
                    {"frames": int(float(row["frames"])), "return_mean": float(row["return_mean"])})
    if not summaries:
        raise ValueError(f"--merge: no run in {', '.join(map(str, folders))} (their CSVs hold a header only).")
    return summaries, evals, settings[folders[0]]


def merge(folders: list[Path], out: Path) -> None:
    """Joins the runs of ``folders`` (see :func:`read_runs`) into ``out``'s CSVs, table and plot."""
    summaries, evals, settings = read_runs(folders)
    (out / SETTINGS).write_text(json.dumps(settings, sort_keys=True) + "\n")
    with open(out / "sac.csv", "w", newline="") as f, open(out / "sac_summary.csv", "w", newline="") as g:
        rows = csv.DictWriter(f, fieldnames=["task", "recipe", "seed", "frames", "return_mean"])
        summary = csv.DictWriter(g, fieldnames=["task", "recipe", "seed", *next(iter(summaries.values()))])
        rows.writeheader()
        summary.writeheader()
        for (task, recipe, seed), result in sorted(summaries.items()):
            rows.writerows({"task": task, "recipe": recipe, "seed": seed, **e} for e in evals.get((task, recipe, seed), []))
            summary.writerow({"task": task, "recipe": recipe, "seed": seed, **result})
    tasks = [t for t in TASKS if any(k[0] == t for k in summaries)]
    recipes = [r for r in (*RECIPES, "sb3") if any(k[1] == r for k in summaries)]
    seeds = {r: sorted({k[2] for k in summaries if k[1] == r}) for r in recipes}
    curves = {}
    for key in sorted(summaries):
        curves.setdefault(key[:2], []).append(evals.get(key, []))
    finish(out, f"merged from {', '.join(map(str, folders))}", summaries, curves, tasks, recipes, seeds)


def _has_sb3() -> bool:
    import importlib.util

    return importlib.util.find_spec("sb3_contrib") is not None


if __name__ == "__main__":
    main()
