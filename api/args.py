"""The one home of argument checks (ARG-1). Every public entry point checks its plain arguments
(flags, counts, seconds, probabilities) with these, so a bad one gets the same typed error,
worded the same way, wherever it is passed; nothing is coerced from a truthy or string value."""

from __future__ import annotations

import math
import numbers
from typing import NoReturn

from devbridge.errors import InvalidArgumentError, short


def refuse(message: str) -> NoReturn:
    """Raise ARG-1 with `message`."""
    raise InvalidArgumentError("ARG-1", message)


def flag(name: str, value: object) -> bool:
    """`value` if it is a bool (not merely truthy); ARG-1 otherwise."""
    if type(value) is not bool:
        refuse(f"{name} must be a bool, got {short(value)}")
    return value


def as_count(value: object) -> int | None:
    """`value` as a plain int when it is an integer (numpy integers included), else None.
    bool is not a count: `True` as a size is a caller's bug, not 1."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # numpy's integers are Integral
        try:
            return int(value)
        except Exception:  # an int subclass whose __int__ fails
            return None
    return None


def count(name: str, value: object, least: int = 0, note: str = "", most: int | None = None) -> int:
    """`value` as an int >= least (and <= most, if given; numpy integers included, bool not);
    ARG-1 otherwise. `note` follows the bound in the message (what a value means, say)."""
    n = as_count(value)
    if n is None or n < least:
        refuse(f"{name} must be an int >= {least}{note}, got {short(value)}")
    if most is not None and n > most:
        refuse(f"{name} must be an int <= {most}{note}, got {short(value)}")
    return n


def optional_count(name: str, value: object, least: int = 0, most: int = 1 << 62) -> int | None:
    """None, or `value` as an int in [least, most]; ARG-1 otherwise."""
    n = None if value is None else as_count(value)
    if value is not None and (n is None or n < least):
        refuse(f"{name} must be None or an int >= {least}, got {short(value)}")
    if n is not None and n > most:
        refuse(f"{name} must be None or an int <= {most}, got {short(value)}")
    return n


def as_seconds(value: object, what: str) -> float:
    """`value` as a number of seconds >= 0 (inf allowed); ARG-1 for anything else (bool, NaN, ...)."""
    if type(value) is float and value >= 0:  # the usual cases first (NaN fails the comparison)
        return value
    if type(value) is int and 0 <= value < 1 << 53:
        return float(value)
    try:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        seconds = float(value) if real else math.nan  # type: ignore[arg-type]
    except (ArithmeticError, TypeError, ValueError):  # too large for a float, or a broken number type
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        refuse(f"{what} must be seconds >= 0, got {short(value)}")
    return seconds


def probability(name: str, value: object) -> float:
    """`value` as a probability in [0, 1) (a real number, not bool); ARG-1 otherwise."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    p = float(value) if real else math.nan  # type: ignore[arg-type]
    if not 0 <= p < 1:
        refuse(f"{name} is a probability in [0, 1), got {short(value)}")
    return p
