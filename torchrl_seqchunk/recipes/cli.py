"""The seqchunk command: one subcommand per recipe, its flags the fields of the recipe's Config.

    seqchunk ppo                 # recurrent PPO on CartPole without velocities (the main job)
    seqchunk ppo --help          # every flag with its default
    seqchunk dqn                 # recurrent DQN from replay
    seqchunk sac                 # recurrent SAC on Pendulum with the angle only
    seqchunk curriculum          # reverse curriculum from one demonstration
    seqchunk world-model         # a world model on stream chunks of Atari frames (the atari extra)
    seqchunk distributed-ppo     # the main job on several learner processes and env workers

`python -m torchrl_seqchunk.recipes` is the same command. Every option is checked before
anything is written: a refused command line exits with status 2 and names the flag and the fix.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Annotated, Union

from .common import options

RECIPES = {
    "ppo": "torchrl_seqchunk.recipes.ppo",
    "dqn": "torchrl_seqchunk.recipes.dqn",
    "sac": "torchrl_seqchunk.recipes.sac",
    "curriculum": "torchrl_seqchunk.recipes.curriculum",
    "world-model": "torchrl_seqchunk.recipes.world_model",
    "distributed-ppo": "torchrl_seqchunk.recipes.distributed_ppo",
}
"""Subcommand -> the recipe's module (its ``Config``, ``check_command(cfg)`` and ``train(cfg)``)."""


def recipe(name: str) -> ModuleType:
    """The module of subcommand ``name`` (a key of RECIPES)."""
    return importlib.import_module(RECIPES[name])


def parse(argv: Sequence[str] | None = None):
    """The checked Config of the command line ``argv`` (default: ``sys.argv[1:]``), whose first
    word names the recipe. Exits with status 2 on a refused command line (after tyro's message
    or the check's), with status 0 after ``--help``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in RECIPES:
        choose(argv)  # the subcommands' help, or tyro's error: exits
    module, prog = recipe(argv[0]), f"seqchunk {argv[0]}"
    cfg = options.cli(module.Config, module.__doc__, argv[1:], getattr(module, "RENAMED", None), prog=prog)
    return options.or_fail(module.check_command, cfg, prog=prog)


def choose(argv: list[str]) -> None:
    """Tyro's answer to a command line that names no recipe: the list of subcommands, each with
    its first docstring line (``--help``, status 0), or the error (status 2)."""
    import tyro

    choices = []
    for name in RECIPES:
        module = recipe(name)
        summary = module.__doc__.strip().splitlines()[0]
        choices.append(Annotated[module.Config, tyro.conf.subcommand(name, description=summary)])
    tyro.cli(Union[tuple(choices)], args=argv, prog="seqchunk", description=__doc__)
    raise SystemExit(2)  # not reached: every recipe's argv starts with its name


def main(argv: Sequence[str] | None = None) -> None:
    """The ``seqchunk`` console script: parses ``argv`` (default: ``sys.argv[1:]``) and trains
    the recipe it names; the run prints its summary line and writes under ``--runs-dir``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse(argv)
    recipe(argv[0]).train(cfg)
