"""devbridge's testing kit: the test doubles a worker's own tests run the Bridge on.

- `FakeBackend`: a device in memory that records every call, finishes work when told (in any
  order, or in order as a queue), checks that nothing touches freed or in-use memory, and fails
  the calls a test chooses (`fail_next`).
- `FaultyBackend`: wraps any backend and fails chosen or random calls (`fail_next`, `rate`).
- `fake_pump`: a fake device's progress, for a worker loop that runs on the fake.

It sits above the runtime (nothing in the runtime imports it) and below the apps.
"""

from devbridge.testing.fake import FakeBackend
from devbridge.testing.faulty import FaultyBackend
from devbridge.testing.pump import fake_pump

__all__ = ["FakeBackend", "FaultyBackend", "fake_pump"]
