"""Recurrent off-policy recipes side by side: stream chunks against TorchRL's own sequence replay.

Every run is ``seqchunk dqn`` (double DQN, 3-step targets, a target
network, per-env epsilon-greedy, its defaults or the same ``--options`` otherwise) with only ``--replay``,
``--initial-state``, ``--stream-groups`` and ``--overlap`` changed, so the recipes see equal
env frames and equal gradient steps (the same replay ratio of ``B * T`` learned steps per frame):

- ``streams``: ``StreamChunkSampler(B, T)``, each network carrying its state per stream;
- ``sequence``: TorchRL's ``Sequence(T, "include_reset", burn_in=K)`` from the stored state;
- ``slice``: TorchRL's ``SliceSampler(slice_len=T)`` from the stored state;
- ``slice-zero``: the same from a zero state;
- ``streams-4groups``: ``streams`` with ``--stream-groups 4`` (``4 B`` streams trained ``B``
  rows per gradient step, in turn), an ablation;
- ``streams-overlap10``: ``streams`` with ``--overlap 10`` (each chunk first unrolls, without
  gradient, the stream's previous 10 steps from the carry taken before them), an ablation.

Per run: frames until the mean return of the last 20 episodes first reaches
``--threshold`` (the frame budget if never), MMER (POPGym's max over the run of the mean
episode return), the final mean return, gradient steps per second of learning time and
recurrent steps computed per gradient step (a burn-in is paid in forward passes). Runs
with the same seed share env draws and initial weights, so each other recipe (TorchRL's,
or an ablation) is compared with ``streams`` pair by pair: mean
paired difference, 95% bootstrap interval, exact sign-flip p-value
(``bench_boundary.paired_stats``).

Before the grid (unless ``--no-speed``; alone with ``--speed-only``) it times gradient
steps per second of ``streams`` against ``sequence`` at equal ``B, T`` (burn-in 0 and
``K``) on one buffer of random-policy steps,
in interleaved rounds so that machine load hits both alike (median over rounds); and the
DQN recipe's collection, ``VectorEnvCollector`` against TorchRL's ``Collector`` on the same env
and policy, the same way (``collect_fps_vector_vs_collector``, the median of per-round ratios).

Writes under ``--out``: ``offpolicy.csv`` (one row per collector batch of every run),
``offpolicy_summary.csv`` (one row per run), ``offpolicy.png`` (mean and range over seeds,
one panel per task) and prints ``RATIO`` lines: ``mmer_streams_vs_<recipe>_<task>``
(median over seeds; only where both medians are positive, else the difference), ``frames_to_threshold_<recipe>_vs_streams_<task>`` and
``grad_steps_per_s_streams_vs_sequence_burnin<k>``, ``collect_fps_vector_vs_collector``.

``--options`` sets fields of the DQN recipe's Config for every recipe (another replay ratio, say);
a grid records them in ``offpolicy.csv``. ``--from-runs`` compares the runs of earlier grids
instead (their ``offpolicy.csv``: a grid run in parts, or seed sets run apart, pooled over the
seeds where every recipe ran, all made with the ``--options`` given).

    python benchmarks/bench_offpolicy.py --tasks cartpole --seeds 1,2,3 --frames 12000
    python benchmarks/bench_offpolicy.py --speed-only
    python benchmarks/bench_offpolicy.py --options replay_ratio=4 --seeds 36,37,38,39,40 --no-speed
    python benchmarks/bench_offpolicy.py --from-runs runs/part1,runs/part2 --out runs/pooled
"""
from __future__ import annotations

import argparse
import csv
import itertools
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_boundary import paired_stats  # benchmarks/bench_boundary.py
from bench_learning import plot_runs  # benchmarks/bench_learning.py
from bench_memory import cell_summary  # benchmarks/bench_memory.py
from tqdm import tqdm

from toolkit import checked_config, config_options, options  # benchmarks/toolkit.py: the recipes' option checks

