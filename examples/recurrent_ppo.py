"""Recurrent PPO on CartPole without velocities (the main job): the same run as ``seqchunk ppo``, from a checkout.

    python examples/recurrent_ppo.py [--boundary-mode mask] [--batching streams] [--env Pendulum-v1 --keep 0,1]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/ppo.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["ppo", *sys.argv[1:]])
