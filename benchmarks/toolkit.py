"""What the benchmarks share of the recipes (``torchrl_seqchunk.recipes``)::

    from toolkit import checked_config, config_options, options

``options``: the recipes' option checks; ``config_options`` and ``checked_config``: a recipe's
Config from a benchmark's ``--options``. The recipes themselves are imported from the package
(``from torchrl_seqchunk.recipes import ppo``: ``ppo.Config``, ``ppo.train(cfg).rows``).
"""
from __future__ import annotations

import dataclasses
import re
import typing

from torchrl_seqchunk.recipes.common import options

__all__ = ["checked_config", "config_options", "options"]


def config_options(config: type, text: str, set_here: tuple[str, ...]) -> dict:
    """``--options`` ``"name=value,..."``: fields of the recipe's Config dataclass ``config``, each
    given once and converted to the field's type; a value may hold commas (``keep=0,2,gamma=0.98``:
    an item starts only at ``,name=``); ``set_here``: the fields the benchmark sets itself. A
    ValueError names the item and the fix. Check the runs they make with :func:`checked_config`."""
    fields, hints = {f.name: f for f in dataclasses.fields(config)}, typing.get_type_hints(config)
    chosen = {}
    for item in filter(None, re.split(r",+(?=\w+=)", text.strip(","))):
        name, _, value = item.partition("=")
        if name not in fields or name in set_here or not value:
            raise ValueError(f"--options {item!r}: give name=value, name a field of the recipe's Config that the "
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
    """``config(**fixed, **chosen)`` checked as the recipe checks a command line that gives
    ``chosen``: its ``check()``, an option of ``chosen`` the run would ignore refused even at its
    default (``options.applicable``), then each of ``checks(cfg)`` (the recipe's checks that build
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
