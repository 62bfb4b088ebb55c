"""``python -m torchrl_seqchunk.check``: see :mod:`torchrl_seqchunk.check.cli`."""
import sys

from .cli import main

sys.exit(main())
