"""Opening a backend by name, for the apps and the CLI: `fake` (the testing kit's) or `tinygrad`."""

from __future__ import annotations

from devbridge.backends.base import Backend


def make_backend(name: str, device: str | None = None) -> Backend:
    """`fake` or `tinygrad` (on `device`, tinygrad's default when None); tinygrad is imported only then."""
    if name == "fake":
        from devbridge.testing import FakeBackend

        return FakeBackend()
    from devbridge.backends.tinygrad import TinygradBackend

    return TinygradBackend(device)
