"""Backends: the protocol (`base`), the recording fake (`fake.FakeBackend`), fault injection
around any backend (`faulty.FaultyBackend`), and tinygrad (`tinygrad.TinygradBackend`)."""

from devbridge.backends.base import OK, PENDING, Backend, BackendError, Status


def make_backend(name: str, device: str | None = None) -> Backend:
    """`fake` or `tinygrad` (on `device`, tinygrad's default when None); tinygrad is imported only then."""
    if name == "fake":
        from devbridge.backends.fake import FakeBackend

        return FakeBackend()
    from devbridge.backends.tinygrad import TinygradBackend

    return TinygradBackend(device)


__all__ = ["OK", "PENDING", "Backend", "BackendError", "Status", "make_backend"]
