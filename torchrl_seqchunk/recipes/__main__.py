"""``python -m torchrl_seqchunk.recipes <recipe> [flags]``: the ``seqchunk`` command."""
from torchrl_seqchunk.recipes.cli import main

if __name__ == "__main__":  # worker processes (spawn) import this module again without running it
    main()
