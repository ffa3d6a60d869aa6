"""The fake device's progress for apps that run on the fake: a pump that finishes its work."""

from __future__ import annotations

import random
from collections.abc import Callable

from devbridge.testing.fake import FakeBackend


def fake_pump(fake: FakeBackend, seed: int) -> Callable[[], None]:
    """The fake device's progress: each call finishes a random part of its pending work, in any order."""
    rng = random.Random(seed)

    def pump() -> None:
        pending = fake.pending()
        rng.shuffle(pending)
        for event in pending[: max(1, len(pending) * 2 // 3)]:
            fake.complete(event)

    return pump