from torchrl_seqchunk.recipes import dqn, dqn_replay  # seqchunk dqn
from torchrl_seqchunk.recipes.common import envs

RECIPES = {  # name: the recipe's options
    "streams": dict(replay="streams"), "sequence": dict(replay="sequence"), "slice": dict(replay="slice"),
    "slice-zero": dict(replay="slice", initial_state="zero"), "streams-4groups": dict(replay="streams", stream_groups=4),
    "streams-overlap10": dict(replay="streams", overlap=10),
}
SET_HERE = ("env", "seed", "total_frames", "runs_dir", "name", "progress", "stop_at_target", "burn_in",
            *dict.fromkeys(k for r in RECIPES.values() for k in r))
"""The DQN recipe's fields the grid sets itself (not ``--options``): every run goes to ``--frames``;
``sequence`` burns in the DQN recipe's default, and the speed comparison 0 and that."""
KEY = ("task", "recipe", "seed")  # of a run, in the CSVs
EXTRA = ("grad_steps", "learn_s", "recurrent_steps_per_grad_step")  # the DQN recipe's columns a summary reads
TASKS = {  # name: (env id, threshold of the mean return; POPGym's returns lie in [-1, 1])
    "cartpole": ("CartPole-v1", 450.0),
    "repeat_first": ("popgym:popgym-RepeatFirstEasy-v0", 0.5),
    "repeat_previous": ("popgym:popgym-RepeatPreviousEasy-v0", 0.5),
    "count_recall": ("popgym:popgym-CountRecallEasy-v0", 0.5),
}


def run(task: str, recipe: str, seed: int, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as runs:
        cfg = dqn.Config(env=TASKS[task][0], seed=seed, total_frames=args.frames, runs_dir=runs,
                                   name="cell", progress=False, **RECIPES[recipe], **args.options)
        return dqn.train(cfg).rows


def summarize(rows: list[dict], threshold: float, cap: int) -> dict:
    """MMER, frames to ``threshold`` (``cap`` if never), final return, gradient steps per
    second of learning time and recurrent steps per gradient step of one run."""
    last = rows[-1]  # every recipe reports after the same collector batches
    return {**cell_summary(rows, threshold, cap, {r["frames"] for r in rows}), "final_return": last["return_mean"],
            "grad_steps_per_s": last["grad_steps"] / max(last["learn_s"], 1e-9),
            "recurrent_steps_per_grad_step": last["recurrent_steps_per_grad_step"]}


def options_text(chosen: dict) -> str:
    """``--options`` as a grid records it in ``offpolicy.csv`` (its column ``options``): ``"name=value,..."``
    sorted by name, leaving out a value equal to the DQN recipe's default (so ``""`` for the defaults)."""
    return ",".join(f"{name}={value}" for name, value in sorted(chosen.items())
                    if value != getattr(dqn.Config, name))


def read_runs(folders: list[str], tasks: list[str], recipes: list[str], frames: int,
              chosen: dict) -> tuple[dict, list[int], list[int]]:
    """The runs of earlier grids (each folder's ``offpolicy.csv``), ``{(task, recipe): {seed: rows}}``,
    the seeds where every task and recipe asked for ran, and the seeds left out (some run
    missing). A ValueError names the folder and what is wrong: no such file, a column missing,
    a run found twice (in two folders, or twice in one: its frames not increasing), a run made
    with other ``--options`` than ``chosen`` (a file without the column: the defaults), no seed in
    common, or a run pooled that did not end where a grid of ``frames`` (``--frames``) ends."""
    runs: dict = {}
    needed = (*KEY, "frames", "return_mean", *EXTRA)
    for folder in folders:
        path = Path(folder) / "offpolicy.csv"
        if not folder or not path.is_file():
            raise ValueError(f"--from-runs {folder!r}: no offpolicy.csv there (a folder this script wrote with --out).")
        found: dict = {}
        with open(path) as f:
            reader = csv.DictReader(f)
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"--from-runs {folder}: offpolicy.csv has no column {missing} (not a file this "
                                 "script wrote?).")
            for row in reader:
                key = (row["task"], row["recipe"], int(row["seed"]))
                if row.get("options", "") != options_text(chosen):
                    raise ValueError(f"--from-runs {folder}: the run {key} was made with --options "
                                     f"{row.get('options', '')!r}, not {options_text(chosen)!r}: pool runs of one "
                                     "setting, and give it as --options.")
                rows = found.setdefault(key, [])
                rows.append({k: float(row[k]) for k in needed[len(KEY):]})
                if len(rows) > 1 and rows[-1]["frames"] <= rows[-2]["frames"]:
                    raise ValueError(f"--from-runs {folder}: the run {key} restarts at {rows[-1]['frames']:.0f} "
                                     "frames: two runs under one key; keep one.")
        for (task, recipe, seed), rows in found.items():
            if seed in runs.setdefault((task, recipe), {}):
                raise ValueError(f"--from-runs: {task} {recipe} seed {seed} is in more than one folder; keep one.")
            runs[(task, recipe)][seed] = rows
    ran = [set(runs.get((t, r), {})) for t in tasks for r in recipes]
    seeds = set.intersection(*ran)
    if not seeds:
        raise ValueError(f"--from-runs: no seed has a run of every task {tasks} and recipe {recipes}; "
                         "name the tasks and recipes the folders hold (--tasks, --recipes).")
    planned = dqn.Config(total_frames=frames, progress=False,
                                   **{**chosen, "learning_starts": 0}).planned_frames  # whole batches
    for (task, recipe, seed) in itertools.product(tasks, recipes, sorted(seeds)):
        end = runs[(task, recipe)][seed][-1]["frames"]
        if end != planned:
            raise ValueError(f"--from-runs: the run {task} {recipe} seed {seed} ends at {end:.0f} frames, a grid of "
                             f"--frames {frames} at {planned}: pool runs of one length, and give it as --frames.")
    return runs, sorted(seeds), sorted(set.union(*ran) - seeds)


