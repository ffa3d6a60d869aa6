"""The children of the supervisor's tests (started with `spawn`: importable, nothing inherited).
Each appends a line to its log when it starts, so a test counts starts even of a killed one."""

from __future__ import annotations

import os
import signal
import time


def _started(log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def sleeper(log: str) -> None:
    """Starts, then sleeps until it is ended."""
    _started(log)
    while True:
        time.sleep(60)


def exits(log: str, code: int) -> None:
    """Starts, then exits with `code` at once."""
    _started(log)
    os._exit(code)


def stubborn(log: str) -> None:
    """Starts, ignores SIGTERM, and sleeps: only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _started(log)
    while True:
        time.sleep(60)
