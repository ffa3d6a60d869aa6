"""The processes of the shared-ring tests: producers and consumers that share nothing but a ring's
name, started with the `spawn` method (nothing inherited), and the records they move.

A record's bytes are a function of (producer, index): its first 12 bytes say which record it
is, the rest follow from those, so a consumer checks every byte it takes without being told.
Each process appends one line per step to its log (O_APPEND: a line is written whole or not at
all), so a test reads what happened even in a process it killed.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path
from typing import Any

#: The producer id of the record that tells a consumer to stop.
STOP = 0xFFFF


def size_of(producer: int, index: int, largest: int) -> int:
    """A record's size: mixed, from 1 B to `largest` (most small, a few large)."""
    pick = random.Random(producer * 1_000_003 + index)
    return pick.randint(1, 64) if pick.random() < 0.5 else pick.randint(1, largest)


def payload(producer: int, index: int, nbytes: int) -> bytes:
    """The bytes of record (producer, index): a header, then a pattern that follows from it."""
    head = struct.pack("<III", producer, index, nbytes)
    body = hashlib.blake2b(head, digest_size=64).digest()
    data = head + body * (nbytes // 64 + 1)
    return data[:nbytes]


def identify(data: bytes) -> tuple[int, int, bool]:
    """Which record `data` is (producer, index) and whether every byte is right (records are
    12 bytes or more: each says which it is)."""
    if len(data) < 12:
        return -1, -1, False
    producer, index, nbytes = struct.unpack_from("<III", data)
    return producer, index, nbytes == len(data) and payload(producer, index, nbytes) == data


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def produce(name: str, producer: int, count: int, largest: int, log: str, until: str = "") -> None:
    """Reserve, fill and commit `count` records (or until the file `until` exists); log
    "producer index seq nbytes" after each commit."""
    from devbridge import HostRing

    ring = HostRing.attach(name)
    for index in range(count):
        if until and os.path.exists(until):
            break
        nbytes = max(size_of(producer, index, largest), 12)
        r = ring.reserve(nbytes, timeout=30)
        ring.write(r, payload(producer, index, nbytes))
        seq = ring.commit(r)
        _log(log, f"{producer} {index} {seq} {nbytes}")
    ring.close()


def consume(name: str, log: str, device: str = "none") -> None:
    """Take the consumer role ("S generation" in the log), then take, check and release records
    until the STOP record: "D seq producer index redelivered ok generation" for each record
    taken, logged before its release. A fenced call ends the process: "F generation rule", and
    "F generation rule unreleased" when the release of the record just logged was refused.
    `device`: "none" reads the bytes from the ring; "fake", "CPU" or "CL" uploads each record
    through a Bridge and downloads it into an in-process ring, and checks those bytes."""
    from devbridge import Bridge, HostRing, StaleHandleError

    ring = HostRing.attach(name)
    generation = ring.consume()
    _log(log, f"S {generation}")
    bridge = out = None
    if device != "none":
        if device == "fake":
            from devbridge.testing import FakeBackend

            bridge = Bridge(FakeBackend())
        else:
            from devbridge.backends.tinygrad import TinygradBackend

            bridge = Bridge(TinygradBackend(device))
        out = HostRing(1 << 20)
    try:
        _drain(ring, log, generation, bridge, out)
    except StaleHandleError as e:
        _log(log, f"F {generation} {e.rule}")
        os._exit(3)
    ring.close()


def _drain(ring: Any, log: str, generation: int, bridge: Any, out: Any) -> None:
    from devbridge import DeviceRange, ObjectSpec, StaleHandleError

    while True:
        r = ring.take(timeout=60)
        if bridge is None or out is None:
            data = bytes(ring.view(r))
        else:
            handle = bridge.alloc_device(ObjectSpec("record", "uint8"), r.nbytes)
            bridge.host_to_device(r, DeviceRange(handle, 0, r.nbytes), release=False)  # released below, once logged
            back = out.reserve(r.nbytes)
            bridge.device_to_host(DeviceRange(handle, 0, r.nbytes), back)
            data = bytes(out.view(back))
            out.release(back)
            bridge.free_device(handle)
        producer, index, ok = identify(data)
        _log(log, f"D {r.seq} {producer} {index} {int(r.redelivered)} {int(ok)} {generation}")
        try:
            ring.release(r)
        except StaleHandleError as e:
            # replaced while it held r (stopped after its take): the bytes it read were no longer
            # its own, and this take is no delivery; r went to the replacement
            _log(log, f"F {generation} {e.rule} unreleased")
            os._exit(3)
        if producer == STOP:
            return


def read_log(path: Path) -> list[list[str]]:
    """The lines of a log, split (a line a kill cut short is not there: one write each)."""
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def stop(name: str) -> None:
    """Commit the STOP record (from the test's own process)."""
    from devbridge import HostRing

    ring = HostRing.attach(name)
    r = ring.reserve(12, timeout=30)
    ring.write(r, payload(STOP, 0, 12))
    ring.commit(r)
    ring.close()


def reserve_and_die(name: str, nbytes: int, wait: bool) -> None:
    """Reserve `nbytes` and exit holding them, uncommitted (after a minute, when `wait`)."""
    import time

    from devbridge import HostRing

    HostRing.attach(name).reserve(nbytes)
    if wait:
        time.sleep(60)
    os._exit(0)


def write_after_commit(name: str, at: int, go: Any, done: Any) -> None:
    """A producer with a bug: it commits a record of 64 zero bytes, keeps a view of it, and, when
    told, flips byte `at` of the record its consumer may be copying."""
    from devbridge import HostRing

    ring = HostRing.attach(name)
    r = ring.reserve(64)
    view = ring.view(r)
    view[:] = bytes(64)
    ring.commit(r)
    go.wait(60)
    view[at] ^= 0xFF
    done.set()
    del view
    ring.close()
