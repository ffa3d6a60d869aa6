"""Exactly-once accounting, shared by every app that delivers objects: deliveries are counted
per object id wherever they happen (one worker, the devices of one process, a fleet's actors),
so an object lost, delivered twice or delivered wrong shows as such."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Delivery:
    """How a run's objects were delivered; the first fields of every app's summary."""

    objects: int  # objects the run was given
    delivered: int  # of them, delivered at least once
    lost: int  # never delivered
    duplicated: int  # deliveries beyond the first, over all objects
    wrong: int  # objects delivered with a wrong output at least once

    @property
    def clean(self) -> bool:
        """Every object delivered exactly once, and right."""
        return self.lost == self.duplicated == self.wrong == 0 and self.delivered == self.objects


@dataclass
class Tally:
    """Deliveries by object id, and the ids whose output was wrong."""

    delivered: Counter[int] = field(default_factory=Counter)
    wrong: set[int] = field(default_factory=set)

    def deliver(self, k: int, right: bool) -> None:
        self.delivered[k] += 1
        if not right:
            self.wrong.add(k)

    def add(self, other: Tally) -> None:
        """Count another tally's deliveries too (a batch's, another device's)."""
        self.delivered.update(other.delivered)
        self.wrong |= other.wrong

    def __contains__(self, k: object) -> bool:
        return k in self.delivered

    def __len__(self) -> int:
        """Objects delivered at least once."""
        return len(self.delivered)

    def delivery(self, objects: int) -> Delivery:
        """The run's delivery figures, for `objects` objects given."""
        got = len(self.delivered)
        duplicated = sum(n - 1 for n in self.delivered.values() if n > 1)
        return Delivery(objects, got, objects - got, duplicated, len(self.wrong))
