"""The core's vocabulary for a backend's answer: an event token's status.

A backend's `query` returns one (`devbridge.backends.base.Backend`); the core decides on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Status:
    """An event token's status: pending, done, or done with an error message (`failure`: which
    of the spec's failures the error is, None: its use's kind's, the backend's failure; `fields`:
    what that error says besides its message, as keyword arguments)."""

    done: bool
    error: str | None = None
    failure: str | None = None
    fields: tuple[tuple[str, object], ...] = ()


PENDING = Status(False)
OK = Status(True)
