"""The recurrence checker's cost: a 1,000-step rollout of a small GRU and LSTM policy checked on one thread.

For each cell (and layout), in interleaved rounds so that machine load weighs on both sides
alike, on masked CartPole (8 envs x 125 steps, the command line's agent: encoder, ``ResetRNN``
and MLP heads for an actor and a critic of ``--hidden`` units):

- ``check``: ``check_recurrence`` from the env (the collection of the rollout included), every
  check run (the reference stepped again over the rollout, the training pass, the perturbed
  passes of ``resets``, the long unroll of ``carry`` for streams);
- ``collect``: the collection alone (``env.rollout`` of the same policy), the limit a check
  cannot go below.

Prints ``TIME check_1000_steps_s_{cell}_{layout}`` (the median seconds, goal < 30) and
``RATIO check_vs_collect_{cell}_{layout}`` (the paired median of check / collection).

    python benchmarks/bench_check.py                      # gru and lstm, windows and streams
    python benchmarks/bench_check.py --quick              # one round, fewer steps
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict.nn import TensorDictSequential as Seq
from timing import paired_ratio, print_ratios  # benchmarks/timing.py
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

from torchrl_seqchunk.check import StreamLayout, WindowLayout, check_recurrence
from torchrl_seqchunk.check.cli import build


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default="gru,lstm")
    parser.add_argument("--layouts", default="windows,streams")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=125, help="steps per env")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of 4 envs x 32 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.num_envs, args.steps = 1, 4, 32
    for name in ("num_envs", "steps", "hidden", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for cell in args.cells.split(","):
        if cell not in ("gru", "lstm"):
            parser.error(f"--cells: unknown {cell!r}, give gru and/or lstm")
    for layout in args.layouts.split(","):
        if layout not in ("windows", "streams"):
            parser.error(f"--layouts: unknown {layout!r}, give windows and/or streams")
    return args


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    figures, times = {}, {}
    for cell in args.cells.split(","):
        for kind in args.layouts.split(","):
            name = f"{cell}_{kind}"
            actor, critic, env = build("CartPole-v1", num_envs=args.num_envs, keep=(0, 2), cell=cell,
                                       hidden=args.hidden, carry=kind == "streams")
            policy = Seq(actor, critic)
            layout = WindowLayout(8) if kind == "windows" else StreamLayout(4, 16)
            report = None

            def check():
                nonlocal report
                report = check_recurrence(policy, env, layout, steps=args.steps)

            def collect():
                with torch.no_grad(), set_recurrent_mode(False), set_exploration_type(ExplorationType.RANDOM):
                    env.rollout(args.steps, policy, break_when_any_done=False)

            times[f"check_{name}"], times[f"collect_{name}"] = [], []
            for _ in range(args.rounds):
                times[f"check_{name}"].append(timed(check))
                times[f"collect_{name}"].append(timed(collect))
            env.close()
            if not report.ok:
                raise SystemExit(f"the {name} pipeline failed its check:\n{report}")
            seconds = statistics.median(times[f"check_{name}"])
            print(f"TIME check_{args.num_envs * args.steps}_steps_s_{name} {seconds:.2f}")
            figures[f"check_vs_collect_{name}"] = paired_ratio(times, f"check_{name}", f"collect_{name}")
    print_ratios(figures)
    return figures


if __name__ == "__main__":
    main()
