"""FaultyBackend's old import path: it lives in the testing kit, `devbridge.testing.faulty`, now."""

from devbridge.testing.faulty import (
    FaultyBackend,
)

__all__ = [
    "FaultyBackend",
]
