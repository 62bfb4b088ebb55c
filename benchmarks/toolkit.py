"""The examples' toolkit (``examples/common``) and the main job, for the benchmarks::

    from toolkit import load_main_job, options

The one place where a benchmark finds ``examples/`` (an example finds it by being there).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from common import options  # noqa: E402  examples/common/options.py

__all__ = ["EXAMPLES", "load_main_job", "options"]


def load_main_job():
    """``examples/recurrent_ppo.py`` as the module ``recurrent_ppo``: its ``Config`` and ``main(cfg) -> rows``."""
    if "recurrent_ppo" in sys.modules:
        return sys.modules["recurrent_ppo"]
    spec = importlib.util.spec_from_file_location("recurrent_ppo", EXAMPLES / "recurrent_ppo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
