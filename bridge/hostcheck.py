"""The host-bytes checking mode: catch a write into host bytes a copy may still read.

A copy to the device is handed its host bytes by the call; until the copy completes, nobody may
write them (H2D-3). A caller can still do it through a reference kept from before (a numpy array
made over the range, a memoryview from `ring.view`) or from another process that shares the
ring, and the device then reads whichever bytes were there when its queue got to them. With the
mode on, the Bridge fingerprints the bytes when the call hands them over and again when the copy
completes, and fails the copy when they differ. An output's bytes (D2H-3) are fingerprinted
when their copy completes and again when the worker first reads, commits or releases them.

A fingerprint is a copy of the bytes; the second look compares the bytes with it (one `memcmp`:
two reads of the bytes in all, where a digest of each look and a copy to name the first changed
byte would take three), and only a difference is searched for its first byte. What the mode
cannot catch: a write that puts back the same bytes, and a write after the second look.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from devbridge.errors import HostBytesChangedError, InvalidArgumentError, short
from devbridge.ring.host import HostRange
from devbridge.statemachine.status import Status

#: The environment variable that turns the mode on for every Bridge of a process ("1").
ENV = "DEVBRIDGE_CHECK_HOST_BYTES"


def wanted(check_host_bytes: object) -> bool:
    """Whether a Bridge checks host bytes: its argument, or (None) the environment's say."""
    if check_host_bytes is None:
        return os.environ.get(ENV, "") == "1"
    if type(check_host_bytes) is not bool:
        raise InvalidArgumentError("ARG-1", f"check_host_bytes must be a bool or None, got {short(check_host_bytes)}")
    return check_host_bytes


def copy_name(kind: str, allocation: int, span: tuple[int, int]) -> str:
    """How the mode's errors and trace marks name a copy: by its device bytes."""
    into = kind == "copy_in"
    return f"{'host_to_device into' if into else 'device_to_host from'} allocation #{allocation} [{span[0]}, {span[1]})"


class Fingerprint:
    """Host bytes as they were at one moment: a copy of them."""

    __slots__ = ("bytes",)

    def __init__(self, view: memoryview) -> None:
        self.bytes = bytearray(view)

    def first_change(self, view: memoryview) -> int | None:
        """The offset of the first byte of `view` that differs from these bytes; None when none does."""
        if self.bytes == view:  # (bytearray's comparison with any buffer is one memcmp)
            return None
        differ = np.flatnonzero(np.frombuffer(view, np.uint8) != np.frombuffer(self.bytes, np.uint8))
        return int(differ[0]) if differ.size else None


class HostBytesCheck:
    """A Bridge's checking mode: the fingerprints of its copies in flight, by backend token."""

    def __init__(self, counts: Any, fault: Any) -> None:
        self._counts = counts  # the engine's counters (`host_bytes_changed`)
        self._fault = fault  # marks a caught change on the trace, if any: fault(what)
        self._inputs: dict[int, tuple[object, HostRange, Fingerprint, str]] = {}  # id(token) -> ...
        self._held: dict[int, tuple[Fingerprint, str]] = {}  # input copies held back, by use id

    def hand_over(self, host: HostRange) -> Fingerprint:
        """The fingerprint of an input copy's bytes as its call hands them over."""
        return Fingerprint(host.ring.raw(host))

    def submitted(self, token: object, host: HostRange, fingerprint: Fingerprint, name: str) -> None:
        """An asynchronous input copy is on the device as `token`: checked when it completes."""
        self._inputs[id(token)] = (token, host, fingerprint, name)

    def hold(self, use_id: int, fingerprint: Fingerprint, name: str) -> None:
        """An input copy held back behind earlier uses (ORDER-1): its bytes as the call handed them over."""
        self._held[use_id] = (fingerprint, name)

    def launched(self, use_id: int, token: object, host: HostRange) -> None:
        """A held use is on the device as `token` (an input copy's checked when it completes)."""
        if (held := self._held.pop(use_id, None)) is not None:
            self.submitted(token, host, *held)

    def ended(self, use_id: int, token: object) -> None:
        """A use ended however it did (a failed wait ends one without a query): forget it."""
        self._held.pop(use_id, None)
        self._inputs.pop(id(token), None)

    def completed(self, token: object, status: Status) -> Status:
        """The backend's `status` of `token`, failed when it is an input copy whose bytes changed."""
        if not status.done or (entry := self._inputs.pop(id(token), None)) is None:
            return status
        _, host, fingerprint, name = entry
        if status.error is not None:
            return status
        error = self.changed(host, fingerprint, name)
        if error is None:
            return status
        fields = (("copy", error.copy), ("range", error.range), ("offset", error.offset))
        return Status(True, error.detail, failure="host_bytes", fields=fields)

    def changed(self, host: HostRange, fingerprint: Fingerprint, name: str) -> HostBytesChangedError | None:
        """The error for an input copy's bytes that are no longer `fingerprint`'s (counted and
        marked on the trace), or None."""
        offset = fingerprint.first_change(host.ring.raw(host))
        if offset is None:
            return None
        return self._caught("H2D-3", name, host, offset, "while the copy could still read them")

    def guard_output(self, host: HostRange, name: str) -> None:
        """An output copy completed into `host`: its bytes are checked again when the worker
        first reads, commits or releases them."""
        fingerprint = Fingerprint(host.ring.raw(host))

        def check(view: memoryview) -> None:
            offset = fingerprint.first_change(view)
            if offset is not None:
                raise self._caught("D2H-3", name, host, offset, "after the copy wrote them")

        host.ring.guard(host, check)

    def _caught(self, rule: str, name: str, host: HostRange, offset: int, when: str) -> HostBytesChangedError:
        self._counts["host_bytes_changed"] += 1
        span = f"[{host.start}, {host.start + host.nbytes})"
        self._fault(f"{name}: host bytes {span} changed at +{offset}")
        return HostBytesChangedError(
            rule,
            f"{name}: host bytes {span} changed {when}, first at byte {offset} of the range "
            "(a write through a kept reference, or by another process)",
            copy=name,
            range=host,
            offset=offset,
        )
