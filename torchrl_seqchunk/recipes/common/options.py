"""Command lines and option checks for every recipe and benchmark, in one place.

A Config dataclass becomes a command line through tyro (help from the fields' docstrings,
choices from ``Literal`` types, booleans as ``--x/--no-x``); its ``check()`` method checks
the options with the helpers below, once parsed (:func:`cli`) and again when a job starts
from a Config built in code. Benchmarks keep argparse and check their namespace with the
same helpers through :func:`parse`. Every failure names the flag and the accepted values,
and a refused command line exits with status 2 before anything is written.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from collections.abc import Callable, Collection, Sequence

import torch

from torchrl_seqchunk._checks import check_int, check_real


def flag(name: str) -> str:
    """The flag of a field: ``total_frames`` -> ``--total-frames``."""
    return "--" + name.replace("_", "-")


def integer(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """``value`` of option ``name`` as an int in ``[low, high]``, or a ValueError naming its flag."""
    return check_int(flag(name), value, low=low, high=high)


def real(name: str, value, low: float | None = None, high: float | None = None, *, open_low: bool = False) -> float:
    """``value`` of option ``name`` as a finite float in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    return check_real(flag(name), value, low=low, high=high, open_low=open_low)


def int_list(name: str, text: str, low: int | None = None, high: int | None = None) -> list[int]:
    """A comma-separated list of ints (``"0,1,2"``), each in ``[low, high]``, not empty, no repeats."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag(name)} must be comma-separated integers such as '0,1,2', got {text!r}.") from None
    if len(set(values)) != len(values):
        raise ValueError(f"{flag(name)} lists a value twice: {text!r}.")
    return [integer(name, v, low, high) for v in values]


def ordered(low_name: str, low, high_name: str, high) -> None:
    """Refuses ``low > high`` for two options that bound a range (``--min-episode <= --max-episode``)."""
    if low > high:
        raise ValueError(f"{flag(low_name)} {low} must be <= {flag(high_name)} {high}")


def names(name: str, text: str, allowed: Sequence[str]) -> list[str]:
    """A comma-separated list of names from ``allowed``, not empty, no repeats."""
    values = text.split(",")
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"{flag(name)}: unknown {unknown}; choose from {tuple(allowed)}.")
    if len(set(values)) != len(values):
        raise ValueError(f"{flag(name)} lists a name twice: {text!r}.")
    return values


def device(name: str, value: str) -> str:
    """A torch device this machine has: ``cpu``, ``cuda``/``cuda:1`` with CUDA, ``mps`` on Apple GPUs."""
    try:
        dev = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{flag(name)} must be a torch device such as 'cpu' or 'cuda:0', got {value!r}.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag(name)} {value}: this machine has no CUDA device; use --device cpu.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{flag(name)} {value}: this machine has {torch.cuda.device_count()} CUDA devices "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}).")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{flag(name)} {value}: MPS is not available here; use --device cpu.")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{flag(name)} must be cpu, cuda or mps, got {value!r}.")
    return value


def gym_id(name: str, value: str) -> str:
    """A registered gymnasium id, or ``"module:Id"`` whose module registers ``Id`` when imported."""
    import importlib

    import gymnasium as gym

    from gymnasium.envs.registration import load_env_creator

    module, _, env_id = value.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry_point = gym.spec(env_id).entry_point
        if isinstance(entry_point, str):  # imported, not built: an env whose package is missing says so now
            load_env_creator(entry_point)
    except ModuleNotFoundError as err:
        raise ValueError(f"{flag(name)} {value}: cannot import {err.name!r} "
                         "(an optional extra, such as popgym?)") from None
    except gym.error.DependencyNotInstalled as err:
        raise ValueError(f"{flag(name)} {value}: {err}") from None
    except gym.error.Error as err:
        raise ValueError(f"{flag(name)} {value}: {err} Give a registered gymnasium id such as CartPole-v1, or "
                         "'module:Id' for an id that a module registers (popgym:popgym-RepeatFirstEasy-v0).") from None
    return value


def fail(message: str, prog: str | None = None) -> None:
    """Exits as a refused command line does (status 2), with ``message`` on stderr; ``prog``: the
    command in the usage line (default: the script's)."""
    print(f"usage: {prog or sys.argv[0]} [-h] [OPTIONS]\nerror: {message}", file=sys.stderr)
    raise SystemExit(2)


def cli(config: type, description: str, argv: Sequence[str] | None = None, renamed: dict[str, str] | None = None,
        *, prog: str | None = None):
    """The Config dataclass ``config`` filled from the command line ``argv`` (default: ``sys.argv``)
    and checked (its ``check()``; a ValueError refuses the command). ``renamed`` maps deprecated
    flags to their new spelling: they still work, with a ``FutureWarning``; ``prog``: the
    command's name in its usage line (default: the script's)."""
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        old, eq, value = arg.partition("=")
        if renamed and old in renamed:
            warnings.warn(f"{old} is deprecated; use {renamed[old]}.", FutureWarning, stacklevel=2)
            argv[i] = renamed[old] + eq + value
    cfg = tyro.cli(config, args=argv, description=description, prog=prog)
    or_fail(cfg.check, prog=prog)
    or_fail(applicable, cfg, given_fields(config, argv), prog=prog)
    return cfg


def given_fields(config: type, argv: Sequence[str]) -> set[str]:
    """The fields of the dataclass ``config`` that ``argv`` sets (``--a-b v``, ``--a-b=v``, ``--a_b``,
    and a boolean's ``--a-b`` / ``--no-a-b``)."""
    fields = {field.name for field in dataclasses.fields(config)}
    given = set()
    for arg in argv:
        name = arg[2:].partition("=")[0].replace("-", "_") if arg.startswith("--") else ""
        if name not in fields and name.startswith("no_"):
            name = name[3:]
        if name in fields:
            given.add(name)
    return given


def applicable(cfg, given: Collection[str] | None = None) -> None:
    """Refuses an option that the run would ignore: ``type(cfg).APPLIES`` maps a field to ``(owner,
    values, note)``, the field applying only while field ``owner`` is one of ``values`` (a tuple, or
    a ``range`` of integers; ``owner`` None: never, in this Config's recipe). Such an option is refused where ``given`` names it (the
    fields a command line sets: a value equal to the default is still refused) or, with
    ``given=None`` (a Config built in code), where it differs from its default. A ValueError names
    the flags and the fix."""
    for name, (owner, values, note) in getattr(type(cfg), "APPLIES", {}).items():
        if owner is not None and getattr(cfg, owner) in values:
            continue
        if name in given if given is not None else getattr(cfg, name) != getattr(type(cfg), name):
            if owner is None:
                raise ValueError(f"{flag(name)} does not apply here{note}: drop {flag(name)}.")
            if isinstance(values, range):
                where = f"{flag(owner)} >= {values.start}"
            else:
                where = flag(owner) if values == (True,) else f"{flag(owner)} {' / '.join(map(str, values))}"
            raise ValueError(f"{flag(name)} applies to {where} only{note}: drop {flag(name)} or change {flag(owner)}.")


def or_fail(check: Callable, *args, prog: str | None = None):
    """``check(*args)`` (a check that needs more than the options, such as the file system),
    refusing the command line (status 2, ``prog`` in the usage line) if it raises a ValueError
    or TypeError."""
    try:
        return check(*args)
    except (ValueError, TypeError) as err:
        fail(str(err), prog)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, *,
          ints: dict[str, int | tuple] | None = None, int_lists: dict[str, int | tuple] | None = None,
          reals: dict[str, tuple] | None = None,
          devices: Sequence[str] = (), check: Callable[[argparse.Namespace], None] | None = None,
          ) -> argparse.Namespace:
    """``parser``'s namespace from ``argv``, every option checked before the script writes anything.

    ``ints`` maps an option to its lowest value or ``(low, high)`` (a list option: each entry);
    ``int_lists`` does the same for comma-separated lists (``"0,1,2"``), which become lists of ints;
    ``reals`` maps an option to ``(low, high)`` or ``(low, high, open_low)``; ``devices`` are
    torch devices this machine must have; ``check(args)`` checks the rest. A ValueError or
    TypeError refuses the command line with ``parser.error`` (status 2)."""
    args = parser.parse_args(argv)
    try:
        for name, bounds in (ints or {}).items():
            low, high = bounds if isinstance(bounds, tuple) else (bounds, None)
            values = getattr(args, name)
            for value in values if isinstance(values, list) else [values]:
                integer(name, value, low, high)
        for name, bounds in (int_lists or {}).items():
            low, high = bounds if isinstance(bounds, tuple) else (bounds, None)
            setattr(args, name, int_list(name, getattr(args, name), low, high))
        for name, (low, high, *open_low) in (reals or {}).items():
            real(name, getattr(args, name), low, high, open_low=bool(open_low and open_low[0]))
        for name in devices:
            device(name, getattr(args, name))
        if check is not None:
            check(args)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    return args
