"""Command lines for the examples: every field of a Config dataclass is a flag with its help and default."""
from __future__ import annotations

import argparse
import dataclasses


def opt(default, help: str):
    """A Config field whose command-line help is `help`."""
    return dataclasses.field(default=default, metadata={"help": help})


def config_parser(config: type, description: str, choices: dict | None = None,
                  hidden: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """``--field-name`` per field of the dataclass `config` (booleans as ``--x/--no-x``), each
    showing its default; `choices` maps field names to their allowed values; the fields in
    `hidden` get no flag (they keep their defaults)."""

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=description, formatter_class=Formatter)
    for field in (f for f in dataclasses.fields(config) if f.name not in hidden):
        flag, help = "--" + field.name.replace("_", "-"), field.metadata["help"]
        if field.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default, help=help)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default, help=help,
                                choices=(choices or {}).get(field.name))
    return parser