def speed_configs(options: dict, frames: int) -> dict:
    """The speed comparisons' Configs, built (never run) on the default task with ``--options`` and
    checked as the grid's runs are (``frames``: their budget): ``streams``, ``sequence_burnin<K>``
    for K of 0 and the DQN recipe's burn-in, and ``collect`` for the collection speed."""
    def checked(**recipe):
        return checked_config(dqn.Config, options, envs.check_keep, dqn.check_actions,
                              seed=0, progress=False, total_frames=frames, **recipe)

    streams = checked()
    variants = {"streams": streams, "collect": streams}  # the collection speed runs the streams recipe's Config
    for k in (0, dqn.Config.burn_in):
        variants[f"sequence_burnin{k}"] = checked(replay="sequence", burn_in=k)
    return variants


def speed(args) -> dict[int, float]:
    """Gradient steps per second, streams over sequence, per burn-in, interleaved A/B."""
    buffers, losses = {}, {}
    variants = {name: cfg for name, cfg in args.speed_configs.items() if name != "collect"}
    first = variants["streams"]
    qnet, rnn, policy = dqn.make_qnet(first, envs.make_env(first))
    env = envs.make_acting_env(first, [rnn], 0)
    with torch.no_grad():
        data = env.rollout(args.speed_frames // first.num_envs, policy, break_when_any_done=False).contiguous()
    env.close()
    ids = data["is_init"].squeeze(-1).long().cumsum(1) + 10_000 * torch.arange(data.shape[0]).unsqueeze(1)
    data["collector", "traj_ids"] = ids  # one id per episode of each env
    for name, cfg in variants.items():
        buffers[name] = dqn_replay.make_buffer(cfg)
        dqn_replay.write(cfg, buffers[name], data.clone())  # extend writes "index" into its input
        losses[name] = dqn.make_loss(cfg, qnet, rnn)[0]
    optim = torch.optim.Adam(qnet.parameters(), lr=1e-4)
    training = {name: dqn_replay.batches(cfg, buffers[name]) for name, cfg in variants.items()}

    def steps(name: str, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            out = losses[name](next(training[name]))
            optim.zero_grad()
            out["loss"].backward()
            optim.step()
        return (time.perf_counter() - start) / count

    for name in variants:  # warm up: first boundary scans, allocator
        steps(name, 2)
    seconds = {name: [] for name in variants}
    for _ in tqdm(range(args.speed_rounds), desc="speed"):
        for name in variants:
            seconds[name].append(steps(name, args.speed_steps))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    for name in variants:
        print(f"{name}: {1 / median[name]:.1f} gradient steps/s (median of {args.speed_rounds} rounds)")
    ratios = {}
    for k in (0, dqn.Config.burn_in):
        ratios[k] = median[f"sequence_burnin{k}"] / median["streams"]
        print(f"RATIO grad_steps_per_s_streams_vs_sequence_burnin{k} {ratios[k]:.3f}")
    return ratios


def collect_speed(args) -> float:
    """Frames/s of the DQN recipe's collection, VectorEnvCollector over TorchRL's Collector (same env,
    Q-network, QValueModule and per-env EGreedyModule), interleaved rounds of 4 batches each."""
    from torchrl.collectors import Collector
    from torchrl_seqchunk import VectorEnvCollector

    cfg = args.speed_configs["collect"]
    _, rnn, policy = dqn.make_qnet(cfg, envs.make_env(cfg))
    per_batch = cfg.num_envs * cfg.collect_len
    kinds = {"collector": Collector, "vector": VectorEnvCollector}
    collectors = {name: kind(envs.make_acting_env(cfg, [rnn], cfg.seed), policy,
                             frames_per_batch=per_batch) for name, kind in kinds.items()}
    batches = {name: iter(c) for name, c in collectors.items()}
    for it in batches.values():  # warm up
        next(it)
    seconds = {name: [] for name in kinds}
    for _ in tqdm(range(args.speed_rounds), desc="collect speed"):
        for name, it in batches.items():
            start = time.perf_counter()
            for _ in range(4):
                next(it)
            seconds[name].append((time.perf_counter() - start) / (4 * per_batch))
    for name, c in collectors.items():
        c.shutdown()
        print(f"{name}: {1 / statistics.median(seconds[name]):,.0f} frames/s (median of {args.speed_rounds} rounds)")
    ratio = statistics.median(c / v for c, v in zip(seconds["collector"], seconds["vector"]))
    print(f"RATIO collect_fps_vector_vs_collector {ratio:.3f}")
    torch.set_num_threads(1)  # TorchRL's batched env raises the thread count when it closes
    return ratio


def plot(curves: dict, tasks: list[str], recipes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for recipe in recipes:
            plot_runs(ax, curves[(task, recipe)], recipe, lw=1)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("env frames", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("mean return, last 20 episodes", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def mmer_ratio_line(name: str, ours: float, theirs: float) -> str:
    """``RATIO name ours/theirs`` where both median MMERs are positive; else no ratio (POPGym's
    returns lie in [-1, 1], and a quotient of negative returns reads backwards) but the difference."""
    if ours > 0 and theirs > 0:
        return f"RATIO {name} {ours / theirs:.3f}"
    return (f"{name}: no ratio (a median MMER <= 0: {ours:.3f}, {theirs:.3f}); difference of medians, "
            f"streams - recipe {ours - theirs:+.3f}")


def frames_ratio_line(name: str, theirs: float, ours: float, cap: int) -> str:
    """``RATIO name theirs/ours`` of median frames to the threshold, unless neither median
    reaches it (both are then the frame budget, ``cap``, and the ratio would read as a tie)."""
    if theirs >= cap and ours >= cap:
        return f"{name}: no ratio (neither median reaches the threshold within {cap} frames)"
    return f"RATIO {name} {theirs / ours:.3f}"


def compare(summaries: dict, tasks: list[str], recipes: list[str], seeds: list[int], cap: int) -> list[str]:
    """The paired table (markdown lines) and the RATIO lines of the learning grid."""
    rng = np.random.default_rng(0)
    lines = ["| task | recipe | median MMER | median frames to threshold | median final return "
             "| grad steps/s | recurrent steps/grad step | streams - recipe, MMER: mean [95% CI], p "
             "| seeds where streams' MMER is ahead (level) |",
             "|---" * 9 + "|"]
    for task in tasks:
        for recipe in recipes:
            runs = [summaries[(task, recipe, s)] for s in seeds]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            cell = count = ""
            if recipe != "streams":
                diffs = [summaries[(task, "streams", s)]["mmer"] - summaries[(task, recipe, s)]["mmer"] for s in seeds]
                mean, low, high, p = paired_stats(diffs, rng)
                shown = f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"  # down to 2 ** -n at n seeds
                cell = f"{mean:+.2f} [{low:+.2f}, {high:+.2f}], p={shown}"
                if not all(map(math.isfinite, diffs)):
                    cell = "none: a run ended no episode (no MMER)"
                count = f"{sum(d > 0 for d in diffs)} of {len(diffs)} ({sum(d == 0 for d in diffs)})"
                ours = statistics.median(summaries[(task, "streams", s)]["mmer"] for s in seeds)
                theirs = statistics.median(r["mmer"] for r in runs)
                print(mmer_ratio_line(f"mmer_streams_vs_{recipe}_{task}", ours, theirs))
                frames_ours = statistics.median(summaries[(task, "streams", s)]["frames_to_threshold"] for s in seeds)
                print(frames_ratio_line(f"frames_to_threshold_{recipe}_vs_streams_{task}",
                                        med["frames_to_threshold"], frames_ours, cap))
            frames = "never" if med["frames_to_threshold"] >= cap else f"{med['frames_to_threshold']:.0f}"
            lines.append(f"| {task} | {recipe} | {med['mmer']:.2f} | {frames} | "
                         f"{med['final_return']:.2f} | {med['grad_steps_per_s']:.1f} | "
                         f"{med['recurrent_steps_per_grad_step']:.0f} | {cell} | {count} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {tuple(TASKS)}")
    parser.add_argument("--recipes", default="streams,sequence,slice,slice-zero", help=f"comma-separated, streams first, from {tuple(RECIPES)}")
    parser.add_argument("--seeds", default=argparse.SUPPRESS, help="comma-separated seeds (default 1,2,3,4,5, on which the DQN recipe's "
                        "options were chosen: compare recipes on others, e.g. 31 and up)")
    parser.add_argument("--frames", type=int, default=100_000, help="env frames per run")
    parser.add_argument("--out", default="runs/bench_offpolicy", help="output folder")
    parser.add_argument("--speed-only", action="store_true", help="only the speed comparisons (gradient steps, collection)")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed comparisons")
    parser.add_argument("--speed-frames", type=int, default=4096, help="random-policy frames in the speed buffer")
    parser.add_argument("--speed-rounds", type=int, default=40, help="A/B rounds of each speed comparison")
    parser.add_argument("--speed-steps", type=int, default=4, help="gradient steps per recipe per round")
    parser.add_argument("--from-runs", default="", help="comma-separated --out folders of earlier grids: compare "
                        "their runs (offpolicy.csv; over the seeds where every task and recipe ran, --frames their "
                        "budget) instead of running a grid; no speed comparisons, no --seeds")
    parser.add_argument("--options", default="", help="fields of the DQN recipe's Config set for every recipe, e.g. "
                        "replay_ratio=4,lr=1e-4 (recorded in offpolicy.csv; with --from-runs, the runs' own)")

    def check(args) -> None:
        options.names("tasks", args.tasks, tuple(TASKS))
        args.options = config_options(dqn.Config, args.options, SET_HERE)
        if options.names("recipes", args.recipes, tuple(RECIPES))[0] != "streams":
            raise ValueError("--recipes must start with streams (the others are compared with it).")
        if args.speed_only and args.no_speed:
            raise ValueError("--speed-only and --no-speed leave nothing to run: give one of them.")
        if args.from_runs:
            if args.speed_only or hasattr(args, "seeds"):
                raise ValueError("--from-runs compares the runs of earlier grids, over the seeds every task and "
                                 "recipe ran: not with --speed-only or --seeds.")
            args.runs, args.seeds, args.left_out = read_runs(args.from_runs.split(","), args.tasks.split(","),
                                                             args.recipes.split(","), args.frames, args.options)
        else:
            args.seeds = options.int_list("seeds", getattr(args, "seeds", "1,2,3,4,5"), 0)
            for task, recipe in itertools.product(args.tasks.split(","), args.recipes.split(",")):
                # every run of the grid as the DQN recipe checks its command line, before any run
                checked_config(dqn.Config, args.options, envs.check_keep,
                               dqn.check_actions, env=TASKS[task][0], total_frames=args.frames,
                               **RECIPES[recipe])
            if not args.no_speed:
                args.speed_configs = speed_configs(args.options, args.frames)

    args = options.parse(parser, ints={"frames": 1, "speed_frames": 64, "speed_rounds": 1, "speed_steps": 1},
                         check=check)
    tasks, recipes, seeds = args.tasks.split(","), args.recipes.split(","), args.seeds
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_speed and not args.from_runs:
        speed(args)
        collect_speed(args)
    if args.speed_only:
        return
    runs = args.runs if args.from_runs else run_grid(tasks, recipes, seeds, args, out)
    report(runs, tasks, recipes, seeds, args, out)


def run_grid(tasks: list[str], recipes: list[str], seeds: list[int], args, out: Path) -> dict:
    """Every run of the grid, written to ``offpolicy.csv`` as it ends; ``{(task, recipe): {seed: rows}}``."""
    runs: dict = {}
    grid = [(task, seed, recipe) for task in tasks for seed in seeds for recipe in recipes]
    with open(out / "offpolicy.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*KEY, "frames", "wall_s", "return_mean", *EXTRA, "options"])
        writer.writeheader()
        for task, seed, recipe in tqdm(grid, desc="grid"):
            rows = run(task, recipe, seed, args)
            writer.writerows({"task": task, "recipe": recipe, "seed": seed, "options": options_text(args.options),
                              **{k: r[k] for k in ("frames", "wall_s", "return_mean", *EXTRA)}} for r in rows)
            f.flush()
            runs.setdefault((task, recipe), {})[seed] = rows
    return runs


def report(runs: dict, tasks: list[str], recipes: list[str], seeds: list[int], args, out: Path) -> None:
    """Per run summaries (``offpolicy_summary.csv``), the paired table (``offpolicy_table.md``, printed
    with the RATIO lines) and the curves (``offpolicy.png``) of ``runs`` over ``seeds``."""
    summaries = {(task, recipe, seed): summarize(runs[(task, recipe)][seed], TASKS[task][1], args.frames)
                 for task in tasks for recipe in recipes for seed in seeds}
    with open(out / "offpolicy_summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*KEY, *next(iter(summaries.values())), "options"])
        writer.writerows([*k, *(f"{v:.0f}" if float(v).is_integer() else f"{v:.7g}" for v in s.values()),
                          options_text(args.options)] for k, s in summaries.items())
    source = f", runs of {args.from_runs}" if args.from_runs else ""
    if args.from_runs and args.left_out:
        source += f" (seeds left out, a task or recipe missing: {args.left_out})"
    setting = f", --options {options_text(args.options)}" if options_text(args.options) else ""
    lines = [f"{args.frames} frames per run{setting}{source}, seeds {seeds}", "",
             *compare(summaries, tasks, recipes, seeds, args.frames)]
    (out / "offpolicy_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    curves = {(task, recipe): [runs[(task, recipe)][seed] for seed in seeds] for task in tasks for recipe in recipes}
    plot(curves, tasks, recipes, out / "offpolicy.png")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
