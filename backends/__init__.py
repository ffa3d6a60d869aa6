"""Backends: the protocol (`base`) and tinygrad's (`tinygrad.TinygradBackend`). The test doubles,
`FakeBackend` and `FaultyBackend`, are the testing kit's (`devbridge.testing`); their old paths
here (`devbridge.backends.fake`, `.faulty`) re-export them."""

from typing import Any

from devbridge.backends.base import OK, PENDING, Backend, BackendError, Status


def __getattr__(name: str) -> Any:
    """`make_backend`, an app's helper now (devbridge.apps.backends), served from its old path."""
    if name != "make_backend":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return importlib.import_module("devbridge.apps.backends").make_backend


__all__ = ["OK", "PENDING", "Backend", "BackendError", "Status", "make_backend"]
