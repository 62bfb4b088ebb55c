"""A reverse curriculum from one demonstration: the same run as ``seqchunk curriculum``, from a checkout.

    python examples/reverse_curriculum.py [--env MiniGrid-DoorKey-5x5-v0] [--no-curriculum]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/curriculum.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["curriculum", *sys.argv[1:]])
