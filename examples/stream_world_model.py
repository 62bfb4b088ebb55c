"""A world model on stream chunks of Atari frames: the same run as ``seqchunk world-model``, from a checkout.

    python examples/stream_world_model.py [--env ALE/Pong-v5]

The trainer is a recipe of the package, read top to bottom in
torchrl_seqchunk/recipes/world_model.py (its Config, then train(cfg)); every flag is its
Config's field (``--help``).
"""
import sys

from torchrl_seqchunk.recipes import cli

if __name__ == "__main__":  # worker processes (spawn) import this file again without running it
    cli.main(["world-model", *sys.argv[1:]])
