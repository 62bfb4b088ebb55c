"""Recurrent DQN from replay (R2D2-style): the same run as ``seqchunk dqn``, from a checkout.

    python examples/recurrent_dqn.py [--replay streams|sequence|slice]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/dqn.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["dqn", *sys.argv[1:]])
