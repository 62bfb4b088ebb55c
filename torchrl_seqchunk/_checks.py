"""Argument checks shared by every public class and function: one helper per kind of check.

Each raises ``TypeError`` for a value of the wrong type and ``ValueError`` for a value out of
range, naming the argument, the value and the accepted range.
"""
from __future__ import annotations

import numbers


def _range_text(low, high) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` (a bool is refused), within ``[low, high]`` where given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an int{_range_text(low, high)}, got {value!r} ({type(value).__name__})."
        )
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be{_range_text(low, high)}, got {value}.")
    return int(value)


def check_real(
    name: str, value, *, low: float | None = None, high: float | None = None, open_low: bool = False
) -> float:
    """``value`` as a finite ``float`` (a bool is refused), within ``[low, high]`` where given;
    ``open_low`` excludes ``low`` itself (``> low``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}.")
    too_low = low is not None and (value <= low if open_low else value < low)
    if too_low or (high is not None and value > high):
        bound = f" > {low}" if open_low and high is None else _range_text(low, high)
        if open_low and high is not None:
            bound = f" in ({low}, {high}]"
        raise ValueError(f"{name} must be{bound}, got {value}.")
    return value
