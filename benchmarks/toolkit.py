"""The examples' toolkit (``examples/common``) and the main job, for the benchmarks::

    from toolkit import load_main_job, options

The one place where a benchmark finds ``examples/`` (an example finds it by being there).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import typing
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from torchrl_seqchunk.recipes.common import options  # noqa: E402  examples/common/options.py

__all__ = ["EXAMPLES", "checked_config", "config_options", "load_main_job", "options"]


def load_main_job():
    """``examples/recurrent_ppo.py`` as the module ``recurrent_ppo``: its ``Config`` and ``main(cfg) -> rows``."""
    if "recurrent_ppo" in sys.modules:
        return sys.modules["recurrent_ppo"]
    spec = importlib.util.spec_from_file_location("recurrent_ppo", EXAMPLES / "recurrent_ppo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def config_options(config: type, text: str, set_here: tuple[str, ...]) -> dict:
    """``--options`` ``"name=value,..."``: fields of the example's Config dataclass ``config``, each
    given once and converted to the field's type; a value may hold commas (``keep=0,2,gamma=0.98``:
    an item starts only at ``,name=``); ``set_here``: the fields the benchmark sets itself. A
    ValueError names the item and the fix. Check the runs they make with :func:`checked_config`."""
    fields, hints = {f.name: f for f in dataclasses.fields(config)}, typing.get_type_hints(config)
    chosen = {}
    for item in filter(None, re.split(r",+(?=\w+=)", text.strip(","))):
        name, _, value = item.partition("=")
        if name not in fields or name in set_here or not value:
            raise ValueError(f"--options {item!r}: give name=value, name a field of the example's Config that the "
                             f"benchmark does not set itself ({', '.join(set_here)}), e.g. gamma=0.98")
        if name in chosen:
            raise ValueError(f"--options {item!r}: {name} is given twice; give it once")
        kind, choices = type(fields[name].default), typing.get_args(hints[name])
        try:
            chosen[name] = {"true": True, "false": False}[value.lower()] if kind is bool else kind(value)
        except (KeyError, ValueError):
            raise ValueError(f"--options {item!r}: {name} takes a {kind.__name__}") from None
        if typing.get_origin(hints[name]) is typing.Literal and value not in choices:
            raise ValueError(f"--options {item!r}: {name} is one of {choices}")
    return chosen


def checked_config(config: type, chosen: dict, *checks, **fixed):
    """``config(**fixed, **chosen)`` checked as the example checks a command line that gives
    ``chosen``: its ``check()``, an option of ``chosen`` the run would ignore refused even at its
    default (``options.applicable``), then each of ``checks(cfg)`` (the example's checks that build
    an env, such as ``check_keep``). A ValueError says which ``--options`` it refuses."""
    try:
        cfg = config(**fixed, **chosen)
        cfg.check()
        options.applicable(cfg, chosen)
        for check in checks:
            check(cfg)
    except (ValueError, TypeError) as err:
        setting = ",".join(f"{k}={v}" for k, v in chosen.items())
        run = ", ".join(f"{k}={v}" for k, v in fixed.items()) + (f" and --options {setting!r}" if chosen else "")
        raise type(err)(f"a run of {run}: {err}") from None
    return cfg
