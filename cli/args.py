"""The command line's argument types and its two ways of answering besides a report: a usage
error (one line, exit 2) and a progress bar (only on a terminal)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path


def usage_error(command: str, message: str) -> int:
    """One line on stderr, exit status 2 (as argparse does for a bad option)."""
    print(f"devbridge {command}: error: {message}", file=sys.stderr)
    return 2


def progress_bar(args: argparse.Namespace) -> bool:
    """Whether to draw a progress bar: asked for, and stderr is a terminal."""
    return not args.no_progress and sys.stderr.isatty()


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an int of at least `least` (else one line and exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def probability(text: str) -> float:
    """An argparse type: a float in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text}")
    return value


def depth_or_all(text: str) -> int | str:
    """A depth (at least 1) or `all`."""
    return text if text == "all" else at_least(1)(text)


def spans(text: str) -> tuple[tuple[int, int], ...]:
    """OFFSET:SIZE,... as ((offset, size), ...); whether they fit is the Bound's to say."""
    try:
        return tuple((int(o), int(n)) for o, n in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not OFFSET:SIZE,...: {text!r}") from None


def trace_target_error(path: str | None) -> str | None:
    """Why `--trace PATH` cannot be written (one line), checked before any work; None if it can."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"--trace {path!r} is a directory"
    folder = target.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return f"--trace {path!r}: cannot create a file in {str(folder)!r}"
    return None
