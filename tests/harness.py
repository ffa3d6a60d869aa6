"""One interface over every backend, for the conformance suite.

Each backend is wrapped in FaultyBackend, which records call ops and injects
failures the same way for all of them. `settle(ev)` lets the backend finish an
event (the fake completes it; a real device is waited on); `hold()` keeps
asynchronous copies from completing for the duration of a block.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from devbridge import Bridge, BridgeError, Event, HostRing
from devbridge.backends.fake import FakeBackend
from devbridge.backends.faulty import FaultyBackend
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.errors import InvalidArgumentError


@dataclass
class Harness:
    name: str
    backend: FaultyBackend
    bridge: Bridge
    ring: HostRing
    settle: Callable[[Event], None]
    hold: Callable[[], contextlib.AbstractContextManager[None]]

    def backend_ops(self, *ops: str) -> list[str]:
        """The recorded backend ops, keeping only `ops`."""
        return [op for op in self.backend.ops if op in ops]


def _fake() -> Harness:
    fake = FakeBackend()
    backend = FaultyBackend(fake)

    def settle(ev: Event) -> None:
        if fake.query(ev.backend_token).done is False:
            fake.complete(ev)
        ev.done()

    return Harness("fake", backend, Bridge(backend), HostRing(1 << 16), settle, contextlib.nullcontext)


def _tinygrad(device: str) -> Callable[[], Harness]:
    def make() -> Harness:
        real = TinygradBackend(device)
        backend = FaultyBackend(real)

        def settle(ev: Event) -> None:
            with contextlib.suppress(BridgeError):
                ev.wait(timeout=30)

        return Harness(f"tinygrad-{device}", backend, Bridge(backend), HostRing(1 << 16), settle, real.hold_copies)

    return make


def _opens(device: str) -> bool:
    try:
        TinygradBackend(device)
    except InvalidArgumentError:
        return False
    return True


#: Every tinygrad device named here that opens on this machine: CPU always; CL where OpenCL is
#: installed (pocl in CI); PYTHON, tinygrad's emulator with its own memory. More (CUDA, NV, ...)
#: from the environment. Never tinygrad's default device: each test names its device.
DEVICES = [
    d
    for d in dict.fromkeys(["CPU", "CL", "PYTHON", *os.environ.get("DEVBRIDGE_TEST_DEVICES", "").split(",")])
    if d and (d == "CPU" or _opens(d))
]
#: (backend, device) for the jobs that compute: the fake, then each device but PYTHON, whose
#: emulator runs a matmul about a hundred times slower than CPU
COMPUTE_DEVICES: list[tuple[str, str | None]] = [("fake", None)] + [("tinygrad", d) for d in DEVICES if d != "PYTHON"]
HARNESSES: dict[str, Callable[[], Harness]] = {"fake": _fake} | {f"tinygrad-{d}": _tinygrad(d) for d in DEVICES}
