"""The main job on several learner processes and env workers: the same run as ``seqchunk distributed-ppo``, from a checkout.

    python examples/distributed_ppo.py [--learners 2 --workers 4] [--engine ray]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/distributed_ppo.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["distributed-ppo", *sys.argv[1:]])
