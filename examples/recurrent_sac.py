"""Recurrent SAC on Pendulum observing the angle only: the same run as ``seqchunk sac``, from a checkout.

    python examples/recurrent_sac.py [--replay sequence] [--net ff] [--keep 2]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/sac.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["sac", *sys.argv[1:]])
