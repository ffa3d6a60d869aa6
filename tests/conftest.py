"""Shared fixtures: a fresh FakeBackend, a Bridge over it, a HostRing."""

from __future__ import annotations

import pytest

from devbridge import Bridge, HostRing
from devbridge.backends.fake import FakeBackend


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def bridge(fake: FakeBackend) -> Bridge:
    return Bridge(fake)


@pytest.fixture
def ring() -> HostRing:
    return HostRing(1024)
