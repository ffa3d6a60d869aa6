"""Backends: the protocol, the recording fake, and tinygrad."""

from devbridge.backends.base import OK, PENDING, Backend, BackendError, Status

__all__ = ["OK", "PENDING", "Backend", "BackendError", "Status"]
