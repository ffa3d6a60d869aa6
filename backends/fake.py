"""FakeBackend's old import path: it lives in the testing kit, `devbridge.testing.fake`, now."""

from devbridge.testing.fake import (
    DEFAULT_CAPACITY,
    GUARD,
    GUARD_BYTE,
    POISON_BYTE,
    VIOLATION_KINDS,
    WRITES,
    Call,
    FakeBackend,
    FakeBuffer,
    FakeEvent,
    FakeViolation,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "GUARD",
    "GUARD_BYTE",
    "POISON_BYTE",
    "VIOLATION_KINDS",
    "WRITES",
    "Call",
    "FakeBackend",
    "FakeBuffer",
    "FakeEvent",
    "FakeViolation",
]
